package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/test/controlplane"
)

func execute(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	cmd := newCommand(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	out, err := execute(t, nil, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"--config", "--kubeconfig", "--leader-election-enabled", "--metrics-bind-address",
		"--health-bind-address", "--policy-namespace", "--policy-label-selector", "--policy-evaluation-timeout",
		"--schedule-default", "--schedule-storage-classes", "--schedule-stagger", "--restart-debounce",
		"--budgets-global", "--budgets-per-driver", "--budgets-per-node", "--timeouts-probe", "--timeouts-heal",
		"--backoff-base", "--backoff-max", "--dry-run", "--sidecar-tls-ca-file", "--sidecar-auth-token-file"} {
		if !strings.Contains(out, flag) {
			t.Errorf("--help does not document %s", flag)
		}
	}
}

func TestConfigPrint(t *testing.T) {
	tests := map[string]struct {
		env     map[string]string
		args    []string
		want    []string
		wantErr []string
	}{
		"flags and environment merged": {
			env:  map[string]string{"VOLUME_HEALER_BUDGETS_GLOBAL": "12"},
			args: []string{"--budgets-per-node=3", "--budgets-per-driver=6", "--sidecar-tls-enabled=false"},
			want: []string{"global: 12", "perNode: 3", "perDriver: 6"},
		},
		"negative budget": {
			args:    []string{"--budgets-per-node=-1", "--sidecar-tls-enabled=false"},
			wantErr: []string{"budgets.perNode", "-1", ">= 1"},
		},
		"bad cron spec": {
			args:    []string{"--schedule-default=every day", "--sidecar-tls-enabled=false"},
			wantErr: []string{"schedule.default", "every day"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := execute(t, tc.env, append([]string{"config", "print"}, tc.args...)...)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("config print succeeded, want an error; output:\n%s", out)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not contain %q:\n%s", w, out)
				}
			}
		})
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRunAgainstRealAPIServer starts the controller against a real control plane and checks what an
// operator sees: it takes the Lease, answers health checks, and a new CSIAddonsNode shows up as a
// restart trigger in its metrics.
func TestRunAgainstRealAPIServer(t *testing.T) {
	env := controlplane.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, ns := range []string{"volume-healer", "csi"} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}

	metricsAddr, healthAddr := freeAddr(t), freeAddr(t)
	cfg, err := config.Load(nil, func(k string) (string, bool) {
		v, ok := map[string]string{
			"VOLUME_HEALER_KUBECONFIG":                     env.Kubeconfig,
			"VOLUME_HEALER_METRICS_BIND_ADDRESS":           metricsAddr,
			"VOLUME_HEALER_HEALTH_BIND_ADDRESS":            healthAddr,
			"VOLUME_HEALER_SIDECAR_TLS_ENABLED":            "false",
			"VOLUME_HEALER_RESTART_DEBOUNCE":               "100ms",
			"VOLUME_HEALER_LEADER_ELECTION_LEASE_DURATION": "4s",
			"VOLUME_HEALER_LEADER_ELECTION_RENEW_DEADLINE": "3s",
			"VOLUME_HEALER_LEADER_ELECTION_RETRY_PERIOD":   "500ms",
		}[k]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg) }()
	defer func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(shutdownTimeout + 5*time.Second):
			t.Error("Run did not return after its context ended")
		}
	}()

	poll := func(what string, cond func(context.Context) (bool, error)) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, cond); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	poll("the Lease is taken", func(ctx context.Context) (bool, error) {
		var lease coordinationv1.Lease
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: "volume-healer", Name: "volume-healer"}, &lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "", nil
	})
	poll("/readyz answers ok", func(context.Context) (bool, error) {
		code, _ := get("http://" + healthAddr + "/readyz")
		return code == http.StatusOK, nil
	})

	if err := env.Client.Create(ctx, &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "node-a-rbd", Annotations: map[string]string{
			scheduler.CSIAddonsRestartAnnotation: "2026-11-29T10:00:00Z",
		}},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
			Name: "rbd.csi.ceph.com", NodeID: "node-a", EndPoint: "pod://plugin.csi:9070",
		}},
	}); err != nil {
		t.Fatal(err)
	}
	poll("the metrics say this replica leads", func(context.Context) (bool, error) {
		_, body := get("http://" + metricsAddr + "/metrics")
		return strings.Contains(body, "\nvolume_healer_leader 1\n"), nil
	})
	want := fmt.Sprintf("volume_healer_scheduler_triggers_total{trigger=%q} 1", "restart")
	poll("the restart shows in the metrics", func(context.Context) (bool, error) {
		_, body := get("http://" + metricsAddr + "/metrics")
		return strings.Contains(body, want), nil
	})

	// An operator asks for a sweep of a StorageClass: the controller sweeps it once, marks the
	// request handled and says so in an Event on the StorageClass.
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold"}, Provisioner: "rbd.csi.ceph.com"}
	if err := env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if err := scheduler.RequestSweep(ctx, env.Client, sc, "req-1"); err != nil {
		t.Fatal(err)
	}
	poll("the manual sweep is handled", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc)
		return err == nil && scheduler.SweepHandled(sc, "req-1"), nil
	})
	poll("the ManualSweepFinished Event", func(ctx context.Context) (bool, error) {
		var events corev1.EventList
		if err := env.Client.List(ctx, &events); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == "ManualSweepFinished" && e.InvolvedObject.Name == "gold" && strings.Contains(e.Message, "req-1") {
				return true, nil
			}
		}
		return false, nil
	})
}
