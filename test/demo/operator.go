package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// statusWant is what `healerctl status` must show after the story: the restart of driver's node
// plugin on node handled, and exactly the volumes (PVCs as namespace/name) that need a human,
// true for those whose data is lost.
type statusWant struct {
	driver, node string
	volumes      map[string]bool
}

// operatorView shows what an operator sees with `healerctl status` (`kubectl healer status`), and
// checks it against want, and that the exit code (2) says that something needs a human. It asks
// again for up to wait while the answer is not yet the one wanted: on a real node the last
// probes that clear a volume come with the class's periodic sweep.
func operatorView(ctx context.Context, healerctl, kubeconfig string, want statusWant, wait time.Duration) error {
	step("What an operator sees: healerctl status (or kubectl healer status)")
	deadline := time.Now().Add(wait)
	var table string
	var code int
	var problems []string
	for {
		var err error
		table, code, problems, err = checkStatus(ctx, healerctl, kubeconfig, want)
		if err != nil {
			return err
		}
		if len(problems) == 0 || !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	for _, line := range strings.Split(strings.TrimRight(table, "\n"), "\n") {
		fmt.Printf("  %s\n", line)
	}
	fmt.Printf("  exit code %d: %s\n", code, map[bool]string{true: "something needs a human", false: "nothing needs a human"}[code != 0])
	if len(problems) > 0 {
		return fmt.Errorf("healerctl status: %s", strings.Join(problems, "; "))
	}
	fmt.Println("  as expected: the restart handled, and exit code 2 for the volumes that need a human")
	return nil
}

// checkStatus runs healerctl status, as a table and as JSON, and says how what it shows differs
// from want.
func checkStatus(ctx context.Context, healerctl, kubeconfig string, want statusWant) (table string, code int, problems []string, err error) {
	table, code, err = runHealerctl(ctx, healerctl, "status", "--kubeconfig", kubeconfig)
	if err != nil {
		return "", 0, nil, err
	}
	raw, jsonCode, err := runHealerctl(ctx, healerctl, "status", "--kubeconfig", kubeconfig, "-o", "json")
	if err != nil {
		return "", 0, nil, err
	}
	var st struct {
		Restarts []struct{ Driver, Node, State string }
		Volumes  []struct {
			PVC      string
			DataLoss bool
		}
		Problems []string
	}
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return "", 0, nil, fmt.Errorf("healerctl status -o json: %w", err)
	}
	if code != 2 || jsonCode != 2 {
		problems = append(problems, fmt.Sprintf("exit codes %d and %d, want 2: a volume's data is lost", code, jsonCode))
	}
	if !slices.ContainsFunc(st.Restarts, func(r struct{ Driver, Node, State string }) bool {
		return r.Driver == want.driver && r.Node == want.node && r.State == "handled"
	}) {
		problems = append(problems, fmt.Sprintf("the restart on %s is not listed as handled: %+v", want.node, st.Restarts))
	}
	got := map[string]bool{}
	for _, v := range st.Volumes {
		got[v.PVC] = v.DataLoss
	}
	if len(got) != len(want.volumes) || len(st.Problems) != len(want.volumes) {
		problems = append(problems, fmt.Sprintf("volumes %+v and problems %q, want %v (true: data lost)", st.Volumes, st.Problems, want.volumes))
	} else {
		for pvc, dataLoss := range want.volumes {
			if d, ok := got[pvc]; !ok || d != dataLoss {
				problems = append(problems, fmt.Sprintf("volume %s listed %t with data loss %t, want listed with data loss %t", pvc, ok, d, dataLoss))
			}
		}
	}
	return table, code, problems, nil
}

// runHealerctl runs healerctl and returns its standard output and exit code; an error only when
// it could not run or failed (exit code 1).
func runHealerctl(ctx context.Context, healerctl string, args ...string) (string, int, error) {
	cmd := exec.CommandContext(ctx, healerctl, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), 0, nil
	case errors.As(err, &exit) && exit.ExitCode() > 1:
		return stdout.String(), exit.ExitCode(), nil
	default:
		return "", 0, fmt.Errorf("%s %s: %w: %s (run make build first)", healerctl, strings.Join(args, " "), err, stderr.String())
	}
}
