package mounter_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit/fuseconn"
	"github.com/volume-healer/volume-healer/refdriver/cli"
	"github.com/volume-healer/volume-healer/refdriver/mounter"
	"github.com/volume-healer/volume-healer/test/harness"
)

// childEnv makes the test binary run as `refdriver` with its arguments instead of as tests: the
// keep-mode tests start their mounters so, to kill them as processes.
const childEnv = "MOUNTER_TEST_RUN_REFDRIVER"

// workloadEnv makes the test binary run the workload on the mount at its value, as a process
// of its own: a process that holds files of a FUSE mount must not fork the mount's server, whose
// exec closes its copies of those files and so waits for a FLUSH only that server would answer.
const workloadEnv = "MOUNTER_TEST_RUN_WORKLOAD"

func TestMain(m *testing.M) {
	if target := os.Getenv(workloadEnv); target != "" {
		os.Exit(runWorkload(target))
	}
	if os.Getenv(childEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "refdriver:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// keptMount is a FUSE mount the test holds the device of, served by keep-mode mounters.
type keptMount struct {
	source, target, state string
	dev                   *os.File
}

func newKeptMount(t *testing.T) *keptMount {
	t.Helper()
	harness.RequireRealMounts(t)
	k := &keptMount{source: t.TempDir(), target: t.TempDir(), state: filepath.Join(t.TempDir(), "state")}
	dev, err := fuseconn.Mount(k.target, fuseconn.MountOptions{Subtype: mounter.Name, FsName: "test:kept", AllowOther: true})
	if err != nil {
		t.Fatal(err)
	}
	k.dev = dev
	t.Cleanup(func() {
		for mountLine(t, k.target) != "" {
			if err := unix.Unmount(k.target, unix.MNT_DETACH); err != nil {
				t.Errorf("detach %s: %v", k.target, err)
				break
			}
		}
		_ = dev.Close()
	})
	return k
}

// mounterProc is a keep-mode mounter process.
type mounterProc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	stderr *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// start starts `refdriver mounter` in keep mode on the mount's device and waits until it is
// ready; it fails the test when the mounter exits first.
func (k *keptMount) start(t *testing.T, takeover bool) *mounterProc {
	t.Helper()
	p, ready := k.spawn(t, takeover)
	select {
	case line := <-ready:
		if line != mounter.ReadyLine {
			t.Fatalf("mounter readiness: %q; stderr:\n%s", line, p.stderr)
		}
	case <-p.done:
		t.Fatalf("the mounter exited before it was ready: %v; stderr:\n%s", p.err, p.stderr)
	case <-time.After(20 * time.Second):
		t.Fatalf("the mounter was not ready within 20s; stderr:\n%s", p.stderr)
	}
	return p
}

func (k *keptMount) spawn(t *testing.T, takeover bool) (*mounterProc, <-chan string) {
	t.Helper()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"mounter", "--source", k.source, "--fuse-fd", "3", "--state-dir", k.state, "--ready-fd", "4", "--fsname", "test:kept"}
	if takeover {
		args = append(args, "--takeover")
	}
	p := &mounterProc{cmd: exec.Command(os.Args[0], args...), done: make(chan struct{}), stderr: &lockedBuffer{}}
	// A race-enabled build sleeps a second at exit (GORACE atexit_sleep_ms) before it exits, which
	// a graceful handover's stall would report as the mounter's; refdriver as shipped does not.
	p.cmd.Env = append(os.Environ(), childEnv+"=1", "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	p.cmd.ExtraFiles = []*os.File{k.dev, readyW}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = readyW.Close()
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(readyR).ReadString('\n')
		_ = readyR.Close()
		ready <- line
	}()
	return p, ready
}

// workloadResult is what the workload process reports on its stdout when it ends.
type workloadResult struct {
	Fails   []string
	Stalls  []time.Duration
	Written int
	Lookups int64
	Ino     [2]uint64
}

const (
	recordFormat = "record %08d\n"
	recordSize   = len("record 00000000\n")
	lookupFiles  = 5
)

// runWorkload is what a pod does on the mount at target: one writer keeps a file open for the
// whole run and writes and fsyncs a record through it every 20 ms; one reader holds a folder
// open and looks files up through it (fstatat, openat). It runs until its stdin closes, then
// writes a workloadResult to stdout.
func runWorkload(target string) int {
	var (
		mu  sync.Mutex
		res workloadResult
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		res.Fails = append(res.Fails, fmt.Sprintf(format, args...))
	}
	f, err := os.OpenFile(filepath.Join(target, "log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dirfd, err := unix.Open(filepath.Join(target, "dir"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	res.Ino[0] = st.Ino
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	fmt.Println("started")
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-stop:
				var st unix.Stat_t
				if err := unix.Fstat(int(f.Fd()), &st); err != nil {
					fail("fstat of the held file: %v", err)
				}
				if err := f.Close(); err != nil {
					fail("close of the held file: %v", err)
				}
				mu.Lock()
				res.Ino[1] = st.Ino
				mu.Unlock()
				return
			case <-tick.C:
			}
			start := time.Now()
			_, err := fmt.Fprintf(f, recordFormat, n)
			if err == nil {
				err = f.Sync()
			}
			d := time.Since(start)
			mu.Lock()
			res.Stalls = append(res.Stalls, d)
			if err == nil {
				res.Written = n + 1
			}
			mu.Unlock()
			if err != nil {
				fail("write+fsync of record %d: %v", n, err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		defer func() { _ = unix.Close(dirfd) }()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			name := fmt.Sprintf("file-%d", n%lookupFiles)
			var st unix.Stat_t
			if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				fail("fstatat %s: %v", name, err)
				continue
			}
			fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				fail("openat %s: %v", name, err)
				continue
			}
			buf := make([]byte, 16)
			if n, err := unix.Read(fd, buf); err != nil || string(buf[:max(n, 0)]) != "content" {
				fail("read %s: %q, %v", name, buf[:max(n, 0)], err)
			}
			if err := unix.Close(fd); err != nil {
				fail("close %s: %v", name, err)
			}
			mu.Lock()
			res.Lookups++
			mu.Unlock()
		}
	}()
	wg.Wait()
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// workload is the workload process.
type workload struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startWorkload(t *testing.T, target string) *workload {
	t.Helper()
	if err := os.Mkdir(filepath.Join(target, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range lookupFiles {
		if err := os.WriteFile(filepath.Join(target, "dir", fmt.Sprintf("file-%d", i)), []byte("content"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), workloadEnv+"="+target)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	w := &workload{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	if line, err := w.out.ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("the workload did not start: %q, %v", line, err)
	}
	return w
}

// finish stops the workload and checks what a user would: no failed call, every record written
// is in the file in order, and the held file kept its inode number. It returns the stalls of the
// writes.
func (w *workload) finish(t *testing.T, source string) []time.Duration {
	t.Helper()
	_ = w.stdin.Close()
	var res workloadResult
	if err := json.NewDecoder(w.out).Decode(&res); err != nil {
		t.Fatalf("the workload's result: %v", err)
	}
	if err := w.cmd.Wait(); err != nil {
		t.Errorf("the workload exited with %v", err)
	}
	for _, f := range res.Fails {
		t.Errorf("failed syscall: %s", f)
	}
	if res.Ino[0] != res.Ino[1] {
		t.Errorf("the held file's inode number changed from %d to %d", res.Ino[0], res.Ino[1])
	}
	if res.Lookups == 0 {
		t.Error("the folder workload looked nothing up")
	}
	if res.Written == 0 {
		t.Fatal("the workload wrote nothing")
	}
	data, err := os.ReadFile(filepath.Join(source, "log"))
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != res.Written*recordSize {
		t.Errorf("the file holds %d bytes, want %d records of %d bytes", len(data), res.Written, recordSize)
	}
	for i := range res.Written {
		if i*recordSize+recordSize > len(data) {
			break
		}
		if got, want := string(data[i*recordSize:(i+1)*recordSize]), fmt.Sprintf(recordFormat, i); got != want {
			t.Errorf("record %d reads back as %q, want %q", i, got, want)
			break
		}
	}
	return res.Stalls
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func TestKeepModeSurvivesAMounterRestart(t *testing.T) {
	tests := map[string]struct {
		stop func(t *testing.T, p *mounterProc)
	}{
		"kill -9": {stop: func(t *testing.T, p *mounterProc) {
			if err := p.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-p.done
		}},
		"SIGTERM": {stop: func(t *testing.T, p *mounterProc) {
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				t.Fatalf("the mounter did not stop within 10s of SIGTERM; stderr:\n%s", p.stderr)
			}
			if p.err != nil {
				t.Errorf("the mounter exited with %v after SIGTERM, want 0; stderr:\n%s", p.err, p.stderr)
			}
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			k := newKeptMount(t)
			first := k.start(t, false)
			w := startWorkload(t, k.target)
			time.Sleep(time.Second)
			tc.stop(t, first)
			if mountLine(t, k.target) == "" {
				t.Fatal("the mount went away with its mounter")
			}
			k.start(t, true)
			time.Sleep(2 * time.Second)
			stalls := w.finish(t, k.source)
			t.Logf("%s: %d writes+fsyncs, stall p50 %s, p99 %s, max %s", name, len(stalls),
				percentile(stalls, 0.5), percentile(stalls, 0.99), slices.Max(stalls))
		})
	}
}

// blockingHandler holds the first LOOKUP of name until release is closed, as a mounter that is
// killed while it serves a request.
type blockingHandler struct {
	next    fuseconn.Handler
	name    string
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockingHandler) Handle(r *fuseconn.Request) {
	if r.Header.Opcode == fuseconn.OpLookup {
		if names, err := fuseconn.Names(r.Body(), 1); err == nil && names[0] == b.name {
			blocked := false
			b.once.Do(func() { blocked = true })
			if blocked {
				close(b.held)
				<-b.release
			}
		}
	}
	b.next.Handle(r)
}

// resentRecorder notes the requests it saw resent.
type resentRecorder struct {
	next   fuseconn.Handler
	resent atomic.Int64
}

func (rr *resentRecorder) Handle(r *fuseconn.Request) {
	if r.Resent() {
		rr.resent.Add(1)
	}
	rr.next.Handle(r)
}

func TestTakeoverAnswersARequestTheLastServerHeld(t *testing.T) {
	k := newKeptMount(t)
	if err := os.WriteFile(filepath.Join(k.source, "slow"), []byte("late but there"), 0o644); err != nil {
		t.Fatal(err)
	}
	state, err := fuseconn.OpenState(k.state, fuseconn.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	block := &blockingHandler{next: mounter.NewLoopback(k.source, state, time.Second), name: "slow", held: make(chan struct{}), release: make(chan struct{})}
	ctxA, stopA := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	readyA := make(chan struct{})
	// The first server stops reading some time after its context ends: a read in progress may
	// still return a request. The takeover must wait for that, as a server that took over waits
	// for the one before it to be gone, or the first server could read the resent request itself.
	stoppedA := make(chan struct{})
	var stopping sync.Once
	logA := funcr.New(func(_, args string) {
		if strings.Contains(args, "no more requests are read") {
			stopping.Do(func() { close(stoppedA) })
		}
	}, funcr.Options{})
	go func() {
		doneA <- fuseconn.Serve(ctxA, k.dev, fuseconn.Options{State: state, Handler: block, Logger: logA, Ready: func(fuseconn.InitParams) { close(readyA) }})
	}()
	t.Cleanup(func() {
		stopA()
		select {
		case <-block.release:
			return // the test waited for it
		default:
			close(block.release)
		}
		<-doneA
	})
	<-readyA

	statDone := make(chan error, 1)
	go func() {
		// Plain system calls: os.Open would register the file with the runtime's poller, whose
		// epoll_ctl waits for a FUSE_POLL answer that this process's own server, blocked on the
		// same poller, cannot give.
		fd, err := unix.Open(filepath.Join(k.target, "slow"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			statDone <- err
			return
		}
		defer func() { _ = unix.Close(fd) }()
		buf := make([]byte, 64)
		n, err := unix.Read(fd, buf)
		if err == nil && string(buf[:n]) != "late but there" {
			err = fmt.Errorf("read %q", buf[:n])
		}
		statDone <- err
	}()
	select {
	case <-block.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the lookup of slow did not reach the server")
	}
	// The first server stops reading and never answers what it holds, as if killed.
	stopA()
	select {
	case <-stoppedA:
	case <-time.After(10 * time.Second):
		t.Fatal("the first server did not stop reading within 10s of its context's end")
	}

	stateB, err := fuseconn.OpenState(k.state, fuseconn.StateOptions{Takeover: true})
	if err != nil {
		t.Fatal(err)
	}
	p, ok := stateB.Init()
	if !ok || !p.CanResend() {
		t.Fatalf("INIT parameters %+v (recorded %v): this kernel cannot resend, but the test machine has Linux 6.9 or later", p, ok)
	}
	rec := &resentRecorder{next: mounter.NewLoopback(k.source, stateB, time.Second)}
	ctxB, stopB := context.WithCancel(context.Background())
	doneB := make(chan error, 1)
	go func() {
		doneB <- fuseconn.Serve(ctxB, k.dev, fuseconn.Options{State: stateB, Handler: rec, Takeover: true})
	}()
	select {
	case err := <-statDone:
		if err != nil {
			t.Errorf("the held read failed after the takeover: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the held lookup did not complete within 10s of the takeover")
	}
	if rec.resent.Load() == 0 {
		t.Error("the new server saw no resent request")
	}
	// The first server answers what it held only now: the kernel, which had it answered by the
	// second, drops that answer.
	close(block.release)
	if err := <-doneA; err != nil {
		t.Errorf("the first server's Serve = %v after its context ended, want nil", err)
	}
	stopB()
	if err := <-doneB; err != nil {
		t.Errorf("the second server's Serve = %v after its context ended, want nil", err)
	}
}

func TestTakeoverWithoutUsableStateFails(t *testing.T) {
	dir := t.TempDir()
	corrupt := filepath.Join(dir, "corrupt")
	if err := os.MkdirAll(corrupt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(corrupt, "fuseconn.journal"), []byte("not a journal\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dev.Close() }()
	for name, stateDir := range map[string]string{"missing": filepath.Join(dir, "missing"), "corrupt": corrupt} {
		t.Run(name, func(t *testing.T) {
			err := mounter.Keep(context.Background(), mounter.KeepOptions{Source: dir, Device: dev, StateDir: stateDir, Takeover: true})
			if !errors.Is(err, fuseconn.ErrState) || !strings.Contains(err.Error(), stateDir) {
				t.Errorf("Keep with state %s = %v, want ErrState naming the directory", stateDir, err)
			}
		})
	}
}

func TestKeepModeServesAFileSystemAcrossATakeover(t *testing.T) {
	k := newKeptMount(t)
	first := k.start(t, false)
	in := func(name string) string { return filepath.Join(k.target, name) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(in("d"), 0o750))
	must(os.WriteFile(in("d/f"), []byte("0123456789"), 0o600))
	must(os.Truncate(in("d/f"), 4))
	must(os.Chmod(in("d/f"), 0o640))
	when := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must(os.Chtimes(in("d/f"), when, when))
	must(os.Symlink("f", in("d/s")))
	must(os.Link(in("d/f"), in("d/hard")))
	must(os.Rename(in("d"), in("moved")))
	must(os.WriteFile(in("gone"), nil, 0o600))
	must(os.Remove(in("gone")))
	must(os.Mkdir(in("empty"), 0o700))
	must(os.Remove(in("empty")))
	for i := range 20 {
		must(os.WriteFile(in(fmt.Sprintf("moved/many-%02d", i)), nil, 0o600))
	}

	fi, err := os.Stat(in("moved/f"))
	must(err)
	if fi.Size() != 4 || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(when) {
		t.Errorf("moved/f: size %d, mode %s, mtime %s; want 4, 0640, %s", fi.Size(), fi.Mode(), fi.ModTime(), when)
	}
	if target, err := os.Readlink(in("moved/s")); err != nil || target != "f" {
		t.Errorf("readlink moved/s = %q, %v", target, err)
	}
	inoBefore := fi.Sys().(*syscall.Stat_t).Ino
	if src, err := os.Stat(filepath.Join(k.source, "moved/f")); err != nil || src.Sys().(*syscall.Stat_t).Ino != inoBefore {
		t.Errorf("moved/f reports inode %d, the backing file has %v (%v)", inoBefore, src, err)
	}
	var sfs unix.Statfs_t
	must(unix.Statfs(k.target, &sfs))
	if sfs.Blocks == 0 {
		t.Error("statfs reports no blocks")
	}

	// A folder held open across the takeover, half read. Folders take no FLUSH, so the mounter's
	// start (a fork of this process) does not wait on it.
	dirfd, err := unix.Open(in("moved"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(err)
	defer func() { _ = unix.Close(dirfd) }()
	buf := make([]byte, 256) // a few entries per call
	n, err := unix.Getdents(dirfd, buf)
	must(err)
	names := direntNames(buf[:n])

	must(first.cmd.Process.Kill())
	<-first.done
	k.start(t, true)

	for {
		n, err := unix.Getdents(dirfd, buf)
		must(err)
		if n == 0 {
			break
		}
		names = append(names, direntNames(buf[:n])...)
	}
	slices.Sort(names)
	want := []string{".", "..", "f", "hard", "s"}
	for i := range 20 {
		want = append(want, fmt.Sprintf("many-%02d", i))
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("the folder read across the takeover lists %q, want %q", names, want)
	}
	after, err := os.Stat(in("moved/f"))
	must(err)
	if got := after.Sys().(*syscall.Stat_t).Ino; got != inoBefore {
		t.Errorf("moved/f has inode %d after the takeover, %d before", got, inoBefore)
	}
	if data, err := os.ReadFile(in("moved/hard")); err != nil || string(data) != "0123" {
		t.Errorf("read moved/hard after the takeover: %q, %v", data, err)
	}
}

// direntNames returns the names in a getdents buffer.
func direntNames(buf []byte) []string {
	var names []string
	for len(buf) >= 19 {
		reclen := int(buf[16]) | int(buf[17])<<8
		if reclen == 0 || reclen > len(buf) {
			break
		}
		name := buf[19:reclen]
		if i := slices.Index(name, 0); i >= 0 {
			name = name[:i]
		}
		names = append(names, string(name))
		buf = buf[reclen:]
	}
	return names
}
