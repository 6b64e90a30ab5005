package controller

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

// syncBuffer is a bytes.Buffer that a logger may write to from several goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
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
			"VOLUME_HEALER_LEADER_ELECTION_CALL_MARGIN":    "500ms",
			"VOLUME_HEALER_TIMEOUTS_PROBE":                 "2s",
			"VOLUME_HEALER_TIMEOUTS_HEAL":                  "2s",
		}[k]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	// The controller's log, kept to read its warnings at start, and written to stderr as before.
	logs := &syncBuffer{}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(io.MultiWriter(os.Stderr, logs))))
	runCtx, stop := context.WithCancel(klog.NewContext(ctx, logger))
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
			return
		}
		// A controller that stops releases the Lease, so that another replica need not wait out
		// its duration.
		var lease coordinationv1.Lease
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "volume-healer", Name: "volume-healer"}, &lease); err != nil {
			t.Error(err)
		} else if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
			t.Errorf("the Lease still names holder %q after the controller stopped", *h)
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
	// An operator of a cluster without the node binding reads why in the log at start.
	minor, err := env.Minor()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Contains(logs.String(), "WARNING: the API server (Kubernetes v1."); got != (minor < 32) {
		t.Errorf("Kubernetes 1.%d: the controller's log warns of the missing node binding: %v, want %v", minor, got, minor < 32)
	}
	poll("/readyz answers ok", func(context.Context) (bool, error) {
		code, _ := get("http://" + healthAddr + "/readyz")
		return code == http.StatusOK, nil
	})

	// The controller calls sidecars only on Nodes that exist.
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "node-a-rbd", Annotations: map[string]string{
			annotations.CSIAddonsRestart: "2026-11-29T10:00:00Z",
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
	if err := trigger.RequestSweep(ctx, env.Client, sc, "req-1"); err != nil {
		t.Fatal(err)
	}
	poll("the manual sweep is handled", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc)
		return err == nil && trigger.SweepHandled(sc, "req-1"), nil
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
