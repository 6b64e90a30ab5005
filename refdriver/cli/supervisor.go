package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/driverkit/supervisor"
	"github.com/volume-healer/volume-healer/logging"
	"github.com/volume-healer/volume-healer/refdriver/mounter"
	"github.com/volume-healer/volume-healer/version"
)

// runSupervisor is the `refdriver supervisor` subcommand: the node's mount supervisor (package
// driverkit/supervisor) with the reference driver's mounter, or with `status` the table of a
// running one.
func runSupervisor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "status" {
		return runSupervisorStatus(ctx, args[1:], stdout)
	}
	fs := flag.NewFlagSet("refdriver supervisor", flag.ContinueOnError)
	var (
		socket        = fs.String("socket", "", "UNIX socket to serve the node plugin on (required); the node plugin's --supervisor-socket")
		stateDir      = fs.String("state-dir", "", "folder of the handover socket, the mounters' state and the retired instances; the old and the new supervisor of an upgrade share it (required)")
		instance      = fs.String("instance", os.Getenv("POD_NAME"), "name of this supervisor among those that run on --state-dir, such as its pod's name: an instance that handed its mounts over never takes them back (default: $POD_NAME, else the host name)")
		mounterCmd    = fs.String("mounter-command", "", "program and leading arguments, separated by spaces, that start a volume's mounter; the supervisor appends --source, --fuse-fd, --state-dir, --ready-fd, --fsname and --takeover (default: this program with the argument \"mounter\")")
		maxMounts     = fs.Int("max-mounts", 64, "most volumes the supervisor holds; a mount past it is refused")
		maxRestarts   = fs.Int("max-restarts", 5, "most restarts of one volume's mounter within --restart-window; past it the volume is reported failed and its connection kept")
		restartWindow = fs.Duration("restart-window", 10*time.Minute, "window --max-restarts counts in")
		readyTimeout  = fs.Duration("ready-timeout", 10*time.Second, "how long a mounter may take to be ready")
		stopTimeout   = fs.Duration("stop-timeout", 10*time.Second, "how long a mounter may take to stop after SIGTERM before it is killed")
		showVersion   = fs.Bool("version", false, "print the version, the git commit and the Go version of this binary, and exit")
	)
	logOpts := logging.NewOptions()
	logOpts.AddGoFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("supervisor: unexpected arguments %q (the only subcommand is \"status\")", fs.Args())
	}
	if *showVersion {
		_, err := fmt.Fprintln(stdout, version.Line("refdriver supervisor"))
		return err
	}
	if *socket == "" || *stateDir == "" {
		return errors.New("supervisor: --socket and --state-dir are required")
	}
	command := strings.Fields(*mounterCmd)
	if len(command) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("supervisor: find this program to run it as the mounter: %w", err)
		}
		command = []string{exe, "mounter"}
	}
	if err := logOpts.Apply(stdout, stderr); err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	defer klog.Flush()
	log := klog.Background()
	s, err := supervisor.New(supervisor.Options{
		StateDir:       *stateDir,
		Socket:         *socket,
		Instance:       *instance,
		MounterCommand: command,
		Subtype:        mounter.Name,
		MaxMounts:      *maxMounts,
		MaxRestarts:    *maxRestarts,
		RestartWindow:  *restartWindow,
		ReadyTimeout:   *readyTimeout,
		StopTimeout:    *stopTimeout,
		MounterOutput:  stderr,
		Logger:         log,
	})
	if err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	log.Info("Starting the mount supervisor", "version", version.Get().String())
	if err := s.Start(ctx); err != nil {
		return err
	}
	log.Info("Stopped")
	return nil
}

// runSupervisorStatus prints what a running supervisor holds.
func runSupervisorStatus(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("refdriver supervisor status", flag.ContinueOnError)
	socket := fs.String("socket", "", "the supervisor's socket (required)")
	output := fs.String("o", "table", "output: table or json")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the answer")
	ready := fs.Bool("ready", false, "print nothing, and fail unless the supervisor answering is --instance and serves: the readiness check of a supervisor's pod, which an upgrade waits for before it stops the old pod")
	instance := fs.String("instance", os.Getenv("POD_NAME"), "with --ready: the supervisor that must answer (default: $POD_NAME)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("supervisor status: unexpected arguments %q", fs.Args())
	}
	if *socket == "" {
		return errors.New("supervisor status: --socket is required")
	}
	if *output != "table" && *output != "json" {
		return fmt.Errorf("supervisor status: -o %q: want table or json", *output)
	}
	if *ready && *instance == "" {
		return errors.New("supervisor status: --ready needs --instance (or $POD_NAME)")
	}
	st, err := supervisor.NewClient(*socket, *timeout).Status(ctx)
	if err != nil {
		return fmt.Errorf("supervisor status: %w", err)
	}
	if *ready {
		if st.Instance != *instance || st.State != supervisor.ServerServing {
			return fmt.Errorf("supervisor status: not ready: %s is served by %s (%s), not by %s", *socket, st.Instance, st.State, *instance)
		}
		return nil
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	return printStatus(stdout, st, time.Now())
}

// printStatus writes st as tables: the supervisor, its volumes, and the dead mounts nobody holds.
func printStatus(w io.Writer, st supervisor.Status, now time.Time) error {
	from := ""
	if st.TookOverFrom != "" {
		from = ", took over from " + st.TookOverFrom
	}
	fmt.Fprintf(w, "supervisor %s (PID %d): %s%s, %d of at most %d mounts\n", st.Instance, st.PID, st.State, from, len(st.Volumes), st.MaxMounts)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tTARGET\tSTATE\tMOUNTER PID\tRESTARTS\tSINCE\tCONNECTION\tWAITING\tLAST ERROR")
	for _, v := range st.Volumes {
		pid, conn, waiting := "-", "-", "-"
		if v.MounterPID != 0 {
			pid = fmt.Sprint(v.MounterPID)
		}
		if v.Connection != 0 {
			conn = fmt.Sprint(v.Connection)
		}
		if v.Waiting >= 0 {
			waiting = fmt.Sprint(v.Waiting)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s ago\t%s\t%s\t%s\n", v.Volume, v.Target, v.State, pid, v.Restarts,
			now.Sub(v.Since).Round(time.Second), conn, waiting, v.LastError)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.Unheld) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n%d mount(s) of the driver's type that nobody holds (dead, not adopted):\n", len(st.Unheld))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tFSNAME\tCONNECTION")
	for _, m := range st.Unheld {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", m.Target, m.FsName, m.Connection)
	}
	return tw.Flush()
}
