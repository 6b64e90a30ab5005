package scheduler

import (
	"fmt"
	"hash/fnv"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Trigger says why a sweep runs. Restart sweeps take priority over the others.
type Trigger string

const (
	// TriggerRestart is a sweep of one driver's volumes on one node after its node plugin restarted.
	TriggerRestart Trigger = "restart"
	// TriggerSchedule is a periodic sweep of one StorageClass's volumes.
	TriggerSchedule Trigger = "schedule"
	// TriggerManual is a sweep an operator asked for.
	TriggerManual Trigger = "manual"
)

// Sweep is one request to look at a set of volumes. The fields that are set select the volumes:
// a restart sweep names a driver and a node, a periodic sweep a StorageClass.
type Sweep struct {
	// Trigger says why the sweep runs.
	Trigger Trigger
	// Driver is the CSI driver whose volumes are swept (restart sweeps).
	Driver string
	// Node is the node whose volumes are swept (restart sweeps).
	Node string
	// StorageClass is the StorageClass whose volumes are swept (periodic and manual sweeps).
	StorageClass string
	// PV is the one PersistentVolume swept (a manual sweep requested on its PVC).
	PV string
	// Requester is the object whose annotation requested a manual sweep; the outcome is recorded
	// on it. Nil for other sweeps.
	Requester client.Object
	// Source is the object that caused the sweep: the CSIAddonsNode of a restart sweep.
	Source types.NamespacedName
	// Marker is the restart marker that a restart sweep handles, or the request value of a manual
	// sweep; recorded on Source (or Requester) when the sweep ends.
	Marker string
	// Stagger spreads the sweep's calls over this window, by node (see StaggerOffset).
	Stagger time.Duration
	// Fired is when the trigger fired.
	Fired time.Time
	// AfterEviction marks the manual sweep of one PV that probes it again after the pods on its
	// dead mount were evicted, so that its dead-mount flag clears once the replacement pods see
	// the repaired mount. It reports what its probe finds and restarts no pods for it: while the
	// evicted pods still stop, their replacements must not be taken for pods on the dead mount.
	// When the volume broke again since and the sweep heals it, the pods that heal leaves on the
	// mount it replaced are restarted as after any heal.
	AfterEviction bool
}

// String names the sweep for logs and Events.
func (s Sweep) String() string {
	switch s.Trigger {
	case TriggerRestart:
		return fmt.Sprintf("restart sweep of %s on node %s (marker %q)", s.Driver, s.Node, s.Marker)
	case TriggerSchedule:
		return fmt.Sprintf("periodic sweep of StorageClass %s", s.StorageClass)
	case TriggerManual:
		switch {
		case s.PV != "":
			return fmt.Sprintf("manual sweep of PV %s", s.PV)
		case s.StorageClass != "":
			return fmt.Sprintf("manual sweep of StorageClass %s", s.StorageClass)
		default:
			return fmt.Sprintf("manual sweep of %s on node %s", s.Driver, s.Node)
		}
	default:
		return fmt.Sprintf("%s sweep", s.Trigger)
	}
}

// StaggerOffset places key (a node name, say) at a stable point inside window, so that a schedule
// that fires for many nodes at once spreads their calls over the window instead of hitting every
// node in the same second. The same key always gets the same offset.
func StaggerOffset(key string, window time.Duration) time.Duration {
	if window <= 0 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return time.Duration(h.Sum64() % uint64(window))
}
