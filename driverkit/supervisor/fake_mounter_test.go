package supervisor_test

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The fake mounter is this test binary, started by the supervisor with fakeMounterEnv set: it
// checks that it got a /dev/fuse descriptor, appends its command line to <dir>/starts, behaves
// as <dir>/mode says, and appends "term" to <dir>/starts when SIGTERM stops it. It serves no
// FUSE request: the tests here are about holding connections and running mounters; the
// end-to-end tests run the real mounter.
const fakeMounterEnv = "SUPERVISOR_TEST_FAKE_MOUNTER"

// The fake mounter's modes.
const (
	// modeReady writes the ready line and waits for SIGTERM.
	modeReady = "ready"
	// modeNever never writes the ready line.
	modeNever = "never"
	// modeDie writes the ready line and exits with status 1 after 50 ms.
	modeDie = "die"
)

func runFakeMounter(dir string) int {
	if target, err := os.Readlink("/proc/self/fd/4"); err != nil || target != "/dev/fuse" {
		fmt.Fprintf(os.Stderr, "fake mounter: descriptor 4 is %q (%v), not /dev/fuse\n", target, err)
		return 2
	}
	appendLine(filepath.Join(dir, "starts"), strings.Join(os.Args[1:], " "))
	mode, _ := os.ReadFile(filepath.Join(dir, "mode"))
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	switch strings.TrimSpace(string(mode)) {
	case modeNever:
		<-term
		return 0
	case modeDie:
		ready()
		time.Sleep(50 * time.Millisecond)
		return 1
	default:
		ready()
		<-term
		appendLine(filepath.Join(dir, "starts"), "term")
		return 0
	}
}

func ready() {
	f := os.NewFile(3, "ready")
	_, _ = f.WriteString("ready\n")
	_ = f.Close()
}

func appendLine(file, line string) {
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }()
	_, _ = f.WriteString(line + "\n")
}
