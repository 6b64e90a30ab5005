package policy

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

func TestDecodeDecision(t *testing.T) {
	tests := map[string]struct {
		value   string
		want    Decision
		wantErr string
	}{
		"recycle":  {value: `{"action": "recycle", "reason": "RecycleAfterRestart"}`, want: Decision{Action: ActionRecycle, Reason: "RecycleAfterRestart"}},
		"minimal":  {value: `{"action": "skip", "reason": "Healthy"}`, want: Decision{Action: ActionSkip, Reason: "Healthy"}},
		"complete": {value: `{"action": "heal", "reason": "MountGone", "timeout": "1m30s", "priority": 100}`, want: Decision{Action: ActionHeal, Reason: "MountGone", Timeout: 90 * time.Second, Priority: 100}},
		"negative priority": {value: `{"action": "probe", "reason": "r", "priority": -5}`,
			want: Decision{Action: ActionProbe, Reason: "r", Priority: -5}},
		"integral float priority": {value: `{"action": "probe", "reason": "r", "priority": 2.0}`,
			want: Decision{Action: ActionProbe, Reason: "r", Priority: 2}},
		"string":               {value: `"skip"`, wantErr: "decision is string"},
		"set":                  {value: `{"skip"}`, wantErr: "decision is set"},
		"array":                {value: `[{"action": "skip", "reason": "r"}]`, wantErr: "decision is array"},
		"missing action":       {value: `{"reason": "r"}`, wantErr: "action is missing"},
		"missing reason":       {value: `{"action": "skip"}`, wantErr: "reason is missing"},
		"empty reason":         {value: `{"action": "skip", "reason": ""}`, wantErr: "reason is empty"},
		"unknown action":       {value: `{"action": "repair", "reason": "r"}`, wantErr: `action "repair" is not one of probe, heal, skip, recycle`},
		"action not a string":  {value: `{"action": true, "reason": "r"}`, wantErr: "action is boolean"},
		"reason not a string":  {value: `{"action": "skip", "reason": 7}`, wantErr: "reason is number"},
		"timeout not a string": {value: `{"action": "heal", "reason": "r", "timeout": 30}`, wantErr: "timeout is number"},
		"timeout unparsable":   {value: `{"action": "heal", "reason": "r", "timeout": "30 seconds"}`, wantErr: `timeout "30 seconds"`},
		"timeout not positive": {value: `{"action": "heal", "reason": "r", "timeout": "-1s"}`, wantErr: "not positive"},
		"priority fractional":  {value: `{"action": "heal", "reason": "r", "priority": 1.5}`, wantErr: "priority 1.5 is not an integer"},
		"priority too large":   {value: `{"action": "heal", "reason": "r", "priority": 3000000000}`, wantErr: "is not an integer between"},
		"priority a string":    {value: `{"action": "heal", "reason": "r", "priority": "high"}`, wantErr: "priority is string"},
		"unknown key":          {value: `{"action": "skip", "reason": "r", "colour": "red"}`, wantErr: `unknown key "colour"`},
		"non-string key":       {value: `{"action": "skip", "reason": "r", 1: 2}`, wantErr: "key 1 is not a string"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := decodeDecision(ast.MustParseTerm(tc.value).Value)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalidDecision) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("decoding %s: error %v, want ErrInvalidDecision mentioning %q", tc.value, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("decoding %s: %v", tc.value, err)
			}
			if got != tc.want {
				t.Errorf("decoding %s: %+v, want %+v", tc.value, got, tc.want)
			}
		})
	}
}

func TestDecisionJSONIsThePolicyForm(t *testing.T) {
	tests := map[string]struct {
		decision Decision
		want     string
	}{
		"optional fields left out": {Decision{Action: ActionSkip, Reason: "Healthy"}, `{"action":"skip","reason":"Healthy"}`},
		"timeout as Go duration": {Decision{Action: ActionHeal, Reason: "r", Timeout: 90 * time.Second, Priority: 7},
			`{"action":"heal","reason":"r","timeout":"1m30s","priority":7}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b, err := json.Marshal(tc.decision)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Fatalf("JSON %s, want %s", b, tc.want)
			}
			back, err := decodeDecision(ast.MustParseTerm(string(b)).Value)
			if err != nil || back != tc.decision {
				t.Fatalf("decoding %s again: %+v, %v", b, back, err)
			}
		})
	}
}
