package policy

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A policy whose decision depends on chance (rand.intn, uuid.rfc4122) is refused at load time,
// naming the call: it could pass validation on the canned inputs and decide differently for the
// same volume later. The clock stays allowed.
func TestNonDeterministicBuiltinsAreRefused(t *testing.T) {
	tests := map[string]struct {
		body    string
		refused string
	}{
		"random numbers": {body: `decision := {"action": "probe", "reason": "r"} if rand.intn("x", 2) == 0
default decision := {"action": "skip", "reason": "r"}`, refused: "rand.intn"},
		"uuids":            {body: `decision := {"action": "skip", "reason": uuid.rfc4122("x")}`, refused: "uuid.rfc4122"},
		"fresh signatures": {body: `decision := {"action": "skip", "reason": io.jwt.encode_sign({"alg": "HS256"}, {}, {"kty": "oct", "k": "AA"})}`, refused: "io.jwt.encode_sign"},
		"the clock is allowed": {body: `decision := {"action": "probe", "reason": "r"} if time.now_ns() > 0
default decision := {"action": "skip", "reason": "r"}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Compile(context.Background(), []Module{{File: "site/policy.rego", Text: policyText(tc.body)}}, patient(CompileOptions{}))
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var le *LoadError
			if !errors.As(err, &le) || le.Kind != KindForbiddenBuiltin || !strings.Contains(err.Error(), tc.refused) || !strings.Contains(err.Error(), "site/policy.rego:") {
				t.Fatalf("error %v, want a forbidden built-in error naming %s and its line", err, tc.refused)
			}
		})
	}
}
