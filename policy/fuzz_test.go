package policy

import (
	"encoding/json"
	"testing"

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
