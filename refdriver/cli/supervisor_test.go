package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/driverkit/supervisor"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

func TestPrintStatus(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	st := supervisor.Status{
		Instance: "sup-b", PID: 42, State: supervisor.ServerServing, TookOverFrom: "sup-a", MaxMounts: 64,
		Volumes: []supervisor.VolumeStatus{
			{MountRequest: supervisor.MountRequest{Volume: "vol-1", Target: "/staging/vol-1"}, State: supervisor.StateRunning, MounterPID: 100,
				Restarts: 2, Since: now.Add(-90 * time.Second), Connection: 57, Waiting: 3},
			{MountRequest: supervisor.MountRequest{Volume: "vol-2", Target: "/staging/vol-2"}, State: supervisor.StateFailed,
				Since: now.Add(-time.Hour), Connection: 58, Waiting: -1, LastError: "the mounter (PID 7) exited: exit status 1"},
		},
		Unheld: []supervisor.UnheldMount{{Target: "/staging/old", FsName: "healer.example.com:vol-9:ab", Connection: 12}},
	}
	var b bytes.Buffer
	if err := printStatus(&b, st, now); err != nil {
		t.Fatal(err)
	}
	want := `supervisor sup-b (PID 42): serving, took over from sup-a, 2 of at most 64 mounts
VOLUME  TARGET          STATE    MOUNTER PID  RESTARTS  SINCE       CONNECTION  WAITING  LAST ERROR
vol-1   /staging/vol-1  running  100          2         1m30s ago   57          3        
vol-2   /staging/vol-2  failed   -            0         1h0m0s ago  58          -        the mounter (PID 7) exited: exit status 1

1 mount(s) of the driver's type that nobody holds (dead, not adopted):
TARGET        FSNAME                       CONNECTION
/staging/old  healer.example.com:vol-9:ab  12
`
	if got := b.String(); got != want {
		t.Errorf("printStatus:\n%s\nwant:\n%s", got, want)
	}
}

// TestSupervisorReadiness checks `supervisor status --ready` against a running supervisor: ready
// for its own instance name only.
func TestSupervisorReadiness(t *testing.T) {
	dir, err := os.MkdirTemp("", "svcli") // a socket path must fit in 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	socket := filepath.Join(dir, "s.sock")
	s, err := supervisor.New(supervisor.Options{StateDir: filepath.Join(dir, "state"), Socket: socket, Instance: "sup-a",
		MounterCommand: []string{"/nonexistent/mounter"}, Subtype: "clitest"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	poll.Eventually(t, 10*time.Second, "the supervisor serving", func() (bool, string) {
		_, err := supervisor.NewClient(socket, time.Second).Status(context.Background())
		return err == nil, fmt.Sprint(err)
	})
	if err := run(t, []string{"supervisor", "status", "--socket", socket, "--ready", "--instance", "sup-a"}, io.Discard); err != nil {
		t.Errorf("--ready for the serving instance = %v, want nil", err)
	}
	err = run(t, []string{"supervisor", "status", "--socket", socket, "--ready", "--instance", "sup-b"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "served by sup-a (serving), not by sup-b") {
		t.Errorf("--ready for another instance = %v, want an error naming both", err)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"supervisor", "status", "--socket", socket}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "supervisor sup-a (PID ") || !strings.Contains(out.String(), "serving, 0 of at most 64 mounts") {
		t.Errorf("status printed:\n%s", out.String())
	}
}
