package sidecar_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/sidecar/restart"
	"github.com/volume-healer/volume-healer/test/fakecri"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// The pods of the container restart tests.
const (
	podA = "0b6f1d7e-8d3c-4f0e-9a51-5c2d7e1f0a11"
	podB = "7c2e9f40-1a6b-4d8e-b3f5-0e4a9c6d2b22"
)

// publishTarget is where kubelet publishes the fixture's PV for a pod, written out from kubelet's
// layout rather than taken from the sidecar.
func (f *fixture) publishTarget(pod, pv string) string {
	return filepath.Join(f.kubeletDir, "pods", pod, "volumes", "kubernetes.io~csi", pv, "mount")
}

// serveRuntime serves a fake container runtime with containers, and returns it and its
// endpoint.
func (f *fixture) serveRuntime(containers ...fakecri.Container) (*fakecri.Server, string) {
	f.t.Helper()
	dir, err := os.MkdirTemp("", "cri")
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "containerd.sock")
	s, err := fakecri.Serve(path, containers...)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(s.Stop)
	return s, "unix://" + path
}

// withRuntime gives a sidecar the container runtime at endpoint.
func withRuntime(endpoint string) func(*sidecar.Options) {
	return func(o *sidecar.Options) { o.ContainerRuntimeEndpoint = endpoint }
}

// containerRestart reports whether the sidecar's capabilities say it restarts containers.
func (f *fixture) containerRestart(sc *running, ctx context.Context) bool {
	f.t.Helper()
	caps, err := sc.client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
	if err != nil {
		f.t.Fatalf("GetHealerCapabilities: %v", err)
	}
	return caps.GetContainerRestart()
}

func TestRestartContainers(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	f.create(f.pv("pv-csi-other", "vol-9", func(pv *corev1.PersistentVolume) { pv.Spec.CSI.Driver = "other.example.com" }))
	pv := f.pvName("pv-1")
	rt, endpoint := f.serveRuntime(
		fakecri.Container{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{"/etc/hosts", f.publishTarget(podA, pv)}},
		fakecri.Container{ID: "a-proxy", PodUID: podA, Name: "proxy", HostPaths: []string{f.publishTarget(podA, f.pvName("pv-2"))}},
		fakecri.Container{ID: "b-app", PodUID: podB, Name: "app", HostPaths: []string{f.publishTarget(podB, pv)}},
	)
	sc := f.startSidecar(withRuntime(endpoint))
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	poll.Eventually(t, 20*time.Second, "container_restart in the capabilities", poll.True(func() bool { return f.containerRestart(sc, ctx) }))

	resp, err := sc.client.RestartContainers(ctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: podA})
	if err != nil {
		t.Fatalf("RestartContainers: %v", err)
	}
	if !slices.Equal(resp.GetContainers(), []string{"app"}) {
		t.Errorf("containers = %q, want [app]", resp.GetContainers())
	}
	if stops := rt.Stops(); len(stops) != 1 || stops[0].ID != "a-app" {
		t.Errorf("stops = %+v, want a-app's alone", stops)
	}
	if !rt.Running("a-proxy") || !rt.Running("b-app") {
		t.Error("a container that does not mount pod A's publish target of the PV was stopped")
	}

	// The container is stopped: there is nothing left to restart.
	_, err = sc.client.RestartContainers(ctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: podA})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), podA) {
		t.Errorf("second RestartContainers: %v, want FAILED_PRECONDITION naming the pod", err)
	}

	for name, tc := range map[string]struct {
		req  *healerv1alpha1.NodeRestartContainersRequest
		want codes.Code
		msg  string
	}{
		"no pv_name":            {req: &healerv1alpha1.NodeRestartContainersRequest{PodUid: podA}, want: codes.InvalidArgument, msg: "pv_name"},
		"no pod_uid":            {req: &healerv1alpha1.NodeRestartContainersRequest{PvName: pv}, want: codes.InvalidArgument, msg: "pod_uid"},
		"a pod_uid with a path": {req: &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: "../" + podB}, want: codes.InvalidArgument, msg: "pod_uid"},
		"an unknown PV":         {req: &healerv1alpha1.NodeRestartContainersRequest{PvName: f.pvName("missing"), PodUid: podB}, want: codes.NotFound, msg: f.pvName("missing")},
		"a PV of another driver": {req: &healerv1alpha1.NodeRestartContainersRequest{PvName: f.pvName("pv-csi-other"), PodUid: podB},
			want: codes.InvalidArgument, msg: "other.example.com"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := sc.client.RestartContainers(ctx, tc.req)
			if status.Code(err) != tc.want || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("RestartContainers: %v, want %s naming %q", err, tc.want, tc.msg)
			}
		})
	}
	if stops := rt.Stops(); len(stops) != 1 || !rt.Running("b-app") {
		t.Errorf("stops = %+v after refused calls, want a-app's alone", stops)
	}

	body := scrape(t, sc.s)
	for _, want := range []string{
		`volume_healer_sidecar_container_restarts_total{result="restarted"} 1`,
		`volume_healer_sidecar_container_restarts_total{result="no_container"} 1`,
		`volume_healer_sidecar_container_restarts_total{result="refused"} 5`,
		`volume_healer_sidecar_container_runtime_reachable 1`,
		`volume_healer_sidecar_calls_total{code="OK",rpc="RestartContainers"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, grep(body, "container"))
		}
	}
}

// TestRestartContainersWithoutRuntime: a sidecar given no runtime socket says so in its
// capabilities and answers UNIMPLEMENTED.
func TestRestartContainersWithoutRuntime(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	sc := f.startSidecar(nil)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	if f.containerRestart(sc, ctx) {
		t.Error("container_restart = true without a container runtime")
	}
	_, err := sc.client.RestartContainers(ctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: f.pvName("pv-1"), PodUid: podA})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(status.Convert(err).Message(), "no access to the container runtime") {
		t.Fatalf("RestartContainers: %v, want UNIMPLEMENTED saying the sidecar has no access to the runtime", err)
	}
	if body := scrape(t, sc.s); !strings.Contains(body, `volume_healer_sidecar_container_restarts_total{result="no_runtime"} 1`) {
		t.Errorf("metrics:\n%s", grep(body, "container"))
	}
}

// TestRestartContainersRuntimeDown: a runtime that is not there, or goes away, takes
// container_restart off the capabilities, and the calls answer UNAVAILABLE naming it; when it
// comes back, the capability does too.
func TestRestartContainersRuntimeDown(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	pv := f.pvName("pv-1")
	rt, endpoint := f.serveRuntime(fakecri.Container{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{f.publishTarget(podA, pv)}})
	rt.Stop()
	sc := f.startSidecar(withRuntime(endpoint))
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	if f.containerRestart(sc, ctx) {
		t.Error("container_restart = true while the runtime is not there")
	}
	_, err := sc.client.RestartContainers(ctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: podA})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), endpoint) {
		t.Fatalf("RestartContainers with the runtime down: %v, want UNAVAILABLE naming %s", err, endpoint)
	}

	// The runtime comes back on the same socket.
	back, err := fakecri.Serve(strings.TrimPrefix(endpoint, "unix://"), fakecri.Container{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{f.publishTarget(podA, pv)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(back.Stop)
	poll.Eventually(t, 30*time.Second, "container_restart once the runtime is back", poll.True(func() bool { return f.containerRestart(sc, ctx) }))
	if body := scrape(t, sc.s); !strings.Contains(body, `volume_healer_sidecar_container_runtime_reachable 1`) {
		t.Errorf("metrics:\n%s", grep(body, "container"))
	}

	back.Stop()
	_, err = sc.client.RestartContainers(ctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: podA})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("RestartContainers after the runtime went away: %v, want UNAVAILABLE", err)
	}
	if f.containerRestart(sc, ctx) {
		t.Error("container_restart = true after a call found the runtime gone")
	}
	if body := scrape(t, sc.s); !strings.Contains(body, `volume_healer_sidecar_container_runtime_reachable 0`) ||
		!strings.Contains(body, `volume_healer_sidecar_container_restarts_total{result="unavailable"} 2`) {
		t.Errorf("metrics:\n%s", grep(body, "container"))
	}
}

// TestRestartContainersRuntimeHung: a runtime that does not answer gets the sidecar's
// DEADLINE_EXCEEDED, naming it, before the caller's deadline, and leaves no goroutine behind.
func TestRestartContainersRuntimeHung(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	pv := f.pvName("pv-1")
	rt, endpoint := f.serveRuntime(fakecri.Container{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{f.publishTarget(podA, pv)}})
	sc := f.startSidecar(withRuntime(endpoint))
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	poll.Eventually(t, 20*time.Second, "container_restart in the capabilities", poll.True(func() bool { return f.containerRestart(sc, ctx) }))
	// The same call once, answered, so that the connections and caches it uses are counted
	// before.
	if _, err := sc.client.RestartContainers(ctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: podB}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("RestartContainers of a pod without containers: %v", err)
	}
	// The registration's watch starts once the sidecar registered; a second more lets it start
	// before the count.
	<-sc.s.Registered()
	time.Sleep(time.Second)
	before, restartsBefore := runtime.NumGoroutine(), runtimeGoroutines()

	for _, method := range []string{"ListContainers", "StopContainer"} {
		rt.Hang(method)
		const deadline = 4 * time.Second
		cctx, cancel := context.WithTimeout(ctx, deadline)
		start := time.Now()
		_, err := sc.client.RestartContainers(cctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: podA})
		took := time.Since(start)
		cancel()
		if msg := status.Convert(err).Message(); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(msg, endpoint) || !strings.Contains(msg, method) {
			t.Fatalf("RestartContainers with %s hung: %v, want the sidecar's DEADLINE_EXCEEDED naming %s and the call", method, err, endpoint)
		}
		if took >= deadline {
			t.Errorf("RestartContainers with %s hung took %s: the caller's deadline of %s ended it, not the sidecar", method, took, deadline)
		}
	}
	if !rt.Running("a-app") {
		t.Error("a-app stopped although its stop did not answer")
	}
	poll.Eventually(t, 15*time.Second, "the goroutines of the hung calls to end", func() (bool, string) {
		n, restarts := runtime.NumGoroutine(), runtimeGoroutines()
		return n <= before && len(restarts) <= len(restartsBefore), fmt.Sprintf("goroutines: %d, before: %d; of the runtime, %d before:\n%s",
			n, before, len(restartsBefore), strings.Join(restarts, "\n\n"))
	})
	if body := scrape(t, sc.s); !strings.Contains(body, `volume_healer_sidecar_container_restarts_total{result="timeout"} 2`) {
		t.Errorf("metrics:\n%s", grep(body, "container"))
	}
}

// runtimeGoroutines returns the stacks of the goroutines that run code of the container restart
// or of the fake runtime: the runtime's checks and the fake runtime's server, and any left by a
// call.
func runtimeGoroutines() []string {
	buf := make([]byte, 1<<22)
	var out []string
	for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "sidecar/restart") || strings.Contains(g, "RuntimeService") || strings.Contains(g, "fakecri") {
			out = append(out, g)
		}
	}
	return out
}

// TestRestartContainersOneAtATime: while a restart of a pod's containers for a volume is in
// flight, another for the same pod and volume answers ABORTED.
func TestRestartContainersOneAtATime(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	pv := f.pvName("pv-1")
	rt, endpoint := f.serveRuntime(fakecri.Container{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{f.publishTarget(podA, pv)}})
	sc := f.startSidecar(withRuntime(endpoint))
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	release := rt.HoldStops()
	defer release()
	first := make(chan error, 1)
	go func() {
		_, err := sc.client.RestartContainers(ctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: podA})
		first <- err
	}()
	select {
	case <-rt.Stopping():
	case <-time.After(20 * time.Second):
		t.Fatal("the first RestartContainers did not reach StopContainer")
	}
	_, err := sc.client.RestartContainers(ctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: podA})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("RestartContainers while one is in flight: %v, want ABORTED", err)
	}
	release()
	if err := <-first; err != nil {
		t.Fatalf("first RestartContainers: %v", err)
	}
	if stops := rt.Stops(); len(stops) != 1 {
		t.Errorf("stops = %+v, want one", stops)
	}
}

// TestRestartContainersAuthenticatedFirst: a caller without a valid token, or not allowed, is
// refused before the sidecar asks the runtime anything.
func TestRestartContainersAuthenticatedFirst(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	f.create(f.pv("pv-1", "vol-1"))
	pv := f.pvName("pv-1")
	rt, endpoint := f.serveRuntime(fakecri.Container{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{f.publishTarget(podA, pv)}})
	sc := f.startSidecar(withRuntime(endpoint))
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))
	poll.Eventually(t, 20*time.Second, "container_restart in the capabilities", poll.True(func() bool { return f.containerRestart(sc, ctx) }))
	calls := rt.Calls()
	for name, tc := range map[string]struct {
		ctx  context.Context
		want codes.Code
	}{
		"no token":                        {ctx: f.ctx, want: codes.Unauthenticated},
		"garbage token":                   {ctx: f.as("not-a-token"), want: codes.Unauthenticated},
		"token of another ServiceAccount": {ctx: f.as(f.token(intruderSA)), want: codes.PermissionDenied},
		"token of the controller for another node": {
			ctx: f.as(f.token(controllerSA, healerv1alpha1.NodeTokenAudience(healerv1alpha1.DefaultTokenAudience, "node-elsewhere"))), want: codes.Unauthenticated},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := sc.client.RestartContainers(tc.ctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: podA})
			if status.Code(err) != tc.want {
				t.Fatalf("RestartContainers: %v, want %s", err, tc.want)
			}
		})
	}
	if got := rt.Calls(); got != calls || !rt.Running("a-app") {
		t.Fatalf("the runtime got %d calls from refused callers; a-app running: %v", got-calls, rt.Running("a-app"))
	}
}

// TestMarkerWaitsForTheRuntimesFirstAnswer: the restart sweep that the marker starts reads the
// sidecar's capabilities at once; a sidecar given the container runtime writes its marker only
// once the runtime has been asked, so that those capabilities do not say "no container restart"
// merely because the runtime was not asked yet (the sweep would evict pods it could restart in
// place). A runtime that does not answer delays the marker by the check's timeout, not forever.
func TestMarkerWaitsForTheRuntimesFirstAnswer(t *testing.T) {
	f := newFixture(t)
	f.startDriver(simulated.Options{}, nil)
	rt, endpoint := f.serveRuntime()
	rt.Hang("Version")
	start := time.Now()
	sc := f.startSidecar(withRuntime(endpoint))
	select {
	case <-sc.s.Registered():
	case <-time.After(restart.DefaultCheckTimeout + 10*time.Second):
		t.Fatalf("no marker %s after the start: a runtime that does not answer must delay it by its check timeout only", time.Since(start).Round(time.Second))
	}
	// The runtime's first check hangs until its timeout: a marker written before that was
	// written before the runtime was asked.
	if took := time.Since(start); took < restart.DefaultCheckTimeout {
		t.Fatalf("the marker was written %s after the start, before the container runtime's first check ended (it hangs for %s)", took.Round(time.Millisecond), restart.DefaultCheckTimeout)
	}
	if f.containerRestart(sc, f.as(f.token(controllerSA))) {
		t.Error("the capabilities say container_restart although the runtime never answered")
	}
}
