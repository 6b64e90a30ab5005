package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/test/harness"
)

// checkRestartCost asserts what figure 1 promises an operator at any size: a node plugin restart
// costs the API server at most restartBudget requests, every client and every verb counted by its
// own apiserver_request_total (watches included), and the restarted sidecar reads no
// PersistentVolume and no VolumeAttachment, at its start or for its volumes.
func checkRestartCost(t *testing.T, a apiRequests) {
	t.Helper()
	// The apiserver's own reconciler of the kubernetes Service's endpoints reads them every 10s,
	// whatever restarts: no client of the restart makes those requests, and a window that catches
	// one tick counted them (0.5 GET endpoints and 0.5 GET endpointslices a sweep).
	own := 0.0
	for key, n := range a.APIServer.ByVerbResource {
		if strings.HasSuffix(key, " endpoints") || strings.HasSuffix(key, " endpointslices") {
			own += n
		}
	}
	if budget := restartBudget(a.Heals); a.APIServerWithWatches-own > budget {
		t.Errorf("at %d volumes on the node (%d in the cluster) a node plugin restart cost the apiserver %.1f requests (all clients, watches included; %.1f of the apiserver's own endpoints reconciler left out), want at most %.0f (10 + 3 per heal, %.1f heals): %v",
			a.NodeVolumes, a.ClusterVolumes, a.APIServerWithWatches-own, own, budget, a.Heals, a.APIServer.ByVerbResource)
	}
	for _, key := range []string{"GET persistentvolumes", "GET volumeattachments", "LIST persistentvolumes", "LIST volumeattachments"} {
		if got := a.Sidecar.ByVerbResource[key]; got != 0 {
			t.Errorf("at %d volumes the restarted sidecar made %.1f requests %s per restart, want 0", a.NodeVolumes, got, key)
		}
	}
}

// TestRestartRequests measures figure 1 alone, at the sizes of RESTART_VOLUMES (volumes on the
// restarted node, comma-separated; default 1000), each size on a node of its own in the same
// cluster, the list-everything peer measured beside it, RESTART_SWEEPS restarts per size
// (default 3), RESTART_BROKEN of the node's volumes (default 10) losing their mount before each
// restart, for its sweep to heal: a node plugin restart must cost the API server at most 10 requests plus 3 per
// heal, all clients counted, whatever the number of volumes on the node or in the cluster.
func TestRestartRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver, etcd, the controller and simulated nodes; run without -short")
	}
	sizes := []int{1000}
	if v := os.Getenv("RESTART_VOLUMES"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				t.Fatalf("RESTART_VOLUMES=%q: %q is not a positive number of volumes", v, f)
			}
			sizes = append(sizes, n)
		}
	}
	sweeps, broken := 3, 10
	if v := os.Getenv("RESTART_BROKEN"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("RESTART_BROKEN=%q is not a number of volumes", v)
		}
		broken = n
	}
	if v := os.Getenv("RESTART_SWEEPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("RESTART_SWEEPS=%q is not a positive number", v)
		}
		sweeps = n
	}
	dir := t.TempDir()
	klogToFile(t, dir)
	logFile, err := os.Create(filepath.Join(dir, "sidecars.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	l := ShortLayout()
	l.Workers = 32
	start := time.Now()
	res := &Results{Schema: resultsSchema, Mode: "restart", Started: start.UTC(), Layout: l, Machine: readMachine(runtime.Version(), runtime.NumCPU()), LoadAverage: loadAverage()}
	h := &runner{layout: l, dir: dir, procs: harness.NewProcesses(), logf: t.Logf, calls: &callStats{}, res: res, log: textLogger(logFile),
		brokenPerRestart: broken}
	err = h.onCluster(t.Context(), func(ctx context.Context) error {
		for i, n := range sizes {
			if err := h.addNodes(ctx, fmt.Sprintf("restart-%d", n), []string{fmt.Sprintf("node-big-%d", i)}, n); err != nil {
				return err
			}
			h.big = h.plugins[len(h.plugins)-1]
			if h.ctrl == nil {
				if err := h.restartController(ctx, "controller-1", l.Debounce); err != nil {
					return err
				}
			}
			if err := h.waitHandled(ctx, 10*time.Minute); err != nil {
				return err
			}
			if err := h.measureRestarts(ctx, sweeps, false); err != nil {
				return err
			}
		}
		return nil
	})
	res.WallSeconds = time.Since(start).Seconds()
	if err != nil {
		t.Fatalf("figure 1: %v (files in %s)", err, dir)
	}
	if len(res.APIRequests) != len(sizes) {
		t.Fatalf("figure 1 measured at %d sizes, want %d", len(res.APIRequests), len(sizes))
	}
	for _, a := range res.APIRequests {
		if want := float64(min(broken, a.NodeVolumes)); a.Heals < want {
			t.Errorf("at %d volumes a restart sweep healed %.1f volumes, want the %.0f broken before each restart", a.NodeVolumes, a.Heals, want)
		}
	}
	for _, a := range res.APIRequests {
		checkRestartCost(t, a)
		t.Logf("figure 1: %d volumes on the node, %d in the cluster, %d restarts: %.1f apiserver requests per restart with watches (%.1f without; budget %.0f with %.1f heals); restarted sidecar %.1f (%s); controller %.1f (%s); peer %.0f requests (%s) in %.2fs",
			a.NodeVolumes, a.ClusterVolumes, a.Sweeps, a.APIServerWithWatches, a.APIServer.Requests, restartBudget(a.Heals), a.Heals,
			a.Sidecar.Requests, verbs(a.Sidecar.ByVerbResource), a.Controller.Requests, verbs(a.Controller.ByVerbResource),
			a.Peer.Client.Requests, verbs(a.Peer.Client.ByVerbResource), a.Peer.Seconds)
		t.Logf("figure 1 at %d volumes, apiserver_request_total per restart: %s", a.NodeVolumes, verbs(a.APIServer.ByVerbResource))
	}
	t.Logf("machine: %d CPUs (%s), load average at start %s; wall time %s", res.Machine.CPUs, res.Machine.CPUModel, res.LoadAverage, time.Since(start).Round(time.Second))
}
