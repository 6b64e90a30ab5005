package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
)

// reportOnlyPolicy probes as the built-in policy does and never heals.
const reportOnlyPolicy = `package volumehealer

# Report only: probe what the built-in policy probes, heal nothing.
decision := {"action": "skip", "reason": "ReportOnly"} if {
	data.volumehealer.builtin.decision.action == "heal"
} else := data.volumehealer.builtin.decision
`

// builtinPolicy is the built-in policy delivered as a ConfigMap.
const builtinPolicy = `package volumehealer

decision := data.volumehealer.builtin.decision
`

// TestPolicyChangedMidRun starts the controller with a report-only policy: a node plugin restart
// has its broken volumes probed and none healed. The policy is then replaced, with the controller
// running, by one that heals; once the controller serves the new revision, the next restart heals
// them. Neither revision touches the detaching volume.
func TestPolicyChangedMidRun(t *testing.T) {
	f := newFixture(t, "policychange")
	sc := f.StorageClass("policychange-rbd-nbd", "rbd-nbd", nil)
	b := budgets{global: 4, perDriver: 4, perNode: 2}
	n := f.newNode("policychange-node-1")
	vols := f.newVolumes(n, sc, "rbd-nbd", "vol", 6)
	detaching := vols[5]
	f.CreateVolumes(vols, true)
	f.Detach(detaching)
	f.setPolicy("site-policy", reportOnlyPolicy)

	n.start()
	c := f.startController("policychange", b.settings())
	first := f.waitPolicyStatus("site-policy", policy.StatusOK, nil)
	f.SweepFinished(n.name, time.Minute)

	broken := vols[:3]
	for _, v := range append(broken, detaching) {
		v.SetCondition(t, control.Gone, 0)
	}
	n.restart()
	f.SweepFinished(n.name, time.Minute)
	f.verify([]*node{n}, b, outcome{leftBroken: broken, untouched: []*volume{detaching}})
	probedSince(t, n, broken)

	f.setPolicy("site-policy", builtinPolicy)
	second := f.waitPolicyStatus("site-policy", policy.StatusOK, func(st policy.PolicyStatus) bool { return st.Revision != first.Revision })
	harness.Eventually(t, 30*time.Second, "the controller to serve revision "+second.Revision, func() (bool, string) {
		served := c.Metric("volume_healer_policy_revision_info", map[string]string{"revision": second.Revision})
		return served == 1, fmt.Sprintf("volume_healer_policy_revision_info{revision=%q} = %v", second.Revision, served)
	})
	n.restart()
	f.SweepFinished(n.name, time.Minute)
	c.MustRun()
	f.verify([]*node{n}, b, outcome{healed: broken, untouched: []*volume{detaching}})
}

// goldPolicy heals only the volumes of the StorageClass badpolicy-gold.
const goldPolicy = `package volumehealer

# Only the gold StorageClass is looked after; every other volume is left alone.
decision := data.volumehealer.builtin.decision if {
	input.volume.storageClass.name == "badpolicy-gold"
} else := {"action": "skip", "reason": "NotGold"}
`

// TestBadPolicyPushedMidRun serves a good policy (heal only the gold StorageClass), then pushes a
// bad policy of every kind the controller must reject, the last one while a restart sweep runs.
// Each is rejected with its reason on the ConfigMap, in a metric and an Event, and the last good
// policy keeps deciding: the broken gold volumes are healed, the broken silver ones left alone.
func TestBadPolicyPushedMidRun(t *testing.T) {
	f := newFixture(t, "badpolicy")
	gold := f.StorageClass("badpolicy-gold", "rbd-nbd", nil)
	silver := f.StorageClass("badpolicy-silver", "rbd-nbd", nil)
	// One call at a time on the node makes the restart sweep long enough for a policy push.
	b := budgets{global: 2, perDriver: 2, perNode: 1}
	n := f.newNode("badpolicy-node-1")
	goldVols := f.newVolumes(n, gold, "rbd-nbd", "gold", 5)
	silverVols := f.newVolumes(n, silver, "rbd-nbd", "silver", 3)
	f.CreateVolumes(n.volumes, true)
	f.setPolicy("site-policy", goldPolicy)

	n.start()
	c := f.startController("badpolicy", b.settings())
	good := f.waitPolicyStatus("site-policy", policy.StatusOK, nil)
	f.SweepFinished(n.name, time.Minute)

	bad := []struct {
		what string
		rego string
		kind policy.ErrorKind
	}{
		{"a syntax error", "package volumehealer\n\ndecision := {\"action\": \"heal\"\n", policy.KindParse},
		{"a call to a forbidden built-in", "package volumehealer\n\ndecision := {\"action\": \"skip\", \"reason\": http.send({\"method\": \"get\", \"url\": \"http://127.0.0.1:1\"}).body}\n", policy.KindForbiddenBuiltin},
		{"an error at run time", "package volumehealer\n\ndecision := {\"action\": \"skip\", \"reason\": sprintf(\"%v\", [to_number(input.volume.pv)])}\n", policy.KindRuntime},
		{"an undefined decision", "package volumehealer\n\ndecision := {\"action\": \"heal\", \"reason\": \"Never\"} if input.trigger == \"never\"\n", policy.KindUndefined},
		{"an unknown action", "package volumehealer\n\ndecision := {\"action\": \"reboot\", \"reason\": \"Why\"}\n", policy.KindInvalidOutput},
	}
	push := func(i int) time.Time {
		t.Helper()
		before := c.Metric("volume_healer_policy_load_errors_total", map[string]string{"reason": string(bad[i].kind)})
		f.setPolicy("site-policy", bad[i].rego)
		f.waitPolicyStatus("site-policy", policy.StatusRejected, func(st policy.PolicyStatus) bool { return st.Reason == bad[i].kind })
		harness.Eventually(t, 30*time.Second, "the rejection of "+bad[i].what+" to be counted", func() (bool, string) {
			after := c.Metric("volume_healer_policy_load_errors_total", map[string]string{"reason": string(bad[i].kind)})
			return after > before, fmt.Sprintf("volume_healer_policy_load_errors_total{reason=%q}: %v before, %v now", bad[i].kind, before, after)
		})
		if served := c.Metric("volume_healer_policy_revision_info", map[string]string{"revision": good.Revision}); served != 1 {
			t.Errorf("after %s: the last good revision %s is not served (volume_healer_policy_revision_info = %v)", bad[i].what, good.Revision, served)
		}
		return time.Now()
	}
	for i := range bad[:len(bad)-1] {
		push(i)
	}
	harness.Eventually(t, 30*time.Second, "a PolicyRejected Event on the ConfigMap", func() (bool, string) {
		sel := fields.Set{"involvedObject.kind": "ConfigMap", "involvedObject.name": "site-policy", "reason": policy.ReasonPolicyRejected}.AsSelector().String()
		list, err := f.Clientset.CoreV1().Events(f.policyNS).List(f.Ctx(), metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err.Error()
		}
		return slices.ContainsFunc(list.Items, func(ev corev1.Event) bool { return ev.Type == corev1.EventTypeWarning }), fmt.Sprintf("%d Events", len(list.Items))
	})

	// Slow volumes keep the restart sweep running while the last bad policy arrives.
	for _, v := range goldVols {
		v.SetCondition(t, control.Hung, 700*time.Millisecond)
	}
	for _, v := range silverVols {
		v.SetCondition(t, control.Gone, 0)
	}
	n.restart()
	harness.Eventually(t, 30*time.Second, "the restart sweep to call the driver", func() (bool, string) {
		inFlight := n.inFlight()
		return inFlight > 0, fmt.Sprintf("%d calls in flight", inFlight)
	})
	rejectedAt := push(len(bad) - 1)
	f.SweepFinished(n.name, time.Minute)
	c.MustRun()
	f.verify([]*node{n}, b, outcome{healed: goldVols, leftBroken: silverVols})
	calls, _, err := n.record()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(calls, func(c control.Call) bool { return c.RPC == "HealVolume" && c.Start.After(rejectedAt) }) {
		t.Errorf("no heal started after the last bad policy was rejected: the sweep was over before the push, so the push was not mid-sweep")
	}
	// The good policy skips silver volumes before probing them.
	for _, v := range silverVols {
		for _, call := range calls {
			if call.VolumeID == v.Handle && !call.Start.Before(v.BrokenAt) {
				t.Errorf("%s (silver) got a %s call; the last good policy skips it", v.PV, call.RPC)
			}
		}
	}
}

// probedSince fails the test unless each volume got a ProbeVolume call since it broke.
func probedSince(t *testing.T, n *node, vols []*volume) {
	t.Helper()
	calls, _, err := n.record()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if !slices.ContainsFunc(calls, func(c control.Call) bool {
			return c.VolumeID == v.Handle && c.RPC == "ProbeVolume" && !c.Start.Before(v.BrokenAt)
		}) {
			t.Errorf("%s got no ProbeVolume call since it broke", v.PV)
		}
	}
}
