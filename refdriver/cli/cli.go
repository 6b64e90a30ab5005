// Package cli is the command line of refdriver, the volume-healer reference driver: it turns
// flags into the options of package plugin (real and stock modes), package simulated (simulated mode) or
// package mounter (`refdriver mounter`), starts what they describe and serves until the context ends.
// cmd/refdriver only hands it the arguments and signals.
//
// It owns the flags, their defaults and which of them mean something in which mode; the driver
// itself lives in plugin, mounter, simulated and control. It must not import the controller's or the
// sidecar's packages, nor test/.
package cli

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/logging"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/mounter"
	"github.com/volume-healer/volume-healer/refdriver/plugin"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/version"
)

// Run runs refdriver with args, the command line without the binary's name, until ctx ends: the
// `mounter` subcommand, the `supervisor` subcommand (the node's mount supervisor, package
// driverkit/supervisor; `supervisor status` prints what it holds), or the driver in the mode
// --mode says. It logs to stderr (-v, --vmodule,
// --logging-format; package logging), and applies those flags once per process. It returns
// flag.ErrHelp after printing the help that -h asked for.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "mounter" {
		return runMounter(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "supervisor" {
		return runSupervisor(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("refdriver", flag.ContinueOnError)
	f := &driverFlags{
		mode:               fs.String("mode", "real", "real: a CSI node plugin with real FUSE mounts that serves the Healer service; stock: the same plugin as a driver that knows nothing of volume-healer (no Healer service; NodeStageVolume and NodePublishVolume mount a broken volume again, as ceph-csi's do); simulated: volumes are records and nothing is mounted"),
		endpoint:           fs.String("endpoint", "", "CSI-Addons socket to serve Identity and Healer on (stock mode: Identity only), unix:///path (required)"),
		csiEndpoint:        fs.String("csi-endpoint", "", "real and stock modes: CSI socket to serve Identity, Controller and Node on, unix:///path (default: the --endpoint socket)"),
		control:            fs.String("control", "", "socket for the HTTP control interface, unix:///path (default: none)"),
		stateDir:           fs.String("state-dir", "", "folder that keeps the volumes and their state across restarts (required)"),
		driverName:         fs.String("driver-name", "healer.example.com", "driver name reported by GetIdentity (and GetPluginInfo)"),
		nodeID:             fs.String("node-id", "node-1", "node this instance plays, reported in the identity manifest (and NodeGetInfo)"),
		statTimeout:        fs.Duration("stat-timeout", 5*time.Second, "real and stock modes: how long a stat of a mount may take before the mount counts as hung"),
		caps:               fs.String("capabilities", "probe,heal,list", "real and simulated modes: Healer RPCs to advertise and serve: any of probe, heal, list"),
		mounter:            fs.String("mounter", string(plugin.OwnMounter), "real and stock modes: userspace mounter of the volumes staged from now on: refdriver (this program's own FUSE daemon) or rclone (rclone mount of the volume's folder; needs rclone and fusermount on the PATH, Debian packages rclone and fuse3)"),
		supervisorSocket:   fs.String("supervisor-socket", "", "real mode: socket of the node's mount supervisor (`refdriver supervisor`); the volumes staged from now on are mounted by it and their mounters live through a restart of this plugin (default: none, the plugin runs the mounters itself)"),
		stopMounters:       fs.Bool("stop-mounters-on-exit", false, "real and stock modes: before exiting (SIGTERM), kill the mounters this process started and reap them; for a plugin that is its container's main process, whose mounters the container runtime kills anyway when it exits: left to the runtime's shim, containerd v2's takes about a second for each beyond 32"),
		unmountDeadTargets: fs.Bool("unmount-dead-targets-on-start", false, "stock mode: at start-up, detach the dead or hung mounts of the publish targets recorded by an earlier run and keep their folders, as some drivers' start-up clean-up does; kubelet still counts them published, so their pods see an empty folder on the node's disk (for tests of that worst case)"),

		registrationDir:    fs.String("kubelet-registration-dir", "", "real and stock modes: kubelet's plugin registration folder as this process sees it (kubelet's is /var/lib/kubelet/plugins_registry); the driver registers itself with kubelet through a socket there, <dir>/<driver-name>-reg.sock (default: none, do not register)"),
		kubeletCSIEndpoint: fs.String("kubelet-csi-endpoint", "", "real and stock modes: path of the CSI socket as kubelet sees it, reported to kubelet at registration, such as /var/lib/kubelet/plugins/healer.example.com/csi.sock (default: the --csi-endpoint path)"),

		stagingRoot:   fs.String("staging-root", healerv1alpha1.DefaultKubeletCSIPluginDir, "simulated mode: kubelet CSI plugin folder that staging paths start with"),
		volumes:       fs.String("volumes", "", "simulated mode: volumes to create on the first start: a count N (vol-1..vol-N) or a comma-separated list of IDs (default vol-1..vol-5)"),
		healMounters:  fs.String("heal-mounters", "rbd-nbd,fuse", "simulated mode: mounters whose volumes this driver can heal; advertised as the attribute healMounters"),
		defaultHang:   fs.Duration("default-hang", 30*time.Second, "simulated mode: how long calls on a hung volume block when no duration was given"),
		volumeKeeping: fs.String("volume-keeping", "", "simulated mode: restarts this driver's kept volumes live through, advertised as VolumeKeeping capabilities: any of plugin-restart, mounter-restart (default: none)"),
		keepMounters:  fs.String("keep-mounters", "", "simulated mode: mounters whose volumes this driver keeps alive, so that their probes answer kept=true; needs --volume-keeping (default: none)"),
	}
	showVersion := fs.Bool("version", false, "print the version, the git commit and the Go version of this binary, and exit")
	logOpts := logging.NewOptions()
	logOpts.AddGoFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (the subcommands are \"mounter\" and \"supervisor\")", fs.Args())
	}
	if *showVersion {
		_, err := fmt.Fprintln(stdout, version.Line("refdriver"))
		return err
	}
	if *f.endpoint == "" || *f.stateDir == "" {
		return errors.New("--endpoint and --state-dir are required")
	}
	if err := logOpts.Apply(stdout, stderr); err != nil {
		return err
	}
	defer klog.Flush()
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	capabilities, err := parseCapabilities(*f.caps)
	if err != nil {
		return err
	}
	log := klog.Background()
	log.Info("Starting", "version", version.Get().String(), "mode", *f.mode)

	switch *f.mode {
	case "real":
		err = runReal(ctx, f, capabilities, false, log)
	case "stock":
		err = runReal(ctx, f, nil, true, log)
	case "simulated":
		err = runSimulated(ctx, f, capabilities, log)
	default:
		return fmt.Errorf("--mode %q: want real, stock or simulated", *f.mode)
	}
	if err != nil {
		return err
	}
	log.Info("Stopped")
	return nil
}

// driverFlags are the driver's flags as parsed, and which of them were given.
type driverFlags struct {
	mode, endpoint, csiEndpoint, control, stateDir, driverName, nodeID, caps, mounter *string
	supervisorSocket                                                                  *string
	statTimeout                                                                       *time.Duration
	unmountDeadTargets, stopMounters                                                  *bool
	registrationDir, kubeletCSIEndpoint                                               *string
	stagingRoot, volumes, healMounters, volumeKeeping, keepMounters                   *string
	defaultHang                                                                       *time.Duration
	// set holds the names of the flags given on the command line.
	set map[string]bool
}

// identity is the driver's name and node, in either mode.
func (f *driverFlags) identity() control.Identity {
	return control.Identity{DriverName: *f.driverName, NodeID: *f.nodeID}
}

// sockets are the sockets every mode serves on.
func (f *driverFlags) sockets(log klog.Logger) control.ServerOptions {
	return control.ServerOptions{Endpoint: *f.endpoint, ControlEndpoint: *f.control, Logger: log}
}

// runReal serves the real mode, or with stock the stock mode (package plugin) until ctx ends: a
// CSI node plugin with real FUSE mounts, registered with kubelet when
// --kubelet-registration-dir is given.
func runReal(ctx context.Context, f *driverFlags, capabilities []healerv1alpha1.HealerCapability_RPC_Type, stock bool, log klog.Logger) error {
	mode := "real"
	rejected := []string{"staging-root", "volumes", "heal-mounters", "default-hang", "volume-keeping", "keep-mounters"}
	if stock {
		mode = "stock"
		// A stock driver serves no Healer service.
		rejected = append(rejected, "capabilities", "supervisor-socket")
	} else {
		rejected = append(rejected, "unmount-dead-targets-on-start")
	}
	if err := rejectFlags(f.set, mode, rejected...); err != nil {
		return err
	}
	mounter, err := plugin.ParseMounter(*f.mounter)
	if err != nil {
		return fmt.Errorf("--mounter: %w", err)
	}
	if *f.registrationDir == "" && *f.kubeletCSIEndpoint != "" {
		return errors.New("--kubelet-csi-endpoint is reported to kubelet at registration: give --kubelet-registration-dir too, or drop it")
	}
	var registration *driverkit.KubeletRegistration
	if *f.registrationDir != "" {
		endpoint, err := control.ParseEndpoint(cmp.Or(*f.kubeletCSIEndpoint, *f.csiEndpoint, *f.endpoint))
		if err != nil {
			return fmt.Errorf("--kubelet-csi-endpoint: %w", err)
		}
		registration = &driverkit.KubeletRegistration{
			Dir:        *f.registrationDir,
			DriverName: *f.driverName,
			Endpoint:   endpoint,
			Logger:     log,
		}
	}
	p, err := plugin.New(plugin.Options{
		StateDir:     *f.stateDir,
		Identity:     f.identity(),
		StatTimeout:  *f.statTimeout,
		Capabilities: capabilities,
		Stock:        stock,
		Mounter:      mounter,
		Logger:       log,

		SupervisorSocket: *f.supervisorSocket,

		UnmountDeadTargetsOnStart: *f.unmountDeadTargets,
	})
	if err != nil {
		return err
	}
	srv, err := plugin.NewServer(p, plugin.ServerOptions{ServerOptions: f.sockets(log), CSIEndpoint: *f.csiEndpoint})
	if err != nil {
		return err
	}
	log.Info("Serving", "mode", mode, "mounter", mounter, "supervisorSocket", *f.supervisorSocket, "endpoint", *f.endpoint, "csiEndpoint", cmp.Or(*f.csiEndpoint, *f.endpoint), "control", *f.control,
		"driver", *f.driverName, "node", *f.nodeID, "statTimeout", *f.statTimeout)
	err = serveReal(ctx, srv, registration)
	if *f.stopMounters {
		// Given as long as a mounter may take to die after SIGKILL: one in the kernel's
		// hands (a FUSE request) leaves as soon as it returns to user space.
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		n, stopErr := p.StopMounters(stopCtx)
		log.Info("Stopped the mounters before exiting", "count", n)
		err = errors.Join(err, stopErr)
	}
	return err
}

// runSimulated serves the simulated mode (package simulated) until ctx ends: volumes are records in
// the state folder and nothing is mounted.
func runSimulated(ctx context.Context, f *driverFlags, capabilities []healerv1alpha1.HealerCapability_RPC_Type, log klog.Logger) error {
	if err := rejectFlags(f.set, "simulated", "csi-endpoint", "stat-timeout", "kubelet-registration-dir", "kubelet-csi-endpoint",
		"mounter", "unmount-dead-targets-on-start", "stop-mounters-on-exit", "supervisor-socket"); err != nil {
		return err
	}
	seeds, err := parseVolumes(*f.volumes)
	if err != nil {
		return err
	}
	keeping, err := parseVolumeKeeping(*f.volumeKeeping)
	if err != nil {
		return err
	}
	keepMounters := splitList(*f.keepMounters)
	if len(keepMounters) > 0 && len(keeping) == 0 {
		return errors.New("--keep-mounters needs --volume-keeping: a driver that advertises no keeping must not report a volume kept")
	}
	d, err := simulated.New(simulated.Options{
		StateDir:      *f.stateDir,
		Identity:      f.identity(),
		StagingRoot:   *f.stagingRoot,
		HealMounters:  splitList(*f.healMounters),
		Capabilities:  capabilities,
		VolumeKeeping: keeping,
		KeepMounters:  keepMounters,
		SeedVolumes:   seeds,
		DefaultHang:   *f.defaultHang,
		Logger:        log,
	})
	if err != nil {
		return err
	}
	srv, err := simulated.NewServer(d, f.sockets(log))
	if err != nil {
		return err
	}
	log.Info("Serving a SIMULATED driver: volumes are records in the state folder and nothing is mounted",
		"mode", "simulated", "endpoint", *f.endpoint, "control", *f.control, "driver", *f.driverName, "node", *f.nodeID, "volumes", len(d.Volumes()))
	return srv.Start(ctx)
}

// serveReal serves the real mode's sockets until ctx is done and, with a registration, keeps
// the driver registered with kubelet meanwhile. The registration socket appears once the CSI
// socket listens (NewServer listened already), since kubelet dials the CSI socket as soon as it
// registers the driver.
func serveReal(ctx context.Context, srv *control.Server, registration *driverkit.KubeletRegistration) error {
	if registration == nil {
		return srv.Start(ctx)
	}
	r, err := driverkit.NewKubeletRegistrar(*registration)
	if err != nil {
		return fmt.Errorf("--kubelet-registration-dir: %w", err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Start(gctx) })
	g.Go(func() error { return r.Start(gctx) })
	return g.Wait()
}

// rejectFlags fails when a flag that means nothing in mode was given.
func rejectFlags(set map[string]bool, mode string, names ...string) error {
	var bad []string
	for _, name := range names {
		if set[name] {
			bad = append(bad, "--"+name)
		}
	}
	switch len(bad) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%s means nothing in %s mode; drop it, or pick the other --mode", bad[0], mode)
	default:
		return fmt.Errorf("%s mean nothing in %s mode; drop them, or pick the other --mode", strings.Join(bad, ", "), mode)
	}
}

// runMounter is the `refdriver mounter` subcommand: the process the real mode's plugin starts
// for each staged volume. With --target it mounts the folder itself; with --fuse-fd it serves a
// mount another process made and holds (keep mode), and leaves it mounted when it stops.
func runMounter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("refdriver mounter", flag.ContinueOnError)
	var (
		source   = fs.String("source", "", "folder to serve (required)")
		target   = fs.String("target", "", "mount point; the mounter mounts it and unmounts it when it stops (required unless --fuse-fd)")
		fsName   = fs.String("fsname", "", "source of the mount in the mount table (default: --source)")
		readyFD  = fs.Int("ready-fd", 1, "file descriptor to write \"ready\" to once serving; it is closed then")
		fuseFD   = fs.Int("fuse-fd", -1, "keep mode: descriptor of an already mounted /dev/fuse that another process holds too; the mounter serves it and leaves it mounted when it stops (SIGTERM), so that a next mounter takes it over")
		stateDir = fs.String("state-dir", "", "keep mode: folder of the connection's node ids and open handles (required with --fuse-fd)")
		takeover = fs.Bool("takeover", false, "keep mode: take over a connection a previous mounter served, by the state in --state-dir")
	)
	logOpts := logging.NewOptions()
	logOpts.AddGoFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	keep := *fuseFD >= 0
	switch {
	case !keep && (*source == "" || *target == ""):
		return errors.New("mounter: --source and --target are required")
	case keep && *source == "":
		return errors.New("mounter: --source is required")
	case keep && *target != "":
		return errors.New("mounter: --target and --fuse-fd exclude each other: --fuse-fd serves a mount another process made")
	case keep && *stateDir == "":
		return errors.New("mounter: --fuse-fd needs --state-dir")
	case !keep && (*stateDir != "" || *takeover):
		return errors.New("mounter: --state-dir and --takeover mean something only with --fuse-fd")
	case keep && *fuseFD < 3:
		return fmt.Errorf("mounter: --fuse-fd %d: want a descriptor the parent passed, 3 or above", *fuseFD)
	}
	if *readyFD < 1 {
		return fmt.Errorf("mounter: --ready-fd %d: want a descriptor the parent opened, such as 1 or 3", *readyFD)
	}
	if err := logOpts.Apply(stdout, stderr); err != nil {
		return fmt.Errorf("mounter: %w", err)
	}
	defer klog.Flush()
	log := klog.Background().WithValues("fsName", *fsName)
	ready := os.NewFile(uintptr(*readyFD), "ready")
	if keep {
		var st unix.Stat_t
		if err := unix.Fstat(*fuseFD, &st); err != nil {
			return fmt.Errorf("mounter: --fuse-fd %d: %w", *fuseFD, err)
		}
		dev := os.NewFile(uintptr(*fuseFD), "/dev/fuse")
		defer func() { _ = dev.Close() }()
		return mounter.Keep(ctx, mounter.KeepOptions{
			Source:   *source,
			Device:   dev,
			StateDir: *stateDir,
			Takeover: *takeover,
			Ready:    ready,
			Logger:   log,
		})
	}
	return mounter.Run(ctx, mounter.Options{
		Source: *source,
		Target: *target,
		FsName: *fsName,
		Ready:  ready,
		Logger: log,
	})
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

// parseVolumeKeeping reads --volume-keeping: a comma list of plugin-restart and mounter-restart.
func parseVolumeKeeping(s string) ([]healerv1alpha1.HealerCapability_VolumeKeeping_Type, error) {
	names := map[string]healerv1alpha1.HealerCapability_VolumeKeeping_Type{
		"plugin-restart":  healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART,
		"mounter-restart": healerv1alpha1.HealerCapability_VolumeKeeping_MOUNTER_RESTART,
	}
	var out []healerv1alpha1.HealerCapability_VolumeKeeping_Type
	for _, name := range splitList(s) {
		t, ok := names[name]
		if !ok {
			return nil, fmt.Errorf("--volume-keeping: unknown %q (want plugin-restart or mounter-restart)", name)
		}
		if slices.Contains(out, t) {
			return nil, fmt.Errorf("--volume-keeping: %q is listed twice", name)
		}
		out = append(out, t)
	}
	return out, nil
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
