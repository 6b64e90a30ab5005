package healer

import (
	"context"
	"encoding/json"
	"sync"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/probe"
)

// DriverTier is the value of annotations.DriverTier on a CSIAddonsNode: what volume-healer gets
// from the driver on that node, from the capabilities its sidecar answered. The fields are the
// policy input's driver.tier and driver.probeSource.
type DriverTier struct {
	// Tier is policy.TierHealer (the driver heals in place), policy.TierProbeOnly (it probes
	// and does not heal) or policy.TierNone (it serves no Healer probe: the sidecar probes).
	Tier string `json:"tier"`
	// ProbeSource is who probes the driver's volumes on the node: "driver" or "sidecar".
	ProbeSource string `json:"probeSource"`
}

// driverTierOf is the tier of a driver with capabilities caps, derived as the policy input's.
func driverTierOf(caps *probe.Capabilities) DriverTier {
	d := driverInfo(caps, nil)
	return DriverTier{Tier: d.Tier, ProbeSource: d.ProbeSource}
}

// tierWrites remembers, per CSIAddonsNode object, the tier value the sweeper patched onto it, so
// that the sweeps that run before the informer delivers the patched object do not patch it
// again. Keys are the cached objects themselves: an informer replaces an object on every update,
// so the patched object's arrival makes a new key that carries the value. The map is emptied
// when it outgrows maxDriverTerms, which bounds what replaced objects keep alive.
type tierWrites struct {
	mu sync.Mutex
	m  map[*csiaddonsv1alpha1.CSIAddonsNode]string
}

// claim reports whether value must still be written onto n, and remembers that it is.
func (w *tierWrites) claim(n *csiaddonsv1alpha1.CSIAddonsNode, value string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m[n] == value {
		return false
	}
	if w.m == nil || len(w.m) >= maxDriverTerms {
		w.m = map[*csiaddonsv1alpha1.CSIAddonsNode]string{}
	}
	w.m[n] = value
	return true
}

// release forgets a claim whose write failed, so that the next sweep writes again.
func (w *tierWrites) release(n *csiaddonsv1alpha1.CSIAddonsNode) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, n)
}

// publishTier writes the tier of caps onto the CSIAddonsNode n, through which the controller
// reaches the driver's sidecar, when n does not carry it yet: `healerctl status` reads it there.
// It patches only that annotation. A failed write is logged; the next sweep of the node tries
// again.
func (s *Sweeper) publishTier(ctx context.Context, n *csiaddonsv1alpha1.CSIAddonsNode, caps *probe.Capabilities) {
	if n == nil || caps == nil {
		return
	}
	raw, err := json.Marshal(driverTierOf(caps))
	if err != nil {
		return
	}
	value := string(raw)
	if n.Annotations[annotations.DriverTier] == value || !s.tiers.claim(n, value) {
		return
	}
	patch := annotations.MergePatch(map[string]string{annotations.DriverTier: value})
	obj := &csiaddonsv1alpha1.CSIAddonsNode{}
	obj.Namespace, obj.Name = n.Namespace, n.Name
	if err := s.opts.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
		s.tiers.release(n)
		klog.FromContext(ctx).Error(err, "Cannot record the driver's tier on its CSIAddonsNode", "csiAddonsNode", n.Namespace+"/"+n.Name, "tier", value)
	}
}

// publishTierOf publishes the tier of driver on node, from the capabilities its sidecar answers
// (the cached answer, normally), for a restart sweep that found no volume to prepare.
func (s *Sweeper) publishTierOf(ctx context.Context, driver, node string) {
	target, n, err := s.opts.Targets.Target(driver, node)
	if err != nil {
		return
	}
	caps, err := s.opts.Sidecars.Capabilities(ctx, target)
	if err != nil {
		return
	}
	s.publishTier(ctx, n, caps)
}
