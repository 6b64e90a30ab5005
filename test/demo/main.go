// Command healer-demo shows volume-healer at work on one machine: a real kube-apiserver and etcd,
// a few nodes each with the reference driver behind a real healer sidecar, and the controller as
// its own process. It breaks volumes, restarts one node plugin, and shows the restart sweep probe
// and heal them, then a periodic sweep. It exits 0 only when every promise held: every healable
// broken volume healed, what cannot be healed reported, and `healerctl status` showing the
// operator exactly that. The cluster, the node plugins and the
// controller process come from test/harness; this program owns the story and what it prints.
//
//	go run ./test/demo [--mode auto|cluster|real|simulated] [--nodes N] [--volumes N] [--hold]
//
// It runs in one of three modes:
//
//   - cluster (auto's choice where the machine allows: root, /dev/fuse, cgroups): a real node on
//     this machine (test/cluster: kubelet, containerd, runc, the control plane), volume-healer and
//     the reference driver installed with their Helm charts, three workloads on the driver's FUSE
//     volumes (a StatefulSet of 6 pods with propagation HostToContainer, a Deployment with None,
//     and one whose volume's data is removed), and a rollout restart of the node plugin's
//     DaemonSet. The first run builds the node (hack/node.sh, cached under .cache/node). --nodes
//     and --volumes do not apply.
//   - real (auto's choice where a node cannot run but real mounts can; where all a node lacks is
//     what `make node` installs, it says so): every node is a kubelet
//     stand-in, the reference driver as a real CSI node plugin whose volumes are FUSE mounts
//     served by mounter processes in its process group, and the sidecar. Volumes are provisioned
//     through CSI, staged and published for one pod each, and used by a workload stand-in in a
//     mount namespace of its own. The node plugin is killed for real, its mounts answer ENOTCONN,
//     and the demo measures how long the workloads were without their volumes.
//   - simulated: the reference driver keeps its volumes as records and nothing is mounted, so
//     that many nodes and volumes fit one machine.
//
// Like every suite, it reaches the product through test/harness and the binaries it builds.
//
// It owns the story and its report: what breaks when, what the tables show, and the promises it
// checks. It imports the cluster and the nodes from test/harness, test/cluster, test/kubelet and
// test/realcluster, and of the product only the names an operator reads (api/annotations, the
// Event reasons of package healer, the reference driver's faults); it must not import the
// controller's stages (scheduler, policy, probe) or cmd/volume-healer: the controller runs as its
// own process, as in a cluster. Nothing imports it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	opts := options{}
	flag.StringVar(&opts.mode, "mode", modeAuto, "cluster: a real node (kubelet, containerd) with both Helm charts installed, its node plugin restarted (needs root, /dev/fuse, cgroups); real: kubelet stand-ins with real FUSE mounts, killed and healed (needs root and /dev/fuse); simulated: volumes are records; auto: the first the machine allows")
	flag.IntVar(&opts.nodes, "nodes", 0, "nodes, each with a node plugin (driver and sidecar) (default: 2 real, 3 simulated)")
	flag.IntVar(&opts.volumes, "volumes", 0, "volumes per node (default: 8 real, 80 simulated)")
	flag.StringVar(&opts.controller, "controller", "bin/volume-healer", "the controller binary to run")
	flag.StringVar(&opts.refdriver, "refdriver", "bin/refdriver", "real mode: the reference driver binary each node plugin runs")
	flag.StringVar(&opts.healerctl, "healerctl", "bin/healerctl", "the healerctl binary that shows the operator's view at the end")
	flag.StringVar(&opts.dir, "dir", ".demo", "folder for the demo's state, logs and kubeconfig")
	flag.StringVar(&opts.schedule, "schedule", "@every 10s", "the periodic schedule the demo sets on a StorageClass")
	flag.BoolVar(&opts.hold, "hold", false, "keep the cluster running after the summary until Ctrl-C, to look with kubectl")
	flag.DurationVar(&opts.timeout, "timeout", 5*time.Minute, "give up when the volumes are not healed by then")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// The modes of --mode.
const (
	modeAuto      = "auto"
	modeCluster   = "cluster"
	modeReal      = "real"
	modeSimulated = "simulated"
)

type options struct {
	// mode is modeAuto, modeReal or modeSimulated.
	mode string
	// nodes and volumes (per node) are 0 for the mode's default.
	nodes, volumes int
	// controller and refdriver are the binaries run as processes, refdriver only in real mode;
	// healerctl shows the operator's view at the end.
	controller, refdriver, healerctl string
	dir                              string
	// schedule is the periodic schedule set on a StorageClass.
	schedule string
	hold     bool
	timeout  time.Duration
}
