// Command healer-demo shows volume-healer at work on one machine: a real kube-apiserver and etcd,
// a few simulated nodes each with the reference driver behind a real healer sidecar, and the
// controller as its own process. It breaks volumes, restarts one node plugin, and shows the
// restart sweep probe and heal them, then a periodic sweep, and ends with what `healerctl status`
// shows an operator. It exits 0 only when every healable broken volume was healed and healerctl
// status tells the one volume whose data is lost apart. The cluster, the node plugins and the controller process come from
// test/harness; this program owns the story and what it prints.
//
//	go run ./test/demo [--nodes 3] [--volumes 40] [--controller bin/volume-healer] [--healerctl bin/healerctl] [--hold]
//
// Like every suite, it reaches the product through test/harness and the binaries it builds.
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

const (
	driverName      = "rbd.csi.ceph.com"
	pluginNamespace = "csi-rbd"
	appNamespace    = "shop"
)

func main() {
	opts := options{}
	flag.IntVar(&opts.nodes, "nodes", 3, "simulated nodes, each with a node plugin (driver and sidecar)")
	flag.IntVar(&opts.volumes, "volumes", 80, "volumes per node")
	flag.StringVar(&opts.controller, "controller", "bin/volume-healer", "the controller binary to run")
	flag.StringVar(&opts.healerctl, "healerctl", "bin/healerctl", "the healerctl binary that shows the operator's view at the end")
	flag.StringVar(&opts.dir, "dir", ".demo", "folder for the demo's state, logs and kubeconfig")
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

type options struct {
	nodes, volumes             int
	controller, healerctl, dir string
	hold                       bool
	timeout                    time.Duration
}
