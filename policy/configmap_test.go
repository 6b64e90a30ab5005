package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/util/retry"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/api/annotations"
)

const testNamespace = "volume-healer"

// policyConfigMap returns a ConfigMap selected by the default selector.
func policyConfigMap(name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: testNamespace,
			Name:      name,
			Labels:    map[string]string{annotations.PolicyLabel: annotations.PolicyLabelValue},
		},
		Data: data,
	}
}

// skipPolicy is a policy that skips every volume with reason.
func skipPolicy(reason string) string {
	return policyText(fmt.Sprintf(`decision := {"action": "skip", "reason": %q}`, reason))
}

// configMapHarness runs a ConfigMapSource against a clientset.
type configMapHarness struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	engine *Engine
	source *ConfigMapSource
}

func startConfigMapSource(t *testing.T, client kubernetes.Interface, recorder record.EventRecorder, engine *Engine) *configMapHarness {
	t.Helper()
	return startConfigMapSourceWith(t, client, engine, ConfigMapOptions{Namespace: testNamespace, Recorder: recorder})
}

func startConfigMapSourceWith(t *testing.T, client kubernetes.Interface, engine *Engine, opts ConfigMapOptions) *configMapHarness {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), testr.New(t)))
	src, err := NewConfigMapSource(client, engine, opts)
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	if err := src.Watch(factory); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	t.Cleanup(factory.Shutdown)
	done := make(chan error, 1)
	go func() { done <- src.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Start returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Start did not return after its context was cancelled")
		}
	})
	h := &configMapHarness{t: t, ctx: ctx, client: client, engine: engine, source: src}
	h.eventually("the source syncs", func() (bool, string) { return src.HasSynced(), "not synced" })
	return h
}

// eventually polls cond until it holds, failing the test after 20 seconds with cond's last word.
func (h *configMapHarness) eventually(what string, cond func() (bool, string)) {
	h.t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(h.ctx, 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		ok, detail := cond()
		last = detail
		return ok, nil
	})
	if err != nil {
		h.t.Fatalf("waiting until %s: %v (last seen: %s)", what, err, last)
	}
}

// decides waits until the engine's decision for a restart of the sample volume has reason.
func (h *configMapHarness) decides(reason string) {
	h.t.Helper()
	h.eventually("the decision's reason is "+reason, func() (bool, string) {
		in := sampleInput()
		d, err := h.engine.Decide(h.ctx, &in)
		return err == nil && d.Reason == reason, fmt.Sprintf("%+v, %v", d, err)
	})
}

// status waits until the ConfigMap's status annotation satisfies check.
func (h *configMapHarness) status(name string, check func(PolicyStatus) bool) PolicyStatus {
	h.t.Helper()
	var st PolicyStatus
	h.eventually("ConfigMap "+name+" has the expected status", func() (bool, string) {
		cm, err := h.client.CoreV1().ConfigMaps(testNamespace).Get(h.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		raw := cm.Annotations[annotations.PolicyStatus]
		st = PolicyStatus{}
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			return false, fmt.Sprintf("annotation %q: %v", raw, err)
		}
		return check(st), raw
	})
	return st
}

func (h *configMapHarness) create(cm *corev1.ConfigMap) {
	h.t.Helper()
	if _, err := h.client.CoreV1().ConfigMaps(cm.Namespace).Create(h.ctx, cm, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// update replaces the data of a ConfigMap, keeping what the source wrote.
// update replaces the ConfigMap's data. The source writes its status annotation on the same
// object whenever it applies a revision, which may land between the read and the write here: a
// conflict is read again and retried, as any client of an object with a second writer does.
func (h *configMapHarness) update(name string, data map[string]string) {
	h.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := h.client.CoreV1().ConfigMaps(testNamespace).Get(h.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.Data = data
		_, err = h.client.CoreV1().ConfigMaps(testNamespace).Update(h.ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		h.t.Fatal(err)
	}
}

func (h *configMapHarness) delete(name string) {
	h.t.Helper()
	if err := h.client.CoreV1().ConfigMaps(testNamespace).Delete(h.ctx, name, metav1.DeleteOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func isOK(st PolicyStatus) bool { return st.Status == StatusOK && st.Revision != "" }

// TestConfigMapDelivery walks a policy ConfigMap through its life: created, updated, broken,
// joined by a second ConfigMap, fixed, deleted.
func TestConfigMapDelivery(t *testing.T) {
	client := fake.NewClientset(
		// Not selected: without the label, a ConfigMap is no policy.
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "unlabelled"},
			Data: map[string]string{"p.rego": skipPolicy("Unlabelled")}},
	)
	recorder := record.NewFakeRecorder(100)
	engine, reg := newTestEngine(t, Options{})
	h := startConfigMapSource(t, client, recorder, engine)

	// No policy ConfigMap: the built-in default serves.
	h.decides("ProbeAfterRestart")
	builtin := engine.Revision().ID()

	h.create(policyConfigMap("site-policy", map[string]string{"policy.rego": skipPolicy("SitePolicyV1"), "README": "not Rego"}))
	h.decides("SitePolicyV1")
	if st := h.status("site-policy", isOK); st.Revision != engine.Revision().ID() {
		t.Errorf("status names revision %s, serving %s", st.Revision, engine.Revision().ID())
	}
	if got := engine.Revision().Files(); len(got) != 1 || got[0] != "volume-healer/site-policy/policy.rego" {
		t.Errorf("serving files %v", got)
	}

	h.update("site-policy", map[string]string{"policy.rego": skipPolicy("SitePolicyV2")})
	h.decides("SitePolicyV2")
	good := engine.Revision().ID()
	h.status("site-policy", func(st PolicyStatus) bool { return st.Status == StatusOK && st.Revision == good })

	// Broken: the last good revision keeps serving, the ConfigMap says why, an Event is emitted.
	h.update("site-policy", map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": `)})
	st := h.status("site-policy", func(st PolicyStatus) bool { return st.Status == StatusRejected })
	if st.Reason != KindParse || !strings.Contains(st.Error, "volume-healer/site-policy/policy.rego:4") {
		t.Errorf("status %+v, want a parse error naming volume-healer/site-policy/policy.rego:4", st)
	}
	if ev := nextEvent(t, recorder); !strings.HasPrefix(ev, "Warning PolicyRejected") ||
		!strings.Contains(ev, "volume-healer/site-policy/policy.rego:4") || !strings.Contains(ev, good) {
		t.Errorf("event %q, want a PolicyRejected warning naming the file and the serving revision", ev)
	}
	if id := engine.Revision().ID(); id != good {
		t.Errorf("serving %s after the rejection, want %s", id, good)
	}
	h.decides("SitePolicyV2")
	if v := metricValue(t, reg, "volume_healer_policy_load_errors_total", map[string]string{"reason": "parse"}); v != 1 {
		t.Errorf("load errors{reason=parse} = %v, want 1", v)
	}

	// A second, healthy ConfigMap is blocked by the broken one; it blames the other.
	h.create(policyConfigMap("zz-helpers", map[string]string{"helpers.rego": "package volumehealer\n\nhelper_reason := \"Helped\"\n"}))
	st = h.status("zz-helpers", func(st PolicyStatus) bool { return st.Status == StatusBlocked })
	if !strings.Contains(st.Error, "volume-healer/site-policy") {
		t.Errorf("blocked status %+v does not name the offending ConfigMap", st)
	}
	if ev := nextEvent(t, recorder); !strings.Contains(ev, "site-policy") {
		t.Errorf("event %q, want it to concern site-policy again", ev)
	}

	// Fixed, using the other ConfigMap's rule: both serve, both say ok.
	h.update("site-policy", map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": helper_reason}`)})
	h.decides("Helped")
	h.status("site-policy", isOK)
	h.status("zz-helpers", isOK)

	// A runtime error is blamed on the right ConfigMap, with the line.
	h.update("zz-helpers", map[string]string{"helpers.rego": "package volumehealer\n\nhelper_reason := sprintf(\"%d\", [1 / 0])\n"})
	st = h.status("zz-helpers", func(st PolicyStatus) bool { return st.Status == StatusRejected })
	if st.Reason != KindRuntime || !strings.Contains(st.Error, "volume-healer/zz-helpers/helpers.rego:3") {
		t.Errorf("status %+v, want a runtime error naming volume-healer/zz-helpers/helpers.rego:3", st)
	}
	h.status("site-policy", func(st PolicyStatus) bool { return st.Status == StatusBlocked })
	h.decides("Helped")

	// A labelled ConfigMap without Rego is reported, not loaded.
	h.create(policyConfigMap("notes", map[string]string{"notes.txt": "hello"}))
	h.status("notes", func(st PolicyStatus) bool { return st.Status == StatusIgnored })

	// The Rego gone but a labelled ConfigMap left: that is no request for the built-in policy
	// (a key renamed by mistake, say); the last good revision keeps serving and the ConfigMap
	// says why.
	h.delete("site-policy")
	h.delete("zz-helpers")
	st = h.status("notes", func(st PolicyStatus) bool { return st.Status == StatusRejected })
	if st.Reason != KindNoModules {
		t.Errorf("status %+v, want rejected for want of Rego", st)
	}
	h.decides("Helped")

	// Every policy ConfigMap deleted: back to the built-in default.
	h.delete("notes")
	h.decides("ProbeAfterRestart")
	if id := engine.Revision().ID(); id != builtin {
		t.Errorf("serving %s after deleting every policy, want the built-in %s", id, builtin)
	}
	if v := metricValue(t, reg, "volume_healer_policy_revision_info", map[string]string{"revision": builtin}); v != 1 {
		t.Errorf("revision_info{revision=%s} = %v, want 1", builtin, v)
	}
}

// nextEvent returns the next Event the recorder received.
func nextEvent(t *testing.T, r *record.FakeRecorder) string {
	t.Helper()
	select {
	case ev := <-r.Events:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no Event recorded")
		return ""
	}
}

func TestConfigMapSourceRejectsABadSelector(t *testing.T) {
	engine, _ := newTestEngine(t, Options{})
	if _, err := NewConfigMapSource(fake.NewClientset(), engine, ConfigMapOptions{LabelSelector: "a in (b"}); err == nil {
		t.Fatal("a malformed selector was accepted")
	}
}

// The default selector, as written now or as 0.1.0 wrote it, selects the ConfigMaps labelled for
// either release; another selector selects what it says.
func TestSelectors(t *testing.T) {
	previous := annotations.Previous(annotations.PolicyLabel)
	objects := map[string]map[string]string{
		"labelled now":       {annotations.PolicyLabel: "rego"},
		"labelled for 0.1.0": {previous: "rego"},
		"labelled for both":  {annotations.PolicyLabel: "rego", previous: "rego"},
		"other value":        {annotations.PolicyLabel: "yaml", previous: "json"},
		"unlabelled":         nil,
		"team storage":       {"team": "storage"},
	}
	tests := map[string]struct {
		selector string
		selected []string
	}{
		"default": {selector: DefaultPolicySelector,
			selected: []string{"labelled now", "labelled for 0.1.0", "labelled for both"}},
		"default of 0.1.0, configured": {selector: previous + "=rego",
			selected: []string{"labelled now", "labelled for 0.1.0", "labelled for both"}},
		"default with spaces": {selector: " " + annotations.PolicyLabel + " = rego",
			selected: []string{"labelled now", "labelled for 0.1.0", "labelled for both"}},
		"only the new key, set-based": {selector: annotations.PolicyLabel + " in (rego)",
			selected: []string{"labelled now", "labelled for both"}},
		"another selector": {selector: "team=storage", selected: []string{"team storage"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			engine, _ := newTestEngine(t, Options{})
			src, err := NewConfigMapSource(fake.NewClientset(), engine, ConfigMapOptions{Namespace: testNamespace, LabelSelector: tc.selector})
			if err != nil {
				t.Fatal(err)
			}
			for object, labels := range objects {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "p", Labels: labels}}
				if got, want := src.selects(cm), slices.Contains(tc.selected, object); got != want {
					t.Errorf("%s: selected = %v, want %v", object, got, want)
				}
			}
		})
	}
}

// A policy ConfigMap labelled for 0.1.0 serves, as one labelled now does; the status the
// controller writes on it moves to the new key.
func TestConfigMapsLabelledForEitherRelease(t *testing.T) {
	previousLabel, previousStatus := annotations.Previous(annotations.PolicyLabel), annotations.Previous(annotations.PolicyStatus)
	client := fake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "unlabelled"},
			Data: map[string]string{"p.rego": skipPolicy("Unlabelled")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "old",
			Labels:      map[string]string{previousLabel: annotations.PolicyLabelValue},
			Annotations: map[string]string{previousStatus: `{"status":"ok","revision":"0.1.0"}`}},
			Data: map[string]string{"p.rego": skipPolicy("LabelledFor010")}},
	)
	engine, _ := newTestEngine(t, Options{})
	h := startConfigMapSource(t, client, nil, engine)

	h.decides("LabelledFor010")
	h.status("old", isOK)
	h.eventually("the status of 0.1.0 is removed", func() (bool, string) {
		cm, err := client.CoreV1().ConfigMaps(testNamespace).Get(h.ctx, "old", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		_, ok := cm.Annotations[previousStatus]
		return !ok, fmt.Sprint(cm.Annotations)
	})

	// The label of 0.1.0 taken off: the ConfigMap leaves the set.
	cm, err := client.CoreV1().ConfigMaps(testNamespace).Get(h.ctx, "old", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Labels = nil
	if _, err := client.CoreV1().ConfigMaps(testNamespace).Update(h.ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.decides("ProbeAfterRestart")

	h.create(policyConfigMap("new", map[string]string{"p.rego": skipPolicy("LabelledNow")}))
	h.decides("LabelledNow")
}

func TestModulesFromConfigMaps(t *testing.T) {
	cms := []*corev1.ConfigMap{
		policyConfigMap("b", map[string]string{"z.rego": "z", "a.rego": "a", "data.json": "{}"}),
		policyConfigMap("a", map[string]string{"main.rego": "m"}),
	}
	var got []string
	for _, m := range ModulesFromConfigMaps(cms) {
		got = append(got, m.File+"="+m.Text)
	}
	want := "volume-healer/a/main.rego=m volume-healer/b/a.rego=a volume-healer/b/z.rego=z"
	if strings.Join(got, " ") != want {
		t.Errorf("modules %v, want %s", got, want)
	}
}

// A standby replica loads a broken policy like the leader, but leaves the report to the leader:
// no Event, no status annotation. Once it leads, its Resync writes the status.
func TestConfigMapRejectionIsReportedByTheLeaderOnly(t *testing.T) {
	client := fake.NewClientset()
	recorder := record.NewFakeRecorder(100)
	engine, reg := newTestEngine(t, Options{})
	var leading atomic.Bool
	h := startConfigMapSourceWith(t, client, engine, ConfigMapOptions{Namespace: testNamespace, Recorder: recorder, Leading: leading.Load})

	h.create(policyConfigMap("site-policy", map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": `)}))
	h.eventually("the standby rejected the broken policy", func() (bool, string) {
		v := metricValue(t, reg, "volume_healer_policy_load_errors_total", map[string]string{"reason": "parse"})
		return v == 1, fmt.Sprintf("load errors{reason=parse} = %v", v)
	})
	time.Sleep(200 * time.Millisecond) // room for a write that must not come
	select {
	case ev := <-recorder.Events:
		t.Errorf("a standby replica emitted %q", ev)
	default:
	}
	cm, err := client.CoreV1().ConfigMaps(testNamespace).Get(h.ctx, "site-policy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := cm.Annotations[annotations.PolicyStatus]; ok {
		t.Errorf("a standby replica wrote the status %s", v)
	}

	leading.Store(true)
	h.source.Resync()
	h.status("site-policy", func(st PolicyStatus) bool { return st.Status == StatusRejected })
}

// A replica that starts while the configured policy is broken (a controller restart, a new
// leader) serves the last accepted policy that the leader kept, never the built-in one, and
// shows the rejection.
func TestStartWithABrokenPolicyServesTheLastGoodCopy(t *testing.T) {
	client := fake.NewClientset()
	leaderEngine, _ := newTestEngine(t, Options{})
	leader := startConfigMapSourceWith(t, client, leaderEngine, ConfigMapOptions{Namespace: testNamespace, Recorder: record.NewFakeRecorder(100)})
	leader.create(policyConfigMap("site-policy", map[string]string{"policy.rego": skipPolicy("SiteV1")}))
	leader.decides("SiteV1")
	leader.eventually("the leader keeps a copy of the accepted policy", func() (bool, string) {
		cm, err := client.CoreV1().ConfigMaps(testNamespace).Get(leader.ctx, DefaultLastGoodName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(cm.Data[lastGoodKey], "SiteV1"), cm.Data[lastGoodKey]
	})
	leader.update("site-policy", map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": `)})
	leader.status("site-policy", func(st PolicyStatus) bool { return st.Status == StatusRejected })

	engine, reg := newTestEngine(t, Options{})
	h := startConfigMapSourceWith(t, client, engine, ConfigMapOptions{Namespace: testNamespace, Leading: func() bool { return false }})
	h.decides("SiteV1")
	if v := metricValue(t, reg, "volume_healer_policy_rejected", nil); v != 1 {
		t.Errorf("volume_healer_policy_rejected = %v on the new replica, want 1: the configured policy is still broken", v)
	}

	// Fixed: the new replica serves the fixed policy and the rejection clears.
	leader.update("site-policy", map[string]string{"policy.rego": skipPolicy("SiteV2")})
	h.decides("SiteV2")
	if v := metricValue(t, reg, "volume_healer_policy_rejected", nil); v != 0 {
		t.Errorf("volume_healer_policy_rejected = %v after the fix, want 0", v)
	}
}

// With a broken policy and no accepted copy to fall back on, no volume is decided: every
// decision is an error that says so (never a skip, which would let a restart sweep count its
// volumes handled, and never the built-in policy), and the rejection says so.
func TestStartWithABrokenPolicyAndNoCopyDecidesNothing(t *testing.T) {
	client := fake.NewClientset(policyConfigMap("site-policy", map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": `)}))
	recorder := record.NewFakeRecorder(100)
	engine, reg := newTestEngine(t, Options{})
	h := startConfigMapSource(t, client, recorder, engine)
	for _, trigger := range []Trigger{TriggerRestart, TriggerSchedule, TriggerManual} {
		in := sampleInput()
		in.Trigger = trigger
		h.eventually(string(trigger)+" is not decided", func() (bool, string) {
			d, err := engine.Decide(h.ctx, &in)
			return errors.Is(err, ErrNoAcceptedPolicy), fmt.Sprintf("%+v, %v", d, err)
		})
	}
	if ev := nextEvent(t, recorder); !strings.Contains(ev, "no volume is decided") {
		t.Errorf("event %q, want it to say that no volume is decided", ev)
	}
	if v := metricValue(t, reg, "volume_healer_policy_rejected", nil); v != 1 {
		t.Errorf("volume_healer_policy_rejected = %v, want 1", v)
	}
	if _, err := client.CoreV1().ConfigMaps(testNamespace).Get(h.ctx, DefaultLastGoodName, metav1.GetOptions{}); err == nil {
		t.Error("the fail-closed policy was kept as the last accepted one")
	}
}

// A read of the last-good copy that fails at start (the API server briefly unavailable) is tried
// again with backoff: the copy serves without waiting for a change to the policy ConfigMaps.
func TestLastGoodCopyIsReadAgainAfterAFailedRead(t *testing.T) {
	copyText, err := json.Marshal([]Module{{File: "volume-healer/site-policy/policy.rego", Text: skipPolicy("SiteV1")}})
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(
		policyConfigMap("site-policy", map[string]string{"policy.rego": policyText(`decision := {"action": "skip", "reason": `)}),
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: DefaultLastGoodName}, Data: map[string]string{lastGoodKey: string(copyText)}},
	)
	var failures atomic.Int32
	client.PrependReactor("get", "configmaps", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.(clienttesting.GetAction).GetName() == DefaultLastGoodName && failures.Add(1) == 1 {
			return true, nil, apierrors.NewServiceUnavailable("etcd leader election")
		}
		return false, nil, nil
	})
	engine, _ := newTestEngine(t, Options{})
	h := startConfigMapSourceWith(t, client, engine, ConfigMapOptions{Namespace: testNamespace, Leading: func() bool { return false }})
	h.decides("SiteV1")
	if n := failures.Load(); n < 2 {
		t.Errorf("the last-good copy was read %d times, want a second read after the failure", n)
	}
}
