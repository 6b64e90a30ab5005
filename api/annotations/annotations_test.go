package annotations

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

func TestMergePatch(t *testing.T) {
	tests := map[string]struct {
		set    map[string]string
		remove []string
		want   map[string]any
	}{
		"set one": {
			set:  map[string]string{HandledMarker: "uid|t|"},
			want: map[string]any{HandledMarker: "uid|t|"},
		},
		"set JSON text as a string": {
			set:  map[string]string{VolumeStatus: `{"result":"healed"}`},
			want: map[string]any{VolumeStatus: `{"result":"healed"}`},
		},
		"remove": {
			remove: []string{VolumeStatus},
			want:   map[string]any{VolumeStatus: nil},
		},
		"set and remove": {
			set:    map[string]string{HealerRestart: "now", Endpoint: "10.0.0.1:9071"},
			remove: []string{SweepHandled},
			want:   map[string]any{HealerRestart: "now", Endpoint: "10.0.0.1:9071", SweepHandled: nil},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got struct {
				Metadata struct {
					Annotations map[string]any `json:"annotations"`
				} `json:"metadata"`
			}
			body := MergePatch(tc.set, tc.remove...)
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("patch %s does not decode: %v", body, err)
			}
			if !reflect.DeepEqual(got.Metadata.Annotations, tc.want) {
				t.Errorf("patch %s sets annotations %v, want %v", body, got.Metadata.Annotations, tc.want)
			}
		})
	}
}

func TestHealerRestartValue(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("CET", 3600))
	if got, want := HealerRestartValue(now, "0b1c"), "2026-03-01T11:00:00.123456789Z/0b1c"; got != want {
		t.Errorf("value = %q, want %q", got, want)
	}
	if got, want := HealerRestartValue(now, ""), "2026-03-01T11:00:00.123456789Z"; got != want {
		t.Errorf("value without a pod UID = %q, want %q", got, want)
	}
	for _, v := range []string{HealerRestartValue(now, "0b1c"), HealerRestartValue(now, "")} {
		if got, ok := HealerRestartTime(v); !ok || !got.Equal(now) {
			t.Errorf("HealerRestartTime(%q) = %v, %v; want %v", v, got, ok, now)
		}
	}
	if _, ok := HealerRestartTime("r7"); ok {
		t.Error("a value without a time read as one")
	}
}
