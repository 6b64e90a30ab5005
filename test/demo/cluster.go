package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-healer/volume-healer/test/cluster"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/realcluster"
)

// clusterDemo is the story on a real node: kubelet, containerd and the control plane on this
// machine (test/cluster), volume-healer and the reference driver installed with their Helm charts
// (test/realcluster), two workloads on the driver's FUSE volumes, and the node plugin's DaemonSet
// restarted as an upgrade does. It shows the workloads' own writes failing and coming back.
func clusterDemo(s *harness.Script, dir string, o options) error {
	ctx := s.Context()
	step("Starting a real node: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, containerd, kubelet")
	fmt.Println("  (the first run builds kubelet, containerd and the CSI sidecars from the Go module proxy: hack/node.sh)")
	begin := time.Now()
	c, assets := cluster.StartFor(s, filepath.Join(dir, "node"))
	fmt.Printf("  node %s Ready at %s, %s after the start of the demo\n", c.NodeName(), c.NodeIP, time.Since(begin).Round(100*time.Millisecond))

	step("helm install volume-healer and the reference driver (deploy/helm/volume-healer, deploy/helm/healer-refdriver)")
	e := realcluster.Install(s, c, assets)
	e.OptInToPodRestarts()
	fmt.Println("  the controller, the driver's controller plugin and node plugin (driver + healer sidecar) run; the driver registered with kubelet")

	step("Two workloads write and read their FUSE volumes every 100ms")
	shared := e.StatefulSet("shared", corev1.MountPropagationHostToContainer)
	private := e.Deployment("private", corev1.MountPropagationNone)
	shared.WaitWriting(s, time.Time{}, 3*time.Minute, nil)
	private.WaitWriting(s, time.Time{}, 3*time.Minute, nil)
	fmt.Println("  shared:  a StatefulSet, its volume mounted with propagation HostToContainer")
	fmt.Println("  private: a Deployment, propagation None, in a namespace that lets the policy restart its pods")

	step("kubectl rollout restart daemonset/healer-refdriver-node: the driver's container restarts, its FUSE mounters die with it")
	view := watchWorkloads(ctx, shared, private)
	e.Disrupt(s, shared, private, "rollout restart", func() { e.RolloutRestart(s) })
	view()

	var broken []string
	if s.Failed() {
		broken = append(broken, "a workload did not get its I/O back (see above)")
	}
	if err := clusterOperatorView(ctx, o.healerctl, c.Kubeconfig); err != nil {
		broken = append(broken, err.Error())
	}
	return end(ctx, o.hold, c.Kubeconfig, "pods,pvc,events", broken)
}

// watchWorkloads prints a line whenever a workload's pod or the outcome of its latest try
// changes, until the returned function is called.
func watchWorkloads(ctx context.Context, ws ...*realcluster.Workload) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		last := map[string]string{}
		start := time.Now()
		for ctx.Err() == nil {
			for _, w := range ws {
				state := w.State(ctx)
				if state != "" && state != last[w.Name()] {
					last[w.Name()] = state
					fmt.Printf("  %7s  %-8s %s\n", "+"+time.Since(start).Round(100*time.Millisecond).String(), w.Name(), state)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// clusterOperatorView shows healerctl status against the real node's API server, once nothing
// in it needs a human: the restart handled, the evicted pod's volume found healthy again by the
// next probe (the class's periodic sweep, every 10s).
func clusterOperatorView(ctx context.Context, healerctl, kubeconfig string) error {
	step("What an operator sees: healerctl status (or kubectl healer status)")
	var table string
	var code int
	deadline := time.Now().Add(45 * time.Second)
	for {
		var err error
		table, code, err = runHealerctl(ctx, healerctl, "status", "--kubeconfig", kubeconfig)
		if err != nil {
			return err
		}
		if code == 0 || time.Now().After(deadline) {
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
	switch {
	case !strings.Contains(table, "handled"):
		return errors.New("healerctl status does not list the node plugin's restart as handled")
	case code != 0:
		return fmt.Errorf("healerctl status still says something needs a human (exit code %d)", code)
	}
	return nil
}
