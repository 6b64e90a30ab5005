package controller

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/planner"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// recordingForgetter remembers what the event routing asked the sweeper and the client to forget.
type recordingForgetter struct {
	mu        sync.Mutex
	pvs       []string
	classes   []string
	endpoints []string
	nodes     []string
	// redialled are the endpoints whose connections were told to dial again at once.
	redialled []string
}

func (r *recordingForgetter) ForgetNode(driver, node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes = append(r.nodes, driver+"/"+node)
}

func (r *recordingForgetter) Forget(pv *corev1.PersistentVolume) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pvs = append(r.pvs, pv.Name)
}

func (r *recordingForgetter) ForgetStorageClass(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.classes = append(r.classes, name)
}

// forgetConnection stands in for the sidecar client's Forget and Redial.
type forgetConnection struct{ r *recordingForgetter }

func (f forgetConnection) Redial(endpoint string) {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	f.r.redialled = append(f.r.redialled, endpoint)
}

func (f forgetConnection) Forget(endpoint string) {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	f.r.endpoints = append(f.r.endpoints, endpoint)
}

// endpointsBut returns the endpoints forgotten so far, except one. The left-behind CSIAddonsNode's
// endpoint is forgotten or not depending on whether its object reached the target map before the
// Node cache synced (then it is dropped once it has), a race the routing may lose either way.
// Called under seen's lock.
func (r *recordingForgetter) endpointsBut(except string) []string {
	var out []string
	for _, ep := range r.endpoints {
		if ep != except {
			out = append(out, ep)
		}
	}
	return out
}

func (r *recordingForgetter) seen(f func() bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return f()
}

// routed bounds a wait for the informers to deliver a change and the controller to act on it.
const routed = 10 * time.Second

// TestEventRoutingFeedsTheTriggers drives the shared informers the way the controller sets them
// up and checks what an operator would see follow from each change: a new CSIAddonsNode with a
// sidecar endpoint becomes a sidecar target and, once its marker settles, a restart sweep; a moved
// endpoint closes the old connection; a StorageClass's schedule annotation becomes its schedule
// and its deletion removes it; a deleted PV is forgotten.
func TestEventRoutingFeedsTheTriggers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := csiaddonsv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// A CSIAddonsNode left behind by a Node deleted before the controller started.
	leftBehind := &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "node-0-rbd", Annotations: map[string]string{
			annotations.Endpoint:      "127.0.0.1:9070",
			annotations.HealerRestart: "2026-11-01T10:00:00Z/pod-0",
		}},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{Name: "rbd.csi.ceph.com", NodeID: "node-0"}},
	}
	crClient := noWatchList{crfake.NewClientBuilder().WithScheme(scheme).WithObjects(leftBehind).Build()}
	clientset := k8sfake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	factory := informers.NewSharedInformerFactoryWithOptions(clientset, 0, informers.WithTransform(planner.CacheTransform))
	if _, err := planner.InformerCaches(factory); err != nil {
		t.Fatal(err)
	}
	nodes := factory.InformerFor(&csiaddonsv1alpha1.CSIAddonsNode{}, csiAddonsNodeInformer(crClient))

	var mu sync.Mutex
	var sweeps []scheduler.Sweep
	record := func(s scheduler.Sweep) {
		mu.Lock()
		defer mu.Unlock()
		sweeps = append(sweeps, s)
	}
	restarts, err := trigger.NewRestarts(trigger.RestartOptions{Debounce: 10 * time.Millisecond, Sweeps: record})
	if err != nil {
		t.Fatal(err)
	}
	periodic, err := trigger.NewPeriodic(trigger.PeriodicOptions{Default: "@every 24h", Sweeps: record})
	if err != nil {
		t.Fatal(err)
	}
	manual, err := trigger.NewManual(trigger.ManualOptions{Sweeps: record})
	if err != nil {
		t.Fatal(err)
	}
	targets := healer.NewTargetMap()
	forgot := &recordingForgetter{}
	if _, err := watchTriggers(ctx, factory, nodes, targets, forgot, forgetConnection{forgot}, triggers{restarts, periodic, manual}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = restarts.Start(ctx) }()
	factory.Start(ctx.Done())
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	factory.WaitForCacheSync(ctx.Done())
	if err := informersSynced(factory); err != nil {
		t.Fatalf("informers after WaitForCacheSync: %v", err)
	}

	node := &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "node-1-rbd", Annotations: map[string]string{
			annotations.Endpoint:      "127.0.0.1:9071",
			annotations.HealerRestart: "2026-12-01T10:00:00Z/pod-1",
		}},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
			Name: "rbd.csi.ceph.com", NodeID: "node-1", EndPoint: "pod://plugin:9070",
		}},
	}
	if err := crClient.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	// becomesTarget waits until the CSIAddonsNode of node is the sidecar target at endpoint and
	// its marker has started a restart sweep of the driver on that node.
	becomesTarget := func(what, node, endpoint string) {
		t.Helper()
		poll.Eventually(t, routed, what+": the sidecar target of its driver and node", poll.True(func() bool {
			target, _, err := targets.Target("rbd.csi.ceph.com", node)
			return err == nil && target.Endpoint == endpoint
		}))
		poll.Eventually(t, routed, what+": a restart sweep of the driver on the node", poll.True(func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.ContainsFunc(sweeps, func(s scheduler.Sweep) bool {
				return s.Trigger == scheduler.TriggerRestart && s.Driver == "rbd.csi.ceph.com" && s.Node == node
			})
		}))
	}
	becomesTarget("a new CSIAddonsNode", "node-1", "127.0.0.1:9071")
	if _, _, err := targets.Target("rbd.csi.ceph.com", "node-0"); !errors.Is(err, healer.ErrNodeGone) {
		t.Errorf("the CSIAddonsNode of a Node gone before the start is a target: %v", err)
	}
	if got := targets.Nodes("rbd.csi.ceph.com"); len(got) != 1 || got[0] != "node-1" {
		t.Errorf("nodes of rbd.csi.ceph.com = %v, want only node-1", got)
	}
	leftBehind.Annotations[annotations.HealerRestart] = "2026-12-01T10:00:00Z/pod-0"
	if err := crClient.Update(ctx, leftBehind); err != nil {
		t.Fatal(err)
	}

	poll.Eventually(t, routed, "the connection to a new CSIAddonsNode's sidecar is told to dial at once", poll.True(func() bool {
		return forgot.seen(func() bool { return slices.Contains(forgot.redialled, "127.0.0.1:9071") })
	}))

	node.Annotations[annotations.Endpoint] = "127.0.0.1:9072"
	if err := crClient.Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, routed, "the old endpoint's connection is closed when the sidecar moves", poll.True(func() bool {
		return forgot.seen(func() bool { return slices.Equal(forgot.endpointsBut("127.0.0.1:9070"), []string{"127.0.0.1:9071"}) })
	}))
	// A sidecar that starts again at the same endpoint (a node plugin on the host's network)
	// announces it by its restart marker alone: its connection, failing while the sidecar was
	// down, must dial the new one at once rather than after gRPC's backoff.
	forgot.seen(func() bool { forgot.redialled = nil; return true })
	node.Annotations[annotations.HealerRestart] = "2026-12-01T10:05:00Z/pod-2"
	if err := crClient.Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, routed, "the restarted sidecar's connection is told to dial at once", poll.True(func() bool {
		return forgot.seen(func() bool { return slices.Equal(forgot.redialled, []string{"127.0.0.1:9072"}) })
	}))
	// The informer delivers in order: the gone Node's update was handled before node-1's.
	if _, kept := targets.Object(client.ObjectKeyFromObject(leftBehind)); kept {
		t.Error("the updated CSIAddonsNode of a gone Node became a target again")
	}
	time.Sleep(50 * time.Millisecond) // past the debounce
	mu.Lock()
	for _, s := range sweeps {
		if s.Node == "node-0" {
			t.Errorf("a sweep of a Node that is gone: %+v", s)
		}
	}
	mu.Unlock()

	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "fast", Annotations: map[string]string{annotations.Schedule: "@every 1h"}},
		Provisioner: "rbd.csi.ceph.com",
	}
	if _, err := clientset.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, routed, "the StorageClass annotation becomes its schedule", poll.True(func() bool {
		return periodic.Schedules()["fast"] == "@every 1h"
	}))
	if err := clientset.StorageV1().StorageClasses().Delete(ctx, "fast", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, routed, "a deleted StorageClass loses its schedule and its history", poll.True(func() bool {
		_, scheduled := periodic.Schedules()["fast"]
		return !scheduled && forgot.seen(func() bool { return len(forgot.classes) == 1 && forgot.classes[0] == "fast" })
	}))

	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}}
	if _, err := clientset.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := clientset.CoreV1().PersistentVolumes().Delete(ctx, "pv-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, routed, "a deleted PV's history is forgotten", poll.True(func() bool {
		return forgot.seen(func() bool { return len(forgot.pvs) == 1 && forgot.pvs[0] == "pv-1" })
	}))

	if err := crClient.Delete(ctx, node); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, routed, "a deleted CSIAddonsNode is no longer a target, its connection is closed, its history forgotten", poll.True(func() bool {
		_, _, err := targets.Target("rbd.csi.ceph.com", "node-1")
		return err != nil && forgot.seen(func() bool {
			return slices.Equal(forgot.endpointsBut("127.0.0.1:9070"), []string{"127.0.0.1:9071", "127.0.0.1:9072"}) &&
				slices.Contains(forgot.nodes, "rbd.csi.ceph.com/node-1")
		})
	}))

	// A Node that goes away takes the targets on it along, though its CSIAddonsNode stays.
	k8sNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"}}
	if _, err := clientset.CoreV1().Nodes().Create(ctx, k8sNode, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// createLike creates a CSIAddonsNode like node's for the driver on nodeID, its sidecar at endpoint.
	createLike := func(nodeID, endpoint string) {
		t.Helper()
		n := node.DeepCopy()
		n.ResourceVersion, n.Name, n.Spec.Driver.NodeID = "", nodeID+"-rbd", nodeID
		n.Annotations[annotations.Endpoint] = endpoint
		if err := crClient.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	createLike("node-2", "127.0.0.1:9073")
	poll.Eventually(t, routed, "node-2's sidecar is a target", poll.True(func() bool {
		_, _, err := targets.Target("rbd.csi.ceph.com", "node-2")
		return err == nil
	}))
	if err := clientset.CoreV1().Nodes().Delete(ctx, "node-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, routed, "a deleted Node's sidecar is no longer a target, its connection is closed, its history forgotten", poll.True(func() bool {
		_, _, err := targets.Target("rbd.csi.ceph.com", "node-2")
		return err != nil && forgot.seen(func() bool {
			return slices.Equal(forgot.endpointsBut("127.0.0.1:9070"), []string{"127.0.0.1:9071", "127.0.0.1:9072", "127.0.0.1:9073"}) &&
				slices.Contains(forgot.nodes, "rbd.csi.ceph.com/node-2")
		})
	}))

	// A CSIAddonsNode seen before its Node (the caches deliver independently) becomes a target, and
	// its marker a restart sweep, once the Node arrives.
	createLike("node-3", "127.0.0.1:9074")
	poll.Eventually(t, routed, "the CSIAddonsNode of a Node not known yet is seen", poll.True(func() bool {
		_, exists, err := nodes.GetStore().GetByKey("csi/node-3-rbd")
		return err == nil && exists
	}))
	time.Sleep(50 * time.Millisecond) // its handler has run, past the debounce
	if _, _, err := targets.Target("rbd.csi.ceph.com", "node-3"); err == nil {
		t.Error("the CSIAddonsNode of a Node that does not exist is a target")
	}
	if _, err := clientset.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-3"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	becomesTarget("the CSIAddonsNode of a Node that joins after it", "node-3", "127.0.0.1:9074")

	// A manual request on a PVC is remembered until it is handled, or the PVC is deleted.
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", Annotations: map[string]string{annotations.SweepRequest: "now"}},
		Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: "pv-2"},
	}
	if _, err := clientset.CoreV1().PersistentVolumeClaims("app").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, routed, "the PVC's sweep request is started", poll.True(func() bool { return manual.Pending() == 1 }))
	if err := clientset.CoreV1().PersistentVolumeClaims("app").Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, routed, "a deleted PVC's request is forgotten", poll.True(func() bool { return manual.Pending() == 0 }))
}

// noWatchList is the fake client as client-go's reflector must see it: its watches never send the
// bookmark that ends a streamed list, so the informer must list and watch the classic way.
type noWatchList struct{ client.WithWatch }

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// fakeSweeper records the sweeps it runs and blocks each until release is closed.
type fakeSweeper struct {
	mu      sync.Mutex
	ran     []scheduler.Sweep
	release chan struct{}
}

func (f *fakeSweeper) Run(_ context.Context, sw scheduler.Sweep) healer.Summary {
	f.mu.Lock()
	f.ran = append(f.ran, sw)
	f.mu.Unlock()
	<-f.release
	return healer.Summary{}
}

func (f *fakeSweeper) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ran)
}

// TestSweepRunnerWaitsForReadinessAndForItsSweeps: a sweep requested before the caches are
// ready is held, not planned from empty caches (which would record a restart as handled with no
// volume looked at), and runs once they are; when the runner stops it waits for running sweeps.
func TestSweepRunnerWaitsForReadinessAndForItsSweeps(t *testing.T) {
	ready := make(chan struct{})
	sweeper := &fakeSweeper{release: make(chan struct{})}
	r := &sweepRunner{sweeper: sweeper, ready: func(ctx context.Context) error {
		select {
		case <-ready:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	r.submit(scheduler.Sweep{Trigger: scheduler.TriggerRestart, Driver: "d", Node: "n"})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	time.Sleep(50 * time.Millisecond)
	if n := sweeper.count(); n != 0 {
		t.Fatalf("%d sweeps ran before the caches were ready", n)
	}
	close(ready)
	poll.Eventually(t, routed, "the held sweep runs once ready", poll.True(func() bool { return sweeper.count() == 1 }))
	r.submit(scheduler.Sweep{Trigger: scheduler.TriggerSchedule, StorageClass: "fast"})
	poll.Eventually(t, routed, "a later sweep runs at once", poll.True(func() bool { return sweeper.count() == 2 }))

	cancel()
	select {
	case err := <-done:
		t.Fatalf("Start returned (%v) while two sweeps were still running", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(sweeper.release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return after its sweeps ended")
	}
	r.submit(scheduler.Sweep{Trigger: scheduler.TriggerManual, PV: "pv-1"})
	time.Sleep(20 * time.Millisecond)
	if n := sweeper.count(); n != 2 {
		t.Fatalf("a sweep submitted after the runner stopped ran: %d sweeps", n)
	}
}

// TestMetricsServerServesItsRegistry: /metrics shows the controller's own registry, and the
// server stops when its context ends; a listener that cannot bind is an error naming the address.
func TestMetricsServerServesItsRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "volume_healer_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	m := &metricsServer{addr: addr, registry: reg}
	if m.NeedLeaderElection() {
		t.Error("the metrics server must run on standby replicas too")
	}
	go func() { done <- m.Start(ctx) }()

	var body string
	poll.Eventually(t, routed, "/metrics answers", poll.True(func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	}))
	if !strings.Contains(body, "volume_healer_test_total 3") {
		t.Errorf("/metrics does not show the registry's counter:\n%s", body)
	}

	busy := &metricsServer{addr: addr, registry: reg}
	if err := busy.Start(context.Background()); err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("a second server on %s: error %v, want one naming the address", addr, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the metrics server did not stop")
	}
}

// TestSidecarClientTLSSettings: the sidecar TLS files are read at start, and a wrong one is an
// error that names the setting and the file.
func TestSidecarClientTLSSettings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	certPEM, keyPEM, err := harness.SelfSigned("healer-sidecar")
	if err != nil {
		t.Fatal(err)
	}
	ca := write("ca.crt", string(certPEM))
	cert := write("tls.crt", string(certPEM))
	key := write("tls.key", string(keyPEM))
	notPEM := write("garbage.crt", "not a certificate")

	tests := map[string]struct {
		tls     config.SidecarTLS
		wantErr string
	}{
		"TLS off":                  {tls: config.SidecarTLS{Enabled: false, CAFile: filepath.Join(dir, "missing")}},
		"CA and client cert":       {tls: config.SidecarTLS{Enabled: true, CAFile: ca, CertFile: cert, KeyFile: key}},
		"system roots":             {tls: config.SidecarTLS{Enabled: true}},
		"missing CA file":          {tls: config.SidecarTLS{Enabled: true, CAFile: filepath.Join(dir, "missing")}, wantErr: "sidecar.tls.caFile"},
		"CA file without PEM":      {tls: config.SidecarTLS{Enabled: true, CAFile: notPEM}, wantErr: "garbage.crt: no PEM certificate"},
		"client key does not load": {tls: config.SidecarTLS{Enabled: true, CertFile: cert, KeyFile: notPEM}, wantErr: "sidecar.tls.certFile and keyFile"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := &config.Config{}
			cfg.Sidecar.TLS = tc.tls
			c, _, err := sidecarClient(cfg, nil, nil, nil, nil)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("sidecarClient: %v", err)
				}
				c.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("sidecarClient error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
