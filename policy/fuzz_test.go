package policy

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// FuzzDecodeDecision feeds arbitrary JSON, as a policy could return it, to the decision decoder:
// it must never panic, and whatever it accepts is a complete, valid decision that survives a round
// trip through its own JSON form.
func FuzzDecodeDecision(f *testing.F) {
	for _, seed := range []string{
		`{"action":"probe","reason":"ProbeAfterRestart","priority":100}`,
		`{"action":"heal","reason":"x","timeout":"30s"}`,
		`{"action":"skip","reason":"r","priority":1e300}`,
		`{"action":"heal","reason":"r","timeout":"-1s"}`,
		`{"action":"nap","reason":"r"}`,
		`{"action":"probe"}`,
		`{"action":"probe","reason":"r","extra":true}`,
		`["probe"]`, `null`, `"probe"`, `{"action":1,"reason":{}}`,
		`{"action":"probe","reason":"r","priority":1.5}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		var raw any
		if json.Unmarshal([]byte(doc), &raw) != nil {
			return
		}
		v, err := ast.InterfaceToValue(raw)
		if err != nil {
			return
		}
		d, err := decodeDecision(v)
		if err != nil {
			return
		}
		if !d.Action.Valid() || d.Reason == "" || d.Timeout < 0 {
			t.Fatalf("accepted an invalid decision %+v from %s", d, doc)
		}
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var back any
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatal(err)
		}
		bv, err := ast.InterfaceToValue(back)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeDecision(bv)
		if err != nil || again != d {
			t.Fatalf("round trip of %+v gave %+v, %v", d, again, err)
		}
	})
}

// FuzzCompile feeds arbitrary Rego text through the path every policy ConfigMap takes (parse,
// forbidden built-ins, strict compile, validation against the canned inputs): it never panics, a
// refusal is a *LoadError that names what is wrong, and a policy it accepts decides a real input
// without panicking, with a valid decision or an error.
func FuzzCompile(f *testing.F) {
	for _, seed := range []string{
		`decision := {"action": "probe", "reason": "Fuzz"}`,
		`decision := {"action": "heal", "reason": "Fuzz", "timeout": "1s", "priority": 3}`,
		`decision := {"action": "skip", "reason": `,
		`decision := {"action": "probe", "reason": sprintf("%d", [1 / count(input.volume.attributes)])}`,
		`decision := {"action": "skip", "reason": "R"} if { rand.intn("x", 10) > 3 }`,
		`decision := {"action": "skip", "reason": "R"} if { input.pvc.namespace == "shop" }
decision := {"action": "probe", "reason": "P"} if { input.pvc.namespace != "shop" }`,
		`decision := {"action": "nap", "reason": "R"}`,
		`decision := http.send({"method": "GET", "url": "http://127.0.0.1:1"})`,
		`x := input.volume`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		ctx := context.Background()
		rev, err := Compile(ctx, []Module{{File: "fuzz/policy.rego", Text: policyText(body)}}, CompileOptions{EvalTimeout: 200 * time.Millisecond})
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) || le.Kind == "" || le.Error() == "" {
				t.Fatalf("refused with %T %v, want a *LoadError with a kind and a message", err, err)
			}
			return
		}
		in := sampleInput()
		d, err := rev.Decide(ctx, &in)
		if err == nil && (!d.Action.Valid() || d.Reason == "") {
			t.Fatalf("accepted policy decided %+v", d)
		}
	})
}
