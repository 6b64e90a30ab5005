package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/volume-healer/volume-healer/test/harness"
)

// operatorView shows what an operator sees with `healerctl status` (`kubectl healer status`), and
// checks it: the restart of the driver's node whose plugin restarted is handled, the volume whose data is
// lost and the volumes left unhealed wait for a human (and nothing else does), and the exit code
// says that something needs one.
func operatorView(ctx context.Context, healerctl, kubeconfig, driver, restarted string, lost *harness.Volume, unhealed []*harness.Volume) error {
	step("What an operator sees: healerctl status (or kubectl healer status)")
	table, code, err := runHealerctl(ctx, healerctl, "status", "--kubeconfig", kubeconfig)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimRight(table, "\n"), "\n") {
		fmt.Printf("  %s\n", line)
	}
	fmt.Printf("  exit code %d: %s\n", code, map[bool]string{true: "something needs a human", false: "nothing needs a human"}[code != 0])
	raw, jsonCode, err := runHealerctl(ctx, healerctl, "status", "--kubeconfig", kubeconfig, "-o", "json")
	if err != nil {
		return err
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
		return fmt.Errorf("healerctl status -o json: %w", err)
	}
	var problems []string
	if code != 2 || jsonCode != 2 {
		problems = append(problems, fmt.Sprintf("exit codes %d and %d, want 2: a volume's data is lost", code, jsonCode))
	}
	if !slices.ContainsFunc(st.Restarts, func(r struct{ Driver, Node, State string }) bool {
		return r.Driver == driver && r.Node == restarted && r.State == "handled"
	}) {
		problems = append(problems, fmt.Sprintf("the restart on %s is not listed as handled: %+v", restarted, st.Restarts))
	}
	want := map[string]bool{appNamespace + "/" + lost.PVC: true}
	for _, v := range unhealed {
		want[appNamespace+"/"+v.PVC] = false
	}
	got := map[string]bool{}
	for _, v := range st.Volumes {
		got[v.PVC] = v.DataLoss
	}
	if len(got) != len(want) || len(st.Problems) != len(want) {
		problems = append(problems, fmt.Sprintf("volumes %+v and problems %q, want %v (true: data lost)", st.Volumes, st.Problems, want))
	} else {
		for pvc, dataLoss := range want {
			if d, ok := got[pvc]; !ok || d != dataLoss {
				problems = append(problems, fmt.Sprintf("volume %s listed %t with data loss %t, want listed with data loss %t", pvc, ok, d, dataLoss))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("healerctl status: %s", strings.Join(problems, "; "))
	}
	return nil
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
