package policy

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestInputPathAnalysis checks which input fields the engine finds a policy's decisions depend
// on, and when it refuses to memoize.
func TestInputPathAnalysis(t *testing.T) {
	tests := map[string]struct {
		text      string
		wantPaths []string
		wantOff   string // substring of the reason decisions are not memoized
	}{
		"fields read directly": {
			text: policyText(`default decision := {"action": "skip", "reason": "r"}`,
				`decision := {"action": "probe", "reason": "r"} if {`,
				`	input.trigger == "restart"`,
				`	input.volume.attributes.mounter == "rbd-nbd"`,
				`	input.volume.pvc.labels["app.kubernetes.io/name"] == "db"`,
				`}`),
			wantPaths: []string{`input.trigger`, `input.volume.attributes.mounter`, `input.volume.pvc.labels["app.kubernetes.io/name"]`},
		},
		"iteration keeps the fields below it": {
			text: policyText(`default decision := {"action": "skip", "reason": "r"}`,
				`decision := {"action": "heal", "reason": "r"} if input.probe.health[_].status == "DEGRADED"`),
			wantPaths: []string{`input.probe.health[_].status`},
		},
		"a computed key reads the object whole": {
			text: policyText(`default decision := {"action": "skip", "reason": "r"}`,
				`key := "mounter"`,
				`decision := {"action": "heal", "reason": "r"} if input.volume.attributes[key] == "fuse"`),
			wantPaths: []string{`input.volume.attributes`},
		},
		"a shorter path covers a longer one": {
			text: policyText(`default decision := {"action": "skip", "reason": "r"}`,
				`decision := {"action": "probe", "reason": "r"} if {`,
				`	input.probe`,
				`	input.probe.healthy == false`,
				`}`),
			wantPaths: []string{`input.probe`},
		},
		"fields read by helper rules and functions": {
			text: policyText(`default decision := {"action": "skip", "reason": "r"}`,
				`mounter := input.volume.attributes.mounter`,
				`in_zone(z) if input.node.labels.zone == z`,
				`decision := {"action": "probe", "reason": mounter} if in_zone("a")`),
			wantPaths: []string{`input.node.labels.zone`, `input.volume.attributes.mounter`},
		},
		"rules the decision does not reach are ignored": {
			text: policyText(`default decision := {"action": "skip", "reason": "r"}`,
				`decision := {"action": "probe", "reason": "r"} if input.trigger == "manual"`,
				`debug := input`),
			wantPaths: []string{`input.trigger`},
		},
		"reading input whole": {
			text: policyText(`default decision := {"action": "skip", "reason": "r"}`,
				`decision := {"action": "probe", "reason": "r"} if count(input) > 3`),
			wantOff: "reads input as a whole",
		},
		"a computed top-level key": {
			text: policyText(`default decision := {"action": "skip", "reason": "r"}`,
				`decision := {"action": "probe", "reason": "r"} if input[_].pv == "x"`),
			wantOff: "computed top-level key",
		},
		"a computed rule name reaching a rule that reads input whole": {
			text: policyText(`default decision := {"action": "skip", "reason": "r"}`,
				`helpers.whole := input`,
				`names := ["whole"]`,
				`decision := {"action": "probe", "reason": "r"} if data.volumehealer.helpers[names[0]]`),
			wantOff: "reads input as a whole",
		},
		"the clock": {
			text: policyText(`default decision := {"action": "skip", "reason": "r"}`,
				`decision := {"action": "probe", "reason": "r"} if time.now_ns() > 0`),
			wantOff: "calls time.now_ns",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rev := mustCompile(t, "p.rego", tc.text, CompileOptions{})
			on, why := rev.Memoized()
			if tc.wantOff != "" {
				if on || !strings.Contains(why, tc.wantOff) {
					t.Fatalf("memoized %t (%q), want off because %q", on, why, tc.wantOff)
				}
				return
			}
			if !on {
				t.Fatalf("not memoized: %s", why)
			}
			if got := rev.InputPaths(); !slices.Equal(got, tc.wantPaths) {
				t.Errorf("paths %q, want %q", got, tc.wantPaths)
			}
		})
	}
}

// equivalencePolicies are policies that exercise the memo: the built-in default, the documented
// examples, and policies that read fields in the ways the analysis distinguishes.
func equivalencePolicies(t *testing.T) map[string][]Module {
	t.Helper()
	sets := map[string][]Module{"builtin default": DefaultModules()}
	for _, name := range []string{"userspace-mounters", "skip-namespace"} {
		mods, err := LoadFiles("testdata/examples/" + name + "/policy.rego")
		if err != nil {
			t.Fatal(err)
		}
		sets["example "+name] = mods
	}
	extra := map[string]string{
		"the remedies": policyText(
			`default decision := {"action": "skip", "reason": "none"}`,
			`decision := {"action": "recycle", "reason": "evict"} if {`,
			`	input.remedies.evict`,
			`	not input.remedies.heal`,
			`} else := {"action": "heal", "reason": "restart"} if {`,
			`	input.remedies.restartContainers`,
			`}`,
		),
		"indexes and lists": policyText(
			`default decision := {"action": "skip", "reason": "none"}`,
			`decision := {"action": "probe", "reason": input.volume.accessModes[0]} if {`,
			`	input.driver.healer.probe`,
			`	not "noatime" in input.volume.mountOptions`,
			`} else := {"action": "heal", "reason": input.probe.health[0].reason} if {`,
			`	input.probe.healable`,
			`	count(input.probe.health) > 1`,
			`}`,
		),
		"whole objects and object.get": policyText(
			`default decision := {"action": "skip", "reason": "none"}`,
			`decision := {"action": "probe", "reason": object.get(input.volume.storageClass.parameters, "pool", "nopool")} if {`,
			`	input.volume.storageClass`,
			`	not input.attachment`,
			`} else := {"action": "heal", "reason": input.attachment.node} if {`,
			`	input.attachment.attached`,
			`	input.history.consecutiveFailures < 2`,
			`}`,
		),
		"computed keys and iteration": policyText(
			`default decision := {"action": "skip", "reason": "none"}`,
			`keys := ["mounter", "pool"]`,
			`decision := {"action": "probe", "reason": input.volume.attributes[keys[0]]} if {`,
			`	some k, v in input.volume.pvc.labels`,
			`	startswith(k, "healer")`,
			`	v == "true"`,
			`} else := {"action": "heal", "reason": r} if {`,
			`	some i`,
			`	input.probe.health[i].status == "DEGRADED"`,
			`	r := sprintf("%d:%s", [i, input.probe.health[i].reason])`,
			`} else := {"action": "skip", "reason": sprintf("%v", [input.history.lastProbe.health[_].status])} if {`,
			`	input.history.lastProbe.healthy == false`,
			`}`,
		),
		"absent fields": policyText(
			`default decision := {"action": "skip", "reason": "none"}`,
			`decision := {"action": "probe", "reason": "unbound"} if not input.volume.pvc`,
			`else := {"action": "probe", "reason": "no class"} if not input.volume.storageClass.name`,
			`else := {"action": "heal", "reason": "healed before"} if input.history.lastHeal`,
			`else := {"action": "skip", "reason": input.node.labels.zone} if input.node`,
		),
	}
	for name, text := range extra {
		sets[name] = []Module{{File: "p.rego", Text: text}}
	}
	return sets
}

// TestMemoizedDecisionsEqualEvaluatedOnes is the guarantee behind the memo: on randomized inputs
// that often agree on the fields a policy reads, memoized decisions equal plain evaluation.
func TestMemoizedDecisionsEqualEvaluatedOnes(t *testing.T) {
	ctx := context.Background()
	for name, mods := range equivalencePolicies(t) {
		t.Run(name, func(t *testing.T) {
			memoized, err := Compile(ctx, mods, patient(CompileOptions{MemoSize: 64}))
			if err != nil {
				t.Fatal(err)
			}
			if on, why := memoized.Memoized(); !on {
				t.Fatalf("not memoized: %s", why)
			}
			plain, err := Compile(ctx, mods, patient(CompileOptions{DisableMemo: true}))
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(42, uint64(len(name))))
			hits, decisions := 0, map[Decision]bool{}
			for i := range 3000 {
				in := randomInput(r)
				got, hit, err1 := memoized.decide(ctx, &in)
				want, err2 := plain.Evaluate(ctx, &in)
				if (err1 == nil) != (err2 == nil) {
					t.Fatalf("input %d: memoized error %v, evaluated error %v", i, err1, err2)
				}
				if got != want {
					t.Fatalf("input %d %s: memoized %+v (hit %t), evaluated %+v", i, mustJSON(t, in), got, hit, want)
				}
				if hit {
					hits++
				}
				decisions[want] = true
			}
			// Without hits or with a single decision the comparison proves nothing.
			if hits < 100 || len(decisions) < 2 {
				t.Errorf("%d memo hits and %d distinct decisions in 3000 inputs; the test needs more of both", hits, len(decisions))
			}
			if n := memoized.memo.len(); n > 64 {
				t.Errorf("memo holds %d decisions, bound 64", n)
			}
			t.Logf("%d hits, %d distinct decisions, paths %v", hits, len(decisions), memoized.InputPaths())
		})
	}
}

func mustJSON(t *testing.T, in Input) string {
	t.Helper()
	b, err := in.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMemoIsBounded(t *testing.T) {
	m := newMemo(10)
	for i := range 100 {
		m.put(strings.Repeat("k", i+1), Decision{Action: ActionSkip, Reason: "r"})
		if m.len() > 10 {
			t.Fatalf("after %d inserts the memo holds %d, bound 10", i+1, m.len())
		}
	}
	if _, ok := m.get([]byte(strings.Repeat("k", 100))); !ok {
		t.Error("the most recent decision was evicted")
	}
	if _, ok := m.get([]byte("k")); ok {
		t.Error("the oldest decision was kept")
	}
}
