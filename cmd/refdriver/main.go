// Command refdriver is the volume-healer reference driver, in one of three modes:
//
//	refdriver --endpoint unix:///tmp/healer.sock --state-dir /tmp/healer-state \
//	    --control unix:///tmp/healer-control.sock
//	refdriver --mode stock --mounter rclone --endpoint unix:///tmp/healer.sock --state-dir /tmp/healer-state
//	refdriver --mode simulated --endpoint unix:///tmp/healer.sock --state-dir /tmp/healer-state
//
// Real mode (the default) is a CSI driver node plugin with real mounts (package plugin). Its
// volumes are folders under --state-dir, mounted at the staging path by a FUSE mounter process
// (`refdriver mounter`, package mounter) and bind-mounted at each publish target. It serves CSI
// Identity, Controller and Node on --csi-endpoint, and the CSI-Addons Identity and Healer
// services (package driverkit) on --endpoint. It needs root and /dev/fuse. In a cluster it runs
// twice on one --state-dir: beside external-provisioner and external-attacher for the Controller
// calls, and as the node plugin for kubelet, which it registers with itself
// (--kubelet-registration-dir, kubelet's plugin registration API, what node-driver-registrar
// does for other drivers); deploy/helm/healer-refdriver is that setup.
//
// Stock mode is the same plugin as a driver that knows nothing of volume-healer: it serves no
// Healer service, and its NodeStageVolume and NodePublishVolume mount a broken volume again
// themselves, as ceph-csi's do; --unmount-dead-targets-on-start adds the start-up clean-up that
// leaves pods an empty folder. With --mounter rclone (either mode), each volume's FUSE daemon is
// `rclone mount` of its folder instead of the driver's own mounter.
//
// Simulated mode is the simulated driver (package simulated): volumes are JSON records, faults
// are flags on them, and nothing is mounted; for tests and the demo that play many nodes.
//
// `refdriver supervisor --socket PATH --state-dir DIR` runs the node's mount supervisor
// (package driverkit/supervisor), which holds the volumes' FUSE connections and runs their
// mounters for a real-mode node plugin started with --supervisor-socket PATH;
// `refdriver supervisor status --socket PATH` prints what it holds.
//
// The flags are package cli's, the logic lives in packages plugin, mounter, simulated and
// control (the control socket, the call counters and the sockets both modes share); this file
// only hands cli the arguments and the signals. It must not import the controller's or the
// sidecar's packages, nor test/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/volume-healer/volume-healer/refdriver/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "refdriver:", err)
		os.Exit(1)
	}
}
