package mounter_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/refdriver/mounter"
	"github.com/volume-healer/volume-healer/test/harness"
)

// mountLine returns the mountinfo line of the top-most mount at path, or "".
func mountLine(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	line := ""
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && fields[4] == path {
			line = s.Text()
		}
	}
	return line
}

func TestRunServesTheFolder(t *testing.T) {
	harness.RequireRealMounts(t)
	source, target := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(source, "old"), []byte("from the source"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var runErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runErr = mounter.Run(ctx, mounter.Options{Source: source, Target: target, FsName: "test:vol-1", Ready: readyW})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
		for mountLine(t, target) != "" {
			if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
				t.Errorf("detach %s: %v", target, err)
				return
			}
		}
	})

	line, err := bufio.NewReader(readyR).ReadString('\n')
	if err != nil || line != mounter.ReadyLine {
		t.Fatalf("readiness: %q, %v", line, err)
	}
	fields := strings.Fields(mountLine(t, target))
	sep := -1
	for i, f := range fields {
		if f == "-" {
			sep = i
		}
	}
	if sep < 0 || len(fields) < sep+3 || fields[sep+1] != mounter.FSType || fields[sep+2] != "test:vol-1" {
		t.Fatalf("the mount at %s is %q, want type %s and source test:vol-1", target, fields, mounter.FSType)
	}
	if got, err := os.ReadFile(filepath.Join(target, "old")); err != nil || string(got) != "from the source" {
		t.Errorf("read through the mount: %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(target, "new"), []byte("through the mount"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(source, "new")); err != nil || string(got) != "through the mount" {
		t.Errorf("a file written through the mount is not in the source: %q, %v", got, err)
	}

	cancel()
	select {
	case <-done:
		if runErr != nil {
			t.Errorf("Run after cancel = %v, want nil", runErr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context's end")
	}
	if l := mountLine(t, target); l != "" {
		t.Errorf("the mount is still there after Run returned: %s", l)
	}
}

func TestRunRejectsMissingFolders(t *testing.T) {
	dir := t.TempDir()
	tests := map[string]mounter.Options{
		"no source":      {Target: dir},
		"no target":      {Source: dir},
		"missing source": {Source: filepath.Join(dir, "nope"), Target: dir},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			if err := mounter.Run(context.Background(), opts); err == nil {
				t.Errorf("Run(%+v) = nil, want an error", opts)
			}
		})
	}
}
