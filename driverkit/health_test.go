package driverkit_test

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/volume-healer/volume-healer/driverkit"
)

func TestHealth(t *testing.T) {
	const (
		inaccessible = csi.VolumeHealthErrorType_INACCESSIBLE
		degraded     = csi.VolumeHealthErrorType_DEGRADED
		dataLoss     = csi.VolumeHealthErrorType_DATA_LOSS
	)
	type entry struct {
		status  csi.VolumeHealthErrorType
		reason  string
		message string
	}
	tests := map[string]struct {
		findings []driverkit.Finding
		want     []entry
	}{
		"no findings are healthy": {},
		"one finding": {
			findings: []driverkit.Finding{{Path: "/s", Status: inaccessible, Reason: driverkit.ReasonMountGone, Message: "nothing is mounted at /s"}},
			want:     []entry{{inaccessible, driverkit.ReasonMountGone, "nothing is mounted at /s"}},
		},
		"findings of one status and reason merge, in order, naming each path": {
			findings: []driverkit.Finding{
				{Path: "/s", Status: inaccessible, Reason: driverkit.ReasonMountDisconnected, Message: "/s is disconnected"},
				{Path: "/p1", Status: inaccessible, Reason: driverkit.ReasonMountDisconnected, Message: "/p1 is disconnected"},
				{Path: "/p2", Status: inaccessible, Reason: driverkit.ReasonMountDisconnected, Message: "the mounter died"},
			},
			want: []entry{{inaccessible, driverkit.ReasonMountDisconnected, "/s is disconnected; /p1 is disconnected; /p2: the mounter died"}},
		},
		"entries sorted by status, then reason": {
			findings: []driverkit.Finding{
				{Status: dataLoss, Reason: driverkit.ReasonDataLoss, Message: "the data is gone"},
				{Path: "/p", Status: inaccessible, Reason: driverkit.ReasonMountGone, Message: "nothing is mounted at /p"},
				{Path: "/s", Status: degraded, Reason: driverkit.ReasonReadOnlyMount, Message: "/s is read-only"},
				{Path: "/s", Status: inaccessible, Reason: driverkit.ReasonMountDisconnected, Message: "/s is disconnected"},
			},
			want: []entry{
				{degraded, driverkit.ReasonReadOnlyMount, "/s is read-only"},
				{inaccessible, driverkit.ReasonMountDisconnected, "/s is disconnected"},
				{inaccessible, driverkit.ReasonMountGone, "nothing is mounted at /p"},
				{dataLoss, driverkit.ReasonDataLoss, "the data is gone"},
			},
		},
		"repeated messages appear once": {
			findings: []driverkit.Finding{
				{Path: "/s", Status: inaccessible, Reason: driverkit.ReasonMountHung, Message: "/s does not answer"},
				{Path: "/s", Status: inaccessible, Reason: driverkit.ReasonMountHung, Message: "/s does not answer"},
			},
			want: []entry{{inaccessible, driverkit.ReasonMountHung, "/s does not answer"}},
		},
		"a finding without status is never sent as UNKNOWN": {
			findings: []driverkit.Finding{{Path: "/s", Reason: "DriverSaysSo", Message: "/s is odd"}},
			want:     []entry{{inaccessible, "DriverSaysSo", "/s is odd"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := driverkit.Health(tc.findings)
			if len(got) != len(tc.want) {
				t.Fatalf("Health = %v, want %d entries", got, len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.GetStatus() != w.status || g.GetReason() != w.reason || g.GetMessage() != w.message {
					t.Errorf("entry %d = %s/%s %q, want %s/%s %q", i, g.GetStatus(), g.GetReason(), g.GetMessage(), w.status, w.reason, w.message)
				}
			}
		})
	}
}
