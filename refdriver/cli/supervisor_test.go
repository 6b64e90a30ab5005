package cli

import (
	"bytes"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/driverkit/supervisor"
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
