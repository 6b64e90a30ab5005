package fuseconn_test

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit/fuseconn"
	"github.com/volume-healer/volume-healer/test/harness"
)

// tinyFS serves an empty root folder; a lookup of "panic" panics, and one of "silent" returns
// without an answer.
type tinyFS struct{}

func (tinyFS) Handle(r *fuseconn.Request) {
	switch r.Header.Opcode {
	case fuseconn.OpGetattr:
		out := fuse.AttrOut{Attr: fuse.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o755, Nlink: 2}}
		r.Reply(fuseconn.Bytes(&out))
	case fuseconn.OpLookup:
		names, err := fuseconn.Names(r.Body(), 1)
		if err != nil {
			r.Fail(syscall.EIO)
			return
		}
		switch names[0] {
		case "panic":
			panic("a handler bug")
		case "silent":
			return
		}
		r.Fail(syscall.ENOENT)
	default:
		r.Fail(syscall.ENOSYS)
	}
}

func TestServeSurvivesItsHandler(t *testing.T) {
	harness.RequireRealMounts(t)
	target := t.TempDir()
	dev, err := fuseconn.Mount(target, fuseconn.MountOptions{Subtype: "fuseconntest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		detach(t, target)
		_ = dev.Close()
	})
	state, err := fuseconn.OpenState(t.TempDir(), fuseconn.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var serveErr error
	ready := make(chan fuseconn.InitParams, 1)
	go func() {
		defer close(done)
		serveErr = fuseconn.Serve(ctx, dev, fuseconn.Options{State: state, Handler: tinyFS{}, Ready: func(p fuseconn.InitParams) { ready <- p }})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case p := <-ready:
		if p.MaxWrite == 0 || p.Minor < 31 {
			t.Errorf("INIT parameters %+v", p)
		}
	case <-done:
		t.Fatalf("Serve = %v before it was ready", serveErr)
	}
	// Plain system calls only: the runtime's poller must not wait on this process's own mount.
	tests := map[string]syscall.Errno{"panic": syscall.EIO, "silent": syscall.EIO, "missing": syscall.ENOENT}
	for name, want := range tests {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(target, name), &st); !errors.Is(err, want) {
			t.Errorf("lstat %s = %v, want %v", name, err, want)
		}
	}
	if err := unix.Mkdir(filepath.Join(target, "d"), 0o755); !errors.Is(err, syscall.ENOSYS) {
		t.Errorf("mkdir on a handler without MKDIR = %v, want ENOSYS", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); !errors.Is(err, syscall.ENOSYS) && err != nil {
		t.Errorf("statfs = %v", err)
	}
	cancel()
	select {
	case <-done:
		if serveErr != nil {
			t.Errorf("Serve after its context ended = %v, want nil", serveErr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not stop within 10s of its context's end")
	}
	if mountFields(t, target) == nil {
		t.Error("the mount went away when its server stopped")
	}
}
