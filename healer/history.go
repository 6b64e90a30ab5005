package healer

import (
	"sync"
	"time"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
)

// volumeState is what the controller remembers about one volume on one node.
type volumeState struct {
	history policy.History
	// driver is the volume's CSI driver, for the unhealthy-volumes metric.
	driver string
	// notHealable is set when the driver said the volume cannot be healed, with the capabilities
	// generation of its driver on its node at that time (notHealableGen); the volume is not offered
	// for healing again until that generation changes.
	notHealable    bool
	notHealableGen uint64
	// recheckAt is the driver's "check again after" hint; periodic sweeps leave the volume alone
	// until then.
	recheckAt time.Time
}

// memory holds volumeState by PV name and node: a volume used on several nodes (RWX) has a mount,
// a history and a "check again later" on each. A node's sidecar thus writes only its own node's
// entries: what it answers, or lists as staged there, says nothing of another node. It lives in
// the leader's memory: a new leader
// starts without history, which only makes it probe once more.
type memory struct {
	mu sync.Mutex
	// states holds, by PV name, the volume's state on each node by node name.
	states map[string]map[string]*volumeState
	// gens holds a generation per driver and node, new at every restart of its node plugin, from
	// one counter (lastGen), so that a generation is never reused after a node is forgotten.
	gens    map[string]uint64
	lastGen uint64
	// unhealthyCounts is the unhealthy-volumes gauge kept current as states change, so that a
	// scrape copies a few label combinations instead of walking every remembered volume under
	// mu, the lock every probe result takes. A combination that drops to zero is deleted, as a
	// recount would never produce it. The counts hold as long as states change only through
	// update and forget, and a recorded ProbeRecord is replaced, never changed in place.
	unhealthyCounts map[unhealthyKey]int
}

// unhealthyKey is one series of the unhealthy-volumes gauge: driver and health status.
type unhealthyKey = [2]string

func newMemory() *memory {
	return &memory{states: map[string]map[string]*volumeState{}, gens: map[string]uint64{}, unhealthyCounts: map[unhealthyKey]int{}}
}

// get returns the state of the PV named pv on node.
func (m *memory) get(pv, node string) volumeState {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.states[pv][node]; ok {
		return *s
	}
	return volumeState{}
}

// update changes the state of the PV named pv on node with f.
func (m *memory) update(pv, node string, f func(*volumeState)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	nodes, ok := m.states[pv]
	if !ok {
		nodes = map[string]*volumeState{}
		m.states[pv] = nodes
	}
	s, ok := nodes[node]
	if !ok {
		s = &volumeState{}
		nodes[node] = s
	}
	// Whatever f changes, the volume's old contribution to the gauge goes out and its new one in.
	m.countUnhealthy(s, -1)
	f(s)
	m.countUnhealthy(s, +1)
}

func (m *memory) generation(driver, node string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gens[driver+"/"+node]
}

// capabilitiesChanged marks a restart of the driver's node plugin: volumes it called not
// healable may be healable now.
func (m *memory) capabilitiesChanged(driver, node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastGen++
	m.gens[driver+"/"+node] = m.lastGen
}

// forgetNode drops the generation of a driver's node plugin on node whose CSIAddonsNode is gone.
func (m *memory) forgetNode(driver, node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.gens, driver+"/"+node)
}

// offeredForHealing reports whether a volume the driver once called not healable may be offered
// again: only after its driver's capabilities changed.
func (s volumeState) offeredForHealing(gen uint64) bool {
	return !s.notHealable || s.notHealableGen != gen
}

func (m *memory) recordProbe(pv, node, driver string, at time.Time, r *probe.Result, gen uint64) {
	m.update(pv, node, func(s *volumeState) {
		s.driver = driver
		s.history.LastProbe = &policy.ProbeRecord{Time: at, Healthy: r.Healthy(), Health: policyHealth(r.Health)}
		if r.Healthy() {
			s.history.ConsecutiveFailures = 0
		}
		switch {
		case r.Healthy():
			s.notHealable = false
		case r.OnlyReason(healerv1alpha1.ReasonStaleMountInPods):
			// The node's mounts work and only pods with propagation None still see a dead
			// one: the driver answers "not healable" because no heal can reach those pods,
			// not because it cannot heal the volume. Taken for a verdict, it would keep the
			// volume from every heal when its mounter dies again once the pods were
			// replaced, until the node plugin restarts.
		case !r.Healable:
			s.notHealable, s.notHealableGen = true, gen
		}
		// A healable answer does not lift a "not healable" verdict given since the last
		// capability change: the driver's word stands until its node plugin restarts.
		s.recheckAt = time.Time{}
		if r.RecheckAfter > 0 {
			s.recheckAt = at.Add(r.RecheckAfter)
		}
	})
}

func (m *memory) recordFailure(pv, node string) {
	m.update(pv, node, func(s *volumeState) { s.history.ConsecutiveFailures++ })
}

func (m *memory) recordHeal(pv, node string, at time.Time) {
	m.update(pv, node, func(s *volumeState) {
		t := at
		s.history.LastHeal = &t
		s.history.ConsecutiveFailures = 0
	})
}

func policyHealth(hs []probe.Health) []policy.Health {
	out := make([]policy.Health, 0, len(hs))
	for _, h := range hs {
		out = append(out, policy.Health{Status: policy.HealthStatus(h.Status), Reason: h.Reason, Message: h.Message})
	}
	return out
}

// unhealthy counts the volumes whose last probe found them unhealthy, by driver and health status.
// A volume with two statuses counts under each. It copies the counts kept by update and forget.
func (m *memory) unhealthy() map[unhealthyKey]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[unhealthyKey]int, len(m.unhealthyCounts))
	for k, n := range m.unhealthyCounts {
		out[k] = n
	}
	return out
}

// countUnhealthy adds delta to the gauge's count of each distinct status of s's last probe, if that
// probe found the volume unhealthy. The caller holds m.mu.
func (m *memory) countUnhealthy(s *volumeState, delta int) {
	p := s.history.LastProbe
	if p == nil || p.Healthy {
		return
	}
	for i, h := range p.Health {
		if repeatedStatus(p.Health[:i], h.Status) {
			continue
		}
		k := unhealthyKey{s.driver, string(h.Status)}
		if n := m.unhealthyCounts[k] + delta; n != 0 {
			m.unhealthyCounts[k] = n
		} else {
			delete(m.unhealthyCounts, k)
		}
	}
}

// repeatedStatus reports whether status is among earlier. A probe reports a handful of statuses at
// most, so a scan costs less than a set.
func repeatedStatus(earlier []policy.Health, status policy.HealthStatus) bool {
	for _, h := range earlier {
		if h.Status == status {
			return true
		}
	}
	return false
}

// forget drops what is remembered about a deleted PV on every node, and its part of the
// unhealthy-volumes gauge.
func (m *memory) forget(pv string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.states[pv] {
		m.countUnhealthy(s, -1)
	}
	delete(m.states, pv)
}
