package fuseconn_test

import (
	"bufio"
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit/fuseconn"
	"github.com/volume-healer/volume-healer/test/harness"
)

// mountFields returns the fields of the mountinfo line of the top-most mount at path, or nil.
func mountFields(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var line []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && fields[4] == path {
			line = fields
		}
	}
	return line
}

// detach takes every mount at target down.
func detach(t *testing.T, target string) {
	t.Helper()
	for mountFields(t, target) != nil {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			t.Errorf("detach %s: %v", target, err)
			return
		}
	}
}

func TestMountShowsTypeAndSource(t *testing.T) {
	harness.RequireRealMounts(t)
	target := t.TempDir()
	dev, err := fuseconn.Mount(target, fuseconn.MountOptions{Subtype: "fuseconntest", FsName: "test:vol-1", AllowOther: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		detach(t, target)
		_ = dev.Close()
	})
	fields := mountFields(t, target)
	sep := -1
	for i, f := range fields {
		if f == "-" {
			sep = i
		}
	}
	if sep < 0 || len(fields) < sep+4 || fields[sep+1] != "fuse.fuseconntest" || fields[sep+2] != "test:vol-1" {
		t.Fatalf("the mount at %s is %q, want type fuse.fuseconntest and source test:vol-1", target, fields)
	}
	for _, opt := range []string{"allow_other", "user_id=0", "group_id=0"} {
		if !strings.Contains(fields[sep+3], opt) {
			t.Errorf("super options %q lack %s", fields[sep+3], opt)
		}
	}
}

func TestMountRejectsBadOptions(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/file"
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		target string
		opts   fuseconn.MountOptions
	}{
		"no subtype":        {dir, fuseconn.MountOptions{}},
		"comma in subtype":  {dir, fuseconn.MountOptions{Subtype: "a,b"}},
		"comma in fsname":   {dir, fuseconn.MountOptions{Subtype: "a", FsName: "x,allow_other"}},
		"negative max read": {dir, fuseconn.MountOptions{Subtype: "a", MaxRead: -1}},
		"target not folder": {file, fuseconn.MountOptions{Subtype: "a"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev, err := fuseconn.Mount(tc.target, tc.opts)
			if err == nil {
				_ = dev.Close()
				detach(t, tc.target)
				t.Fatalf("Mount(%s, %+v) = nil error", tc.target, tc.opts)
			}
			if !errors.Is(err, fuseconn.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.target) {
				t.Errorf("Mount(%s, %+v) = %v, want ErrInvalidOptions naming the target", tc.target, tc.opts, err)
			}
		})
	}
}
