package driverkit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// reasons returns the findings' reasons, for comparisons.
func reasons(findings []driverkit.Finding) []string {
	var rs []string
	for _, f := range findings {
		rs = append(rs, f.Reason)
	}
	return rs
}

func TestCheck(t *testing.T) {
	requireMounts(t, false)
	root := t.TempDir()

	healthy := mkdir(t, root, "healthy")
	mountTmpfs(t, healthy, 0)
	readOnly := mkdir(t, root, "read-only")
	mountTmpfs(t, readOnly, unix.MS_RDONLY)
	notMounted := mkdir(t, root, "not-mounted")
	stacked := mkdir(t, root, "stacked")
	mountTmpfs(t, stacked, unix.MS_RDONLY)
	mountTmpfs(t, stacked, 0) // a writable mount on top of a read-only one

	tests := map[string]struct {
		path       string
		want       driverkit.Expect
		wantReason []string
		wantStatus csi.VolumeHealthErrorType
	}{
		"healthy tmpfs, nothing expected": {path: healthy},
		"healthy tmpfs, source and type as expected": {
			path: healthy, want: driverkit.Expect{Source: testSource, FSType: "tmpfs"},
		},
		"read-only mount meant read-write": {
			path: readOnly, wantReason: []string{driverkit.ReasonReadOnlyMount}, wantStatus: csi.VolumeHealthErrorType_DEGRADED,
		},
		"read-only mount meant read-only":              {path: readOnly, want: driverkit.Expect{ReadOnly: true}},
		"top-most of two stacked mounts is read-write": {path: stacked},
		"folder without a mount": {
			path: notMounted, wantReason: []string{driverkit.ReasonMountGone}, wantStatus: csi.VolumeHealthErrorType_INACCESSIBLE,
		},
		"missing path": {
			path: filepath.Join(root, "missing"), wantReason: []string{driverkit.ReasonMountGone}, wantStatus: csi.VolumeHealthErrorType_INACCESSIBLE,
		},
		"other mount source": {
			path: healthy, want: driverkit.Expect{Source: "ceph-fuse"},
			wantReason: []string{driverkit.ReasonWrongMountSource}, wantStatus: csi.VolumeHealthErrorType_INACCESSIBLE,
		},
		"other filesystem type": {
			path: healthy, want: driverkit.Expect{FSType: "fuse.ceph-fuse"},
			wantReason: []string{driverkit.ReasonWrongFilesystemType}, wantStatus: csi.VolumeHealthErrorType_INACCESSIBLE,
		},
	}
	c := driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: 5 * time.Second})
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := c.Check(context.Background(), tc.path, tc.want)
			if fmt.Sprint(reasons(got)) != fmt.Sprint(tc.wantReason) {
				t.Fatalf("Check(%s) = %+v, want reasons %v", tc.path, got, tc.wantReason)
			}
			for _, f := range got {
				if f.Status != tc.wantStatus {
					t.Errorf("finding %+v has status %s, want %s", f, f.Status, tc.wantStatus)
				}
				if f.Path != tc.path || !strings.Contains(f.Message, tc.path) {
					t.Errorf("finding %+v does not name the path %s", f, tc.path)
				}
			}
		})
	}
}

func TestCheckDeadFUSEMountIsDisconnected(t *testing.T) {
	requireMounts(t, true)
	mnt := mkdir(t, t.TempDir(), "staging")
	vol := newFUSEVolume(t, mnt)
	c := driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: 5 * time.Second})
	want := driverkit.Expect{Source: testSource, FSType: fuseFSType}

	if got := c.Check(context.Background(), mnt, want); len(got) != 0 {
		t.Fatalf("Check of a served FUSE mount = %+v, want healthy", got)
	}
	vol.killDaemon()
	if err := statfsErr(mnt); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("statfs of a FUSE mount whose daemon was killed: %v, want ENOTCONN", err)
	}
	got := c.Check(context.Background(), mnt, want)
	if len(got) != 1 || got[0].Reason != driverkit.ReasonMountDisconnected || got[0].Status != csi.VolumeHealthErrorType_INACCESSIBLE {
		t.Fatalf("Check of a dead FUSE mount = %+v, want one INACCESSIBLE %s", got, driverkit.ReasonMountDisconnected)
	}
	if !strings.Contains(got[0].Message, "ENOTCONN") || !strings.Contains(got[0].Message, mnt) {
		t.Errorf("message %q should name the path and the errno", got[0].Message)
	}
}

// TestCheckSharesAStatInFlight: a check made while another check's stat of the same mount is
// still within its deadline (a probe and a kubelet call at once, on a mount slow to answer) waits
// for that stat's answer rather than reporting the mount hung: a false MountHung makes a healer
// restart a mounter that works.
func TestCheckSharesAStatInFlight(t *testing.T) {
	requireMounts(t, true)
	dir := t.TempDir()
	mnt := mkdir(t, dir, "staging")
	vol := newFUSEVolume(t, mnt)
	c := driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: 5 * time.Second})
	if got := c.Check(context.Background(), mnt, driverkit.Expect{}); len(got) != 0 {
		t.Fatalf("Check of a served FUSE mount = %+v, want healthy", got)
	}

	// The daemon pauses for a moment, well within the stat timeout.
	vol.signalDaemon(syscall.SIGSTOP)
	started := driverkit.StatsStarted(c)
	results := make(chan []driverkit.Finding, 2)
	go func() { results <- c.Check(context.Background(), mnt, driverkit.Expect{}) }()
	poll.Eventually(t, 5*time.Second, "the first check to start a stat", poll.True(func() bool { return driverkit.StatsStarted(c) != started }))
	go func() { results <- c.Check(context.Background(), mnt, driverkit.Expect{}) }()
	time.Sleep(200 * time.Millisecond)
	vol.signalDaemon(syscall.SIGCONT)

	for range 2 {
		if got := <-results; len(got) != 0 {
			t.Errorf("Check of a mount whose daemon paused for 200ms = %+v, want healthy", got)
		}
	}
	if n := driverkit.StatsStarted(c) - started; n != 1 {
		t.Errorf("two checks at once started %d stat goroutines, want 1", n)
	}
}

func TestCheckHungFUSEMount(t *testing.T) {
	requireMounts(t, true)
	dir := t.TempDir()
	mnt := mkdir(t, dir, "staging")
	vol := newFUSEVolume(t, mnt)
	// A second path of the same mount, as a publish target is.
	target := mkdir(t, dir, "target")
	if err := driverkit.BindMount(mnt, target, false); err != nil {
		t.Fatal(err)
	}
	cleanupMounts(t, target)

	const timeout = 300 * time.Millisecond
	c := driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: timeout})
	// Warm the kernel's attribute cache, which a frozen daemon must not hide.
	if got := c.Check(context.Background(), mnt, driverkit.Expect{}); len(got) != 0 {
		t.Fatalf("Check of a served FUSE mount = %+v, want healthy", got)
	}

	vol.signalDaemon(syscall.SIGSTOP)
	start := time.Now()
	got := c.Check(context.Background(), mnt, driverkit.Expect{})
	took := time.Since(start)
	if len(got) != 1 || got[0].Reason != driverkit.ReasonMountHung || got[0].Status != csi.VolumeHealthErrorType_INACCESSIBLE {
		t.Fatalf("Check of a frozen FUSE mount = %+v, want one INACCESSIBLE %s", got, driverkit.ReasonMountHung)
	}
	if took < timeout || took > timeout+2*time.Second {
		t.Errorf("Check of a frozen mount took %s, want about the stat timeout %s", took, timeout)
	}

	started := driverkit.StatsStarted(c)
	for _, path := range []string{mnt, mnt, target} {
		start := time.Now()
		got := c.Check(context.Background(), path, driverkit.Expect{})
		if len(got) != 1 || got[0].Reason != driverkit.ReasonMountHung || !strings.Contains(got[0].Message, path) {
			t.Fatalf("Check(%s) while a stat is blocked = %+v, want %s naming the path", path, got, driverkit.ReasonMountHung)
		}
		if took := time.Since(start); took > timeout/2 {
			t.Errorf("Check(%s) while a stat of its mount is blocked took %s, want an answer at once", path, took)
		}
	}
	if n := driverkit.StatsStarted(c) - started; n != 0 {
		t.Errorf("checking a mount whose stat is still blocked started %d more stat goroutine(s), want none", n)
	}

	// Once the daemon is gone the blocked stat returns, and the next check tells a dead mount.
	vol.killDaemon()
	poll.Eventually(t, 10*time.Second, "Check after the frozen daemon was killed to find "+driverkit.ReasonMountDisconnected, func() (bool, string) {
		got = c.Check(context.Background(), mnt, driverkit.Expect{})
		return len(got) == 1 && got[0].Reason == driverkit.ReasonMountDisconnected, fmt.Sprintf("%+v", got)
	})
}

func TestCheckCutOffByContext(t *testing.T) {
	requireMounts(t, true)
	mnt := mkdir(t, t.TempDir(), "staging")
	vol := newFUSEVolume(t, mnt)
	c := driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: time.Minute})
	vol.signalDaemon(syscall.SIGSTOP)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	got := c.Check(ctx, mnt, driverkit.Expect{})
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Check with a 200ms deadline took %s", took)
	}
	if len(got) != 1 || got[0].Reason != driverkit.ReasonMountCheckFailed || !strings.Contains(got[0].Message, mnt) {
		t.Fatalf("Check cut off by its context = %+v, want %s naming the path", got, driverkit.ReasonMountCheckFailed)
	}
}

func TestMountDevice(t *testing.T) {
	requireMounts(t, false)
	root := t.TempDir()
	dir := mkdir(t, root, "mnt")
	c := driverkit.NewChecker(driverkit.CheckerOptions{})

	if dev, err := c.MountDevice(dir); err != nil || dev != "" {
		t.Fatalf("MountDevice of a folder without a mount = %q, %v; want \"\"", dev, err)
	}
	mountTmpfs(t, dir, 0)
	lower := statDevice(t, dir)
	if dev, err := c.MountDevice(dir); err != nil || dev != lower {
		t.Fatalf("MountDevice = %q, %v; want the device stat shows, %q", dev, err, lower)
	}
	mountTmpfs(t, dir, 0)
	upper := statDevice(t, dir)
	if upper == lower {
		t.Fatalf("two tmpfs mounts share device %s", upper)
	}
	if dev, err := c.MountDevice(dir); err != nil || dev != upper {
		t.Fatalf("MountDevice of two stacked mounts = %q, %v; want the top-most one's device %q", dev, err, upper)
	}
}

func statDevice(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
}

func TestCheckUnreadableMountTable(t *testing.T) {
	c := driverkit.NewChecker(driverkit.CheckerOptions{MountInfo: filepath.Join(t.TempDir(), "no-such-mountinfo")})
	got := c.Check(context.Background(), os.TempDir(), driverkit.Expect{})
	if len(got) != 1 || got[0].Reason != driverkit.ReasonMountCheckFailed {
		t.Fatalf("Check with an unreadable mount table = %+v, want %s", got, driverkit.ReasonMountCheckFailed)
	}
	if _, err := c.MountDevice(os.TempDir()); err == nil {
		t.Error("MountDevice with an unreadable mount table succeeded")
	}
}
