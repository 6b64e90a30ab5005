package harness

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/klog/v2"
)

// SuiteOptions describe the suite of a test package.
type SuiteOptions struct {
	// Name names the suite in messages and its folder: "integration", "e2e". Required.
	Name string
	// Build is what the suite runs as processes.
	Build BuildOptions
	// APIServerArgs, when set, returns extra kube-apiserver flags; it gets the suite's folder, for
	// the files the flags name (an audit policy, an audit log).
	APIServerArgs func(dir string) (map[string]string, error)
	// Skip says why a test skips itself under -short.
	Skip string
	// KeepLogs keeps the suite's folder after a successful run too; a failed run always keeps it.
	KeepLogs bool
	// Kept says what the kept folder holds, for the message that names it.
	Kept string
	// Lazy sets the suite up at the first Require instead of in Main, for a package whose unit
	// tests run without a control plane: a run of only those starts nothing.
	Lazy bool
	// NoPrograms builds no program, for a suite that runs what it tests in the test process (the
	// sidecar's tests).
	NoPrograms bool
}

// Suite is what the tests of one package share: one control plane, the programs built for the
// run, the run's folder (logs, kubeconfig, token) and the register of child processes. Tests run
// one after the other and each works in objects of its own (a Fixture), because each starts its
// own controller and every controller sees the whole cluster.
type Suite struct {
	*Cluster
	// Dir is the run's folder. It is removed after a successful run, unless KeepLogs.
	Dir string
	// Bin are the programs built for the run.
	Bin Binaries
	// Procs are the run's child processes, killed when the run ends.
	Procs *Processes

	opts         SuiteOptions
	tearDownOnce sync.Once

	csiAddonsOnce sync.Once
	csiAddons     CSIAddonsBinaries
	csiAddonsErr  error
}

// CSIAddonsBinaries are the programs that run the real csi-addons sidecar as a pod's container.
type CSIAddonsBinaries struct {
	// Sidecar is the csi-addons sidecar (BuildCSIAddonsSidecar).
	Sidecar string
	// Runner is test/container (BuildContainer), for ContainerOptions.Runner.
	Runner string
}

// CSIAddons returns the real csi-addons sidecar and test/container, built on the first call of
// the run: only the tests that run the csi-addons sidecar wait for its build (minutes on a new
// machine, then cached). It skips t where a program cannot run as a pod's container
// (RequireContainers), and fails it when a build fails.
func (s *Suite) CSIAddons(t testing.TB) CSIAddonsBinaries {
	t.Helper()
	RequireContainers(t)
	s.csiAddonsOnce.Do(func() {
		var err error
		if s.csiAddons.Runner, err = BuildContainer(); err != nil {
			s.csiAddonsErr = err
			return
		}
		s.csiAddons.Sidecar, s.csiAddonsErr = BuildCSIAddonsSidecar()
	})
	if s.csiAddonsErr != nil {
		t.Fatalf("build the csi-addons sidecar: %v", s.csiAddonsErr)
	}
	return s.csiAddons
}

var (
	suiteMu sync.Mutex
	suite   *Suite
	skip    string
	// lazy holds the options of a Lazy suite until Require sets it up; setUpErr is what that
	// set-up failed with, for every later Require.
	lazy     *SuiteOptions
	setUpErr error
)

// Main sets up the suite, runs the package's tests and tears the suite down, and returns the exit
// code for os.Exit. Under -short it sets nothing up: every test skips itself in Require. TestMain
// calls it, after flag.Parse when it reads its own flags into o:
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m, harness.SuiteOptions{Name: "e2e"})) }
func Main(m *testing.M, o SuiteOptions) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	suiteMu.Lock()
	skip = o.Skip
	suiteMu.Unlock()
	if testing.Short() {
		return m.Run()
	}
	if o.Lazy {
		suiteMu.Lock()
		lazy = &o
		suiteMu.Unlock()
		code := m.Run()
		suiteMu.Lock()
		s := suite
		suiteMu.Unlock()
		if s != nil {
			s.tearDown(code != 0 || o.KeepLogs)
		}
		return code
	}
	s, err := setUpSuite(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: set up: %v\n", o.Name, err)
		if s != nil {
			s.tearDown(true)
		}
		return 1
	}
	suiteMu.Lock()
	suite = s
	suiteMu.Unlock()
	s.guard()
	code := m.Run()
	s.tearDown(code != 0 || o.KeepLogs)
	return code
}

// Require returns the package's suite, set up by the first call when it is Lazy; under -short it
// skips the test.
func Require(t testing.TB) *Suite {
	t.Helper()
	if testing.Short() {
		suiteMu.Lock()
		why := skip
		suiteMu.Unlock()
		t.Skip(why)
	}
	suiteMu.Lock()
	if suite == nil && lazy != nil {
		o := *lazy
		lazy = nil
		s, err := setUpSuite(o)
		if err != nil {
			if s != nil {
				s.tearDown(true)
			}
			setUpErr = fmt.Errorf("%s: set up: %w", o.Name, err)
		} else {
			suite = s
			s.guard()
		}
	}
	s, err := suite, setUpErr
	suiteMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		t.Fatal("the suite was not set up: TestMain must call harness.Main")
	}
	return s
}

func setUpSuite(o SuiteOptions) (*Suite, error) {
	dir, err := os.MkdirTemp("", "volume-healer-"+o.Name+"-")
	if err != nil {
		return nil, err
	}
	s := &Suite{Dir: dir, Procs: NewProcesses(), opts: o}
	// The sidecars, drivers and clients in this process log through klog: to a file, so that a
	// failure's output shows the tests' own messages.
	logFile, err := os.Create(filepath.Join(dir, "test-process.log"))
	if err != nil {
		return s, err
	}
	klog.LogToStderr(false)
	klog.SetOutput(logFile)
	var args map[string]string
	if o.APIServerArgs != nil {
		if args, err = o.APIServerArgs(dir); err != nil {
			return s, err
		}
	}

	// The builds and the control plane's start take about as long as each other: overlap them.
	built := make(chan error, 1)
	go func() {
		if o.NoPrograms {
			built <- nil
			return
		}
		var err error
		s.Bin, err = Build(o.Build)
		built <- err
	}()
	c, err := StartCluster(context.Background(), ClusterOptions{Dir: dir, APIServerArgs: args})
	berr := <-built
	if err != nil {
		return s, err
	}
	s.Cluster = c
	return s, berr
}

// guard stops every process of the run when the run is interrupted (SIGINT, SIGTERM) and shortly
// before the test binary's own timeout panics: the children would die with the test binary anyway
// (see Processes), but kube-apiserver and etcd would not.
func (s *Suite) guard() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		fmt.Fprintf(os.Stderr, "%s: %v: stopping every process of the run\n", s.opts.Name, sig)
		s.tearDown(true)
		os.Exit(2)
	}()
	if f := flag.Lookup("test.timeout"); f != nil {
		if timeout, err := time.ParseDuration(f.Value.String()); err == nil && timeout > 0 {
			// The timeout's panic prints every goroutine, which tells where a test hung; it comes a
			// little later, with the processes already gone.
			margin := min(30*time.Second, timeout/10)
			time.AfterFunc(timeout-margin, func() {
				fmt.Fprintf(os.Stderr, "%s: the test binary times out in %s: stopping every process of the run\n", s.opts.Name, margin)
				s.tearDown(true)
			})
		}
	}
}

// tearDown kills every process still running, stops the control plane and removes the run's
// folder unless keep asks to keep it for its logs. It runs once, from whichever path comes first;
// a later call waits for the first to finish.
func (s *Suite) tearDown(keep bool) {
	s.tearDownOnce.Do(func() {
		s.Procs.KillAll()
		if s.Cluster != nil {
			if err := s.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "%s: stop control plane: %v\n", s.opts.Name, err)
			}
		}
		if keep {
			fmt.Fprintf(os.Stderr, "%s: keeping %s (%s)\n", s.opts.Name, s.Dir, s.opts.Kept)
			return
		}
		_ = os.RemoveAll(s.Dir)
	})
}

// LogDir returns the folder for the logs of t's processes, inside the run's folder.
func (s *Suite) LogDir(t TB) string {
	t.Helper()
	dir := filepath.Join(s.Dir, "logs", t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	return dir
}

// TestController is a controller started for a test: its helpers fail the test when the
// controller does not answer.
type TestController struct {
	*Controller
	t TB
}

// StartController starts a controller for t with the suite's test settings, overridden by
// settings (VOLUME_HEALER_* names without the prefix), and waits until it reports ready. It is
// stopped when the test ends; a failed test shows the end of its log, and a data race it reported
// fails the test.
//
// The test settings: one replica (no leader election, its Lease in ControllerNamespace should a
// test turn it on), a 300ms restart debounce, no periodic sweeps unless a test asks, a 200ms
// backoff base, log verbosity 2.
func (s *Suite) StartController(t TB, name string, settings map[string]string) *TestController {
	t.Helper()
	all := s.ControllerSettings()
	for k, v := range map[string]string{
		"LEADER_ELECTION_ENABLED":   "false",
		"LEADER_ELECTION_NAMESPACE": ControllerNamespace,
		"RESTART_DEBOUNCE":          "300ms",
		"SCHEDULE_DEFAULT":          "",
		"SCHEDULE_STAGGER":          "0s",
		"BACKOFF_BASE":              "200ms",
		"LOG_VERBOSITY":             "2",
	} {
		all[k] = v
	}
	for k, v := range settings {
		all[k] = v
	}
	c, err := StartController(s.Procs, ControllerOptions{
		Name: "controller " + name, Binary: s.Bin.Controller, Settings: all,
		LogPath: filepath.Join(s.LogDir(t), "controller-"+name+".log"),
	})
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(40 * time.Second); err != nil {
			t.Errorf("%v", err)
		}
		if c.RaceReported() {
			t.Errorf("the race detector found a data race in %s; see %s", c.Name, c.LogPath)
		}
		if t.Failed() {
			t.Logf("last lines of %s's log (%s):\n%s", c.Name, c.LogPath, c.LogTail(80))
		}
	})
	if err := c.WaitReady(t.Context(), 2*time.Minute); err != nil {
		t.Fatalf("%v", err)
	}
	return &TestController{Controller: c, t: t}
}

// MustRun fails the test when the controller has exited.
func (c *TestController) MustRun() {
	c.t.Helper()
	if !c.Running() {
		c.t.Fatalf("%s exited (%s):\n%s", c.Name, c.ExitStatus(), c.LogTail(40))
	}
}

// Kill ends the controller with SIGKILL: no shutdown, no Lease release, calls cut mid-flight.
func (c *TestController) Kill() {
	c.t.Helper()
	if err := c.Process.Kill(); err != nil {
		c.t.Fatalf("%v", err)
	}
}

// Scrape reads the controller's /metrics.
func (c *TestController) Scrape() map[string]*dto.MetricFamily {
	c.t.Helper()
	fams, err := c.Controller.Scrape(c.t.Context())
	if err != nil {
		c.t.Fatalf("%v", err)
	}
	return fams
}

// Metric returns the sum of the series of family name whose labels include want (see MetricSum).
func (c *TestController) Metric(name string, want map[string]string) float64 {
	c.t.Helper()
	return MetricSum(c.Scrape(), name, want)
}

// WaitIdle waits until the controller has no call in flight and no task queued: every budget
// slot is back.
func (c *TestController) WaitIdle(timeout time.Duration) {
	c.t.Helper()
	Eventually(c.t, timeout, c.Name+" to have no call in flight and nothing queued", func() (bool, string) {
		c.MustRun()
		fams, err := c.Controller.Scrape(c.t.Context())
		if err != nil {
			return false, err.Error()
		}
		inFlight := MetricSum(fams, "volume_healer_dispatch_in_flight", nil)
		queued := MetricSum(fams, "volume_healer_dispatch_queued", nil)
		return inFlight == 0 && queued == 0, fmt.Sprintf("%v in flight, %v queued", inFlight, queued)
	})
}
