package healer

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/probe"
)

// ErrNodeGone says that the Node a sidecar target was registered for no longer exists: its
// CSIAddonsNodes may outlive it, but no sidecar serves there.
var ErrNodeGone = errors.New("node is gone")

// TargetMap resolves the sidecar of a driver on a node from the CSIAddonsNodes that the informer
// hands it. Where two CSIAddonsNodes describe the same driver and node (a csi-addons sidecar's and
// one created by the healer sidecar), the freshest registration wins (see fresher). A node that
// NodeExists says is gone has no target.
type TargetMap struct {
	mu    sync.RWMutex
	nodes map[types.NamespacedName]*csiaddonsv1alpha1.CSIAddonsNode
	// byDriverNode points at the keys of nodes, per "driver/node".
	byDriverNode map[string]map[types.NamespacedName]bool
	// nodeExists says whether a Node exists; nil: every node does.
	nodeExists func(node string) bool
}

var _ Targets = (*TargetMap)(nil)

// NewTargetMap returns an empty TargetMap.
func NewTargetMap() *TargetMap {
	return &TargetMap{nodes: map[types.NamespacedName]*csiaddonsv1alpha1.CSIAddonsNode{}, byDriverNode: map[string]map[types.NamespacedName]bool{}}
}

// SetNodeExists makes the map check Nodes: a CSIAddonsNode whose Node exists says is gone is not
// kept, and a node that exists says is gone has no target. exists must say true for a node it does
// not know yet (the Node cache has not synced): only a Node known to be gone takes its targets.
func (m *TargetMap) SetNodeExists(exists func(node string) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nodeExists = exists
}

// goneLocked reports whether node is known to be gone.
func (m *TargetMap) goneLocked(node string) bool {
	return m.nodeExists != nil && !m.nodeExists(node)
}

// Set records a created or changed CSIAddonsNode. It returns the sidecar endpoint the object named
// before, when that changed (the node plugin pod moved or restarted with a new IP) or the object's
// Node is gone, so that the caller can drop the connection to it.
func (m *TargetMap) Set(n *csiaddonsv1alpha1.CSIAddonsNode) (staleEndpoint string) {
	key := types.NamespacedName{Namespace: n.Namespace, Name: n.Name}
	m.mu.Lock()
	defer m.mu.Unlock()
	gone := m.goneLocked(n.Spec.Driver.NodeID)
	if old, ok := m.nodes[key]; ok {
		before, errBefore := probe.TargetFor(old)
		after, errAfter := probe.TargetFor(n)
		if errBefore == nil && (gone || errAfter != nil || before.Endpoint != after.Endpoint) {
			staleEndpoint = before.Endpoint
		}
	}
	m.removeLocked(key)
	if gone {
		// The CSIAddonsNode of a Node deleted before the controller started, or updated since.
		return staleEndpoint
	}
	m.nodes[key] = n
	dn := n.Spec.Driver.Name + "/" + n.Spec.Driver.NodeID
	if m.byDriverNode[dn] == nil {
		m.byDriverNode[dn] = map[types.NamespacedName]bool{}
	}
	m.byDriverNode[dn][key] = true
	return staleEndpoint
}

// Delete forgets a deleted CSIAddonsNode and returns the endpoint it named, if any.
func (m *TargetMap) Delete(key types.NamespacedName) (endpoint string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.nodes[key]; ok {
		if t, err := probe.TargetFor(old); err == nil {
			endpoint = t.Endpoint
		}
	}
	m.removeLocked(key)
	return endpoint
}

func (m *TargetMap) removeLocked(key types.NamespacedName) {
	old, ok := m.nodes[key]
	if !ok {
		return
	}
	dn := old.Spec.Driver.Name + "/" + old.Spec.Driver.NodeID
	delete(m.byDriverNode[dn], key)
	if len(m.byDriverNode[dn]) == 0 {
		delete(m.byDriverNode, dn)
	}
	delete(m.nodes, key)
}

// Object returns the CSIAddonsNode recorded under key, whether or not it names a usable endpoint.
func (m *TargetMap) Object(key types.NamespacedName) (*csiaddonsv1alpha1.CSIAddonsNode, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n, ok := m.nodes[key]
	return n, ok
}

// Target returns the sidecar of driver on node and the CSIAddonsNode it was read from. The
// CSIAddonsNode comes back with an error too when it names no usable endpoint. A node known to be
// gone has no target: the error wraps ErrNodeGone.
func (m *TargetMap) Target(driver, node string) (probe.Target, *csiaddonsv1alpha1.CSIAddonsNode, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.goneLocked(node) {
		return probe.Target{}, nil, fmt.Errorf("%w: %w: Node %s of driver %s's sidecar no longer exists", probe.ErrNoEndpoint, ErrNodeGone, node, driver)
	}
	var chosen *csiaddonsv1alpha1.CSIAddonsNode
	for key := range m.byDriverNode[driver+"/"+node] {
		if n := m.nodes[key]; chosen == nil || fresher(n, chosen) {
			chosen = n
		}
	}
	if chosen == nil {
		return probe.Target{}, nil, fmt.Errorf("%w: no CSIAddonsNode for driver %s on node %s", probe.ErrNoEndpoint, driver, node)
	}
	t, err := probe.TargetFor(chosen)
	return t, chosen, err
}

// DeleteNode drops every target on node, a Node that was deleted: its CSIAddonsNodes may outlive
// it, but no sidecar serves there any more. It returns the dropped objects and the endpoints whose
// connections can be closed.
func (m *TargetMap) DeleteNode(node string) (dropped []*csiaddonsv1alpha1.CSIAddonsNode, endpoints []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dropLocked(func(n string) bool { return n == node })
}

func (m *TargetMap) dropLocked(drop func(node string) bool) (dropped []*csiaddonsv1alpha1.CSIAddonsNode, endpoints []string) {
	for _, n := range m.nodes {
		if !drop(n.Spec.Driver.NodeID) {
			continue
		}
		if t, err := probe.TargetFor(n); err == nil {
			endpoints = append(endpoints, t.Endpoint)
		}
		dropped = append(dropped, n)
	}
	for _, n := range dropped {
		m.removeLocked(types.NamespacedName{Namespace: n.Namespace, Name: n.Name})
	}
	sort.Slice(dropped, func(i, j int) bool {
		return dropped[i].Namespace+"/"+dropped[i].Name < dropped[j].Namespace+"/"+dropped[j].Name
	})
	sort.Strings(endpoints)
	return dropped, endpoints
}

// fresher reports whether a is a better registration of a driver's sidecar on a node than b,
// when several CSIAddonsNodes name the same driver and node (a healer sidecar that started
// before the csi-addons sidecar, an object left from an earlier pod): the one that names a healer
// sidecar endpoint, then the one whose node plugin started last (by the healer sidecar's and the
// csi-addons sidecar's restart annotations), then the csi-addons sidecar's own object, then the
// newer object, then the name. The choice depends only on the objects, never on map order.
func fresher(a, b *csiaddonsv1alpha1.CSIAddonsNode) bool {
	if ea, eb := annotations.Value(a.Annotations, annotations.Endpoint) != "", annotations.Value(b.Annotations, annotations.Endpoint) != ""; ea != eb {
		return ea
	}
	if sa, sb := lastStart(a), lastStart(b); !sa.Equal(sb) {
		return sa.After(sb)
	}
	if oa, ob := a.Annotations[annotations.CSIAddonsPod] != "", b.Annotations[annotations.CSIAddonsPod] != ""; oa != ob {
		return oa
	}
	if ca, cb := a.CreationTimestamp.Time, b.CreationTimestamp.Time; !ca.Equal(cb) {
		return ca.After(cb)
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}

// lastStart is the later of the two sidecars' last starts written on n; zero when neither says.
func lastStart(n *csiaddonsv1alpha1.CSIAddonsNode) time.Time {
	last, _ := annotations.HealerRestartTime(annotations.Value(n.Annotations, annotations.HealerRestart))
	if t, err := time.Parse(time.RFC3339Nano, n.Annotations[annotations.CSIAddonsRestart]); err == nil && t.After(last) {
		last = t
	}
	return last
}

// Nodes lists the nodes where driver has a CSIAddonsNode, sorted, leaving out the nodes known to
// be gone.
func (m *TargetMap) Nodes(driver string) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	seen := map[string]bool{}
	var out []string
	for _, n := range m.nodes {
		if n.Spec.Driver.Name == driver && !seen[n.Spec.Driver.NodeID] && !m.goneLocked(n.Spec.Driver.NodeID) {
			seen[n.Spec.Driver.NodeID] = true
			out = append(out, n.Spec.Driver.NodeID)
		}
	}
	sort.Strings(out)
	return out
}
