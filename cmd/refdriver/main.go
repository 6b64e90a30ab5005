// Command refdriver is the volume-healer reference driver: a simulated CSI driver node plugin
// that serves the CSI-Addons Identity service and the Healer service on a UNIX socket, for
// tests, the demo, and driver authors who want to see the protocol implemented.
//
//	go run ./cmd/refdriver --endpoint unix:///tmp/healer.sock --state-dir /tmp/healer-state \
//	    --control unix:///tmp/healer-control.sock
//
// The logic lives in package driver; this file only turns flags into its options.
//
// It parses flags and serves package driver; it must not import the controller's or the sidecar's
// packages, nor test/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/cmd/refdriver/driver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "refdriver:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("refdriver", flag.ContinueOnError)
	var (
		endpoint     = fs.String("endpoint", "", "CSI-Addons socket to serve Identity and Healer on, unix:///path (required)")
		control      = fs.String("control", "", "socket for the HTTP control interface, unix:///path (default: none)")
		stateDir     = fs.String("state-dir", "", "folder that keeps one JSON file per volume across restarts (required)")
		driverName   = fs.String("driver-name", "healer.example.com", "driver name reported by GetIdentity and used in staging paths")
		nodeID       = fs.String("node-id", "node-1", "node this instance plays, reported in the identity manifest")
		stagingRoot  = fs.String("staging-root", healerv1alpha1.DefaultKubeletCSIPluginDir, "kubelet CSI plugin folder that staging paths start with")
		volumes      = fs.String("volumes", "", "volumes to create on the first start: a count N (vol-1..vol-N) or a comma-separated list of IDs (default vol-1..vol-5)")
		healMounters = fs.String("heal-mounters", "rbd-nbd,fuse", "mounters whose volumes this driver can heal; advertised as the attribute healMounters")
		capabilities = fs.String("capabilities", "probe,heal,list", "Healer RPCs to advertise and serve: any of probe, heal, list")
		defaultHang  = fs.Duration("default-hang", 30*time.Second, "how long calls on a hung volume block when no duration was given")
	)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.Var(klogFlags.Lookup("v").Value, "v", "log verbosity")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *endpoint == "" || *stateDir == "" {
		return errors.New("--endpoint and --state-dir are required")
	}

	seeds, err := parseVolumes(*volumes)
	if err != nil {
		return err
	}
	caps, err := parseCapabilities(*capabilities)
	if err != nil {
		return err
	}
	log := klog.Background()
	d, err := driver.New(driver.Options{
		StateDir:     *stateDir,
		DriverName:   *driverName,
		NodeID:       *nodeID,
		StagingRoot:  *stagingRoot,
		HealMounters: splitList(*healMounters),
		Capabilities: caps,
		SeedVolumes:  seeds,
		DefaultHang:  *defaultHang,
		Logger:       log,
	})
	if err != nil {
		return err
	}
	srv, err := driver.NewServer(d, driver.ServerOptions{Endpoint: *endpoint, ControlEndpoint: *control, Logger: log})
	if err != nil {
		return err
	}
	log.Info("Serving", "endpoint", *endpoint, "control", *control, "driver", *driverName, "node", *nodeID, "volumes", len(d.Volumes()))
	if err := srv.Start(ctx); err != nil {
		return err
	}
	log.Info("Stopped")
	return nil
}

// parseVolumes reads --volumes: empty means the driver's default set.
func parseVolumes(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 {
			return nil, fmt.Errorf("--volumes %d: a count must not be negative", n)
		}
		ids := make([]string, 0, n)
		for i := 1; i <= n; i++ {
			ids = append(ids, fmt.Sprintf("vol-%d", i))
		}
		return ids, nil
	}
	return splitList(s), nil
}

func parseCapabilities(s string) ([]healerv1alpha1.HealerCapability_RPC_Type, error) {
	names := map[string]healerv1alpha1.HealerCapability_RPC_Type{
		"probe": healerv1alpha1.HealerCapability_RPC_PROBE,
		"heal":  healerv1alpha1.HealerCapability_RPC_HEAL,
		"list":  healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES,
	}
	caps := []healerv1alpha1.HealerCapability_RPC_Type{}
	for _, name := range splitList(s) {
		t, ok := names[name]
		if !ok {
			return nil, fmt.Errorf("--capabilities: unknown %q (want probe, heal or list)", name)
		}
		caps = append(caps, t)
	}
	return caps, nil
}

func splitList(s string) []string {
	out := []string{}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
