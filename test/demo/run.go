package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/test/cluster"
	"github.com/volume-healer/volume-healer/test/harness"
)

// appNamespace holds the claims in both modes.
const appNamespace = "shop"

// inProcessLog is the file, in the demo's folder, that the parts running in this process (the
// sidecars, the API clients) log to, so that their lines do not cut into the tables.
const inProcessLog = "demo-process.log"

func run(ctx context.Context, o options) error {
	mode, err := resolveMode(o.mode)
	if err != nil {
		return err
	}
	setDefaults(&o, mode)
	if err := o.validate(mode); err != nil {
		return err
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	if err := earlierDemo(dir); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// make demo-down stops a demo held open (or left behind) through these.
	if err := os.WriteFile(filepath.Join(dir, "demo.pid"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		return err
	}
	restore, err := logToFile(filepath.Join(dir, inProcessLog))
	if err != nil {
		return err
	}
	defer restore()
	// The harness's cluster helpers fail a test; under RunScript they end the demo with an error.
	// What the demo starts is stopped when it ends, last started first.
	return harness.RunScript(ctx, "demo", func(s *harness.Script) error {
		switch mode {
		case modeCluster:
			return clusterDemo(s, dir, o)
		case modeReal:
			return realDemo(s, dir, o)
		}
		return simulatedDemo(s, dir, o)
	})
}

// earlierDemo fails when a demo still runs in dir, or one killed without its cleanups left mounts
// there: removing the folder would fail on a dead mount, and remove a volume's data through a
// live one.
func earlierDemo(dir string) error {
	if b, err := os.ReadFile(filepath.Join(dir, "demo.pid")); err == nil {
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if cmd := harness.CommandLine(pid); pid != os.Getpid() && slices.ContainsFunc(cmd, func(a string) bool { return strings.Contains(a, "demo") }) {
			return fmt.Errorf("a demo still runs in %s (pid %d); `make demo-down` ends it", dir, pid)
		}
	}
	if mounts := mountsUnder(dir); len(mounts) > 0 {
		return fmt.Errorf("an earlier demo left %d mounts under %s (%s); `make demo-down` removes them", len(mounts), dir, mounts[0])
	}
	return nil
}

// mountsUnder lists the mount points at or below dir in this process's mount namespace.
func mountsUnder(dir string) []string {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(mounts))
	for _, m := range mounts {
		out = append(out, m.Mountpoint)
	}
	return out
}

// resolveMode turns --mode into modeCluster, modeReal or modeSimulated for this machine, and
// says on stdout why auto falls back, and what gets the real node.
func resolveMode(mode string) (string, error) {
	return chooseMode(mode, machine{noMounts: harness.RealMountsUnavailable(), node: cluster.Check()}, os.Stdout)
}

// machine is what the modes need that this machine lacks.
type machine struct {
	// noMounts says why real mounts are not possible ("" when they are).
	noMounts string
	// node is what a real node lacks.
	node cluster.Machine
}

// noNode says why a real node cannot run, or "".
func (m machine) noNode() string {
	why := m.node.Lacks
	if m.noMounts != "" {
		why = append([]string{m.noMounts}, why...)
	}
	for _, prog := range m.node.Installable {
		why = append(why, "no "+prog)
	}
	return strings.Join(why, ", ")
}

// nodeHint is the one command that gets this machine a real node, with what it does and costs,
// or "" when no command of the project can (not root, no /dev/fuse, no cgroups) or none is needed.
func (m machine) nodeHint() string {
	if m.noMounts != "" || len(m.node.Lacks) > 0 || len(m.node.Installable) == 0 {
		return ""
	}
	return fmt.Sprintf("To get the real node, run `make node` as root: it installs %s with apt-get and builds kubelet, "+
		"containerd and the CSI sidecars into .cache/node (%s, once); then `make demo` tells this story on a real node (%s).",
		joinAnd(m.node.Packages()), nodeBuildTime, clusterStoryTime)
}

// What the hint says a real node costs: hack/node.sh's cold build on 2 cores, and a later run
// of the cluster story (docs/demo.md, "How long it takes", has the measurements).
const (
	nodeBuildTime    = "up to 15 minutes on 2 cores"
	clusterStoryTime = "about 2.5 minutes; the first run packs the node's images, a minute more"
)

// joinAnd joins words as a sentence does: "a", "a and b", "a, b and c".
func joinAnd(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

// chooseMode is resolveMode for machine m, writing what it says to w.
func chooseMode(mode string, m machine, w io.Writer) (string, error) {
	noNode := m.noNode()
	switch mode {
	case modeCluster:
		if noNode != "" {
			if hint := m.nodeHint(); hint != "" {
				return "", fmt.Errorf("--mode cluster: %s. %s", noNode, hint)
			}
			return "", fmt.Errorf("--mode cluster: %s; use --mode real or --mode simulated", noNode)
		}
		return modeCluster, nil
	case modeReal:
		if m.noMounts != "" {
			return "", fmt.Errorf("--mode real: %s; run the demo as root on a machine with /dev/fuse, or use --mode simulated", m.noMounts)
		}
		return modeReal, nil
	case modeSimulated:
		return modeSimulated, nil
	case modeAuto, "":
		if noNode == "" {
			return modeCluster, nil
		}
		if m.noMounts != "" {
			fmt.Fprintf(w, "Real mounts are not possible on this machine: %s.\n", m.noMounts)
			fmt.Fprintln(w, "Running the simulated story instead: the reference driver keeps its volumes as records and nothing is mounted.")
			return modeSimulated, nil
		}
		fmt.Fprintf(w, "A real node cannot run on this machine: %s.\n", noNode)
		fmt.Fprintln(w, "Running the story on kubelet stand-ins with real mounts instead.")
		if hint := m.nodeHint(); hint != "" {
			fmt.Fprintln(w, hint)
		}
		return modeReal, nil
	}
	return "", fmt.Errorf("--mode %q: want auto, cluster, real or simulated", mode)
}

// setDefaults fills in the mode's size: a real node runs a mounter and a workload process per
// volume, so a real demo is smaller.
func setDefaults(o *options, mode string) {
	nodes, volumes := 3, 80
	if mode == modeReal {
		nodes, volumes = 2, 8
	}
	if o.nodes == 0 {
		o.nodes = nodes
	}
	if o.volumes == 0 {
		o.volumes = volumes
	}
	if o.schedule == "" {
		o.schedule = "@every 10s"
	}
	if o.timeout == 0 {
		o.timeout = 5 * time.Minute
	}
}

func (o options) validate(mode string) error {
	if mode == modeCluster {
		// Its size is the charts' and its workloads'.
		return nil
	}
	if mode == modeReal {
		// The restarted node needs a lost volume, one whose pod cannot see a heal and one that
		// heals; the other node a read-only mount and a frozen mounter.
		if o.nodes < 2 || o.volumes < 3 {
			return fmt.Errorf("--nodes %d --volumes %d: the real story needs at least 2 nodes of 3 volumes each", o.nodes, o.volumes)
		}
		return nil
	}
	// The restarted node needs a lost volume and a broken one, every fourth volume is krbd.
	if o.nodes < 1 || o.volumes < 3 {
		return fmt.Errorf("--nodes %d --volumes %d: the simulated story needs at least 1 node of 3 volumes", o.nodes, o.volumes)
	}
	return nil
}

// logToFile sends klog's output, which the sidecars and the API clients of this process use,
// to file and nothing of it to standard error; restore sends it back to standard error.
func logToFile(file string) (restore func(), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	flags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(flags)
	set := func(values map[string]string) {
		for name, value := range values {
			// The names and values are klog's own and valid.
			_ = flags.Set(name, value)
		}
	}
	// one_output: each line once, not once per severity at or below its own.
	set(map[string]string{"logtostderr": "false", "stderrthreshold": "FATAL", "one_output": "true"})
	klog.SetOutput(f)
	return func() {
		klog.Flush()
		set(map[string]string{"logtostderr": "true", "stderrthreshold": "ERROR", "one_output": "false"})
		klog.SetOutput(os.Stderr)
		_ = f.Close()
	}, nil
}

// noRecycleHere says, in a mode without a real node (what its nodes are), why the stock
// driver's story is not shown: a driver that cannot heal gets its volumes back by recycling,
// which evicts the pods that use them for kubelet to unstage the volume and to stage and
// publish it again for their replacements. The nodes of this mode run no pods for the Eviction
// API to evict, and nothing that would start replacements and mount their volumes again.
func noRecycleHere(nodes string) {
	fmt.Printf("  not shown here: a stock driver (no Healer service) recycled by policy. That remedy evicts pods and needs kubelet to\n"+
		"  unstage the volume and mount it again for their replacements; the %s of this mode run no pods. --mode cluster shows it.\n", nodes)
}

func step(format string, args ...any) {
	fmt.Printf("\n==> "+format+"\n", args...)
}

// startController starts the controller as its own process, with settings that make a short
// demo: a quick debounce and backoff, at most 4 calls at a time per node.
func startController(cluster *harness.Cluster, dir, bin string) (*harness.Controller, error) {
	settings := cluster.ControllerSettings()
	settings["RESTART_DEBOUNCE"] = "500ms"
	settings["SCHEDULE_DEFAULT"] = ""
	settings["SCHEDULE_STAGGER"] = "2s"
	settings["BACKOFF_BASE"] = "500ms"
	settings["BUDGETS_PER_NODE"] = "4"
	ctrl, err := harness.StartController(harness.NewProcesses(), harness.ControllerOptions{
		Name: "controller", Binary: bin, Settings: settings, Args: []string{"--log-verbosity=2"},
		LogPath: filepath.Join(dir, "controller.log"),
	})
	if err != nil {
		return nil, fmt.Errorf("%w (run make build first)", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "controller.pid"), []byte(fmt.Sprint(ctrl.Pid())), 0o644); err != nil {
		return nil, err
	}
	fmt.Printf("  controller pid %d, log %s, metrics http://%s/metrics\n", ctrl.Pid(), ctrl.LogPath, ctrl.MetricsAddr)
	return ctrl, nil
}

// allHandled reports whether every CSIAddonsNode's current restart has been swept.
func allHandled(ctx context.Context, c client.Client) (bool, string) {
	pending, seen, err := harness.RestartsPending(ctx, c, "")
	if err != nil {
		return false, err.Error()
	}
	return seen > 0 && len(pending) == 0, fmt.Sprintf("%d of %d restarts not swept yet", len(pending), seen)
}

// errPromise marks a promise of the story that did not hold: the demo then exits non-zero.
var errPromise = errors.New("the demo's promises did not hold")

// eventPrinter prints Events of the demo's namespaces once each.
type eventPrinter struct {
	cs         kubernetes.Interface
	namespaces []string
	seen       map[string]bool
	// component, when set, keeps only the Events of that source (volume-healer's).
	component string
	// width, when set, cuts messages longer than that many bytes.
	width int
}

func newEventPrinter(cs kubernetes.Interface, namespaces ...string) *eventPrinter {
	return &eventPrinter{cs: cs, namespaces: namespaces, seen: map[string]bool{}}
}

func (e *eventPrinter) list(ctx context.Context) []corev1.Event {
	var out []corev1.Event
	for _, ns := range e.namespaces {
		list, err := e.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		out = append(out, list.Items...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LastTimestamp.Before(&out[j].LastTimestamp) })
	return out
}

func (e *eventPrinter) skipExisting(ctx context.Context) {
	for _, ev := range e.list(ctx) {
		e.seen[string(ev.UID)] = true
	}
}

// print shows new Events; per-volume Events beyond a few per reason are counted, not listed.
func (e *eventPrinter) print(ctx context.Context) {
	shown := map[string]int{}
	for _, ev := range e.list(ctx) {
		if e.seen[string(ev.UID)] {
			continue
		}
		e.seen[string(ev.UID)] = true
		if e.component != "" && ev.Source.Component != e.component {
			continue
		}
		shown[ev.Reason]++
		if shown[ev.Reason] > 3 {
			continue
		}
		msg := ev.Message
		if e.width > 0 && len(msg) > e.width {
			msg = msg[:e.width] + " ..."
		}
		fmt.Printf("  event %-8s %-22s %s/%s: %s\n", ev.Type, ev.Reason, strings.ToLower(ev.InvolvedObject.Kind), ev.InvolvedObject.Name, msg)
	}
	for reason, n := range shown {
		if n > 3 {
			fmt.Printf("  ... and %d more %s events\n", n-3, reason)
		}
	}
}

// end keeps the cluster up until Ctrl-C when hold is set, saying what to look at with kubectl,
// and returns the promises that did not hold as the demo's error.
func end(ctx context.Context, hold bool, kubeconfig, look string, broken []string) error {
	if hold {
		fmt.Printf("\nThe cluster stays up: kubectl --kubeconfig %s get %s -A. Ctrl-C ends the demo.\n", kubeconfig, look)
		<-ctx.Done()
	}
	if len(broken) > 0 {
		return fmt.Errorf("%w: %s", errPromise, strings.Join(broken, "; "))
	}
	return nil
}
