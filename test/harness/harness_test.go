package harness

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRunScript(t *testing.T) {
	var order []string
	err := RunScript(context.Background(), "script", func(s *Script) error {
		s.Cleanup(func() { order = append(order, "first registered") })
		s.Cleanup(func() { order = append(order, "last registered") })
		s.Fatalf("stop at %d", 1)
		order = append(order, "after Fatalf")
		return nil
	})
	if err == nil || err.Error() != "stop at 1" {
		t.Errorf("RunScript returned %v, want the Fatalf message", err)
	}
	if got := strings.Join(order, ", "); got != "last registered, first registered" {
		t.Errorf("ran %q; want the cleanups only, last registered first", got)
	}

	err = RunScript(context.Background(), "script", func(s *Script) error {
		s.Errorf("one")
		s.Errorf("two")
		if !s.Failed() {
			t.Error("Failed is false after Errorf")
		}
		return nil
	})
	if err == nil || err.Error() != "one; two" {
		t.Errorf("RunScript returned %v, want the Errorf messages", err)
	}
}

func TestMetrics(t *testing.T) {
	fams, err := ParseMetrics(strings.NewReader(`# TYPE calls_total counter
calls_total{reason="timeout",node="a"} 2
calls_total{reason="timeout",node="b"} 3
calls_total{reason="refused",node="a"} 5
# TYPE in_flight gauge
in_flight 4
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := MetricSum(fams, "calls_total", map[string]string{"reason": "timeout"}); got != 5 {
		t.Errorf("sum of the timeouts = %v, want 5", got)
	}
	if got := MetricSum(fams, "calls_total", nil); got != 10 {
		t.Errorf("sum of every series = %v, want 10", got)
	}
	if got := MetricSum(fams, "not_exposed", nil); got != 0 {
		t.Errorf("sum of a family not exposed = %v, want 0", got)
	}
	if v, ok := MetricValue(fams, "calls_total", map[string]string{"reason": "refused"}); !ok || v != 5 {
		t.Errorf("value of the refused series = %v (found %v), want 5", v, ok)
	}
	if v, ok := MetricValue(fams, "in_flight", nil); !ok || v != 4 {
		t.Errorf("value of the gauge = %v (found %v), want 4", v, ok)
	}
	if _, ok := MetricValue(fams, "calls_total", map[string]string{"reason": "other"}); ok {
		t.Error("found a series whose labels do not match")
	}
}

func TestFreeAddr(t *testing.T) {
	a, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	b, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Errorf("two calls returned %s", a)
	}
	ln, err := net.Listen("tcp", a)
	if err != nil {
		t.Fatalf("listen on the free address %s: %v", a, err)
	}
	_ = ln.Close()
}

func TestProcesses(t *testing.T) {
	ps := NewProcesses()
	log := filepath.Join(t.TempDir(), "child.log")
	// The child ignores SIGTERM, so that Stop has to kill it.
	p, err := ps.Start("child", "/bin/sh", []string{"-c", `trap "" TERM; echo started; while :; do sleep 1; done`}, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, "the child's output", func() (bool, string) {
		return p.LogContains("started"), p.LogTail(5)
	})
	if err := p.Stop(200 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "was killed") {
		t.Errorf("Stop of a child that ignores SIGTERM returned %v, want that it was killed", err)
	}
	if p.Running() {
		t.Error("the child runs after Stop")
	}
	if got := p.LogTail(1); got != "started" {
		t.Errorf("LogTail(1) = %q, want the last line", got)
	}
	ps.KillAll() // nothing left: returns at once
}

// ProcessesWhere finds a running child by its command line, and no longer once it has ended.
func TestProcessesWhere(t *testing.T) {
	ps := NewProcesses()
	defer ps.KillAll()
	marker := "processes-where-" + filepath.Base(t.TempDir())
	p, err := ps.Start("child", "/bin/sh", []string{"-c", `echo started; while :; do sleep 1; done`, marker}, nil, filepath.Join(t.TempDir(), "child.log"))
	if err != nil {
		t.Fatal(err)
	}
	// The shell forks before it runs sleep, and a forked shell carries the same command line until
	// it execs: the test's own child is the one whose parent is the test.
	named := func(pid int) bool {
		st, ok := ProcessStat(pid)
		return ok && st.PPID == os.Getpid() && slices.Contains(CommandLine(pid), marker)
	}
	if got := ProcessesWhere(named); !slices.Equal(got, []int{p.Pid()}) {
		t.Errorf("ProcessesWhere(named %s) = %v, want the child %d", marker, got, p.Pid())
	}
	if args := CommandLine(p.Pid()); len(args) != 4 || args[0] != "/bin/sh" || args[3] != marker {
		t.Errorf("CommandLine(%d) = %q, want /bin/sh -c SCRIPT %s", p.Pid(), args, marker)
	}
	_ = p.Stop(time.Second) // how it ends is TestProcesses' concern
	if got := ProcessesWhere(named); len(got) != 0 {
		t.Errorf("ProcessesWhere(named %s) = %v after the child ended, want none", marker, got)
	}
}

// A Proxy relays until it is cut; a cut resets the connections in relay and refuses new ones
// until Restore.
func TestProxy(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	p, err := StartProxy(echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	roundTrip := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != "ping" {
			return fmt.Errorf("read %q, want ping", buf)
		}
		return nil
	}
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	open := dial()
	if err := roundTrip(open); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.Cut()
	if err := roundTrip(open); err == nil {
		t.Error("a connection in relay still worked after the cut")
	}
	if err := roundTrip(dial()); err == nil {
		t.Error("a new connection worked while the proxy was cut")
	}
	p.Restore()
	if err := roundTrip(dial()); err != nil {
		t.Errorf("a new connection after Restore: %v", err)
	}
}
