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
		"set one, remove its previous key": {
			set: map[string]string{HandledMarker: "uid|t|"},
			want: map[string]any{"volume-healer.io/handled-marker": "uid|t|",
				"healer.csiaddons.openshift.io/handled-marker": nil},
		},
		"set JSON text as a string": {
			set: map[string]string{VolumeStatus: `{"result":"healed"}`},
			want: map[string]any{"volume-healer.io/status": `{"result":"healed"}`,
				"healer.csiaddons.openshift.io/status": nil},
		},
		"remove both keys": {
			remove: []string{VolumeStatus},
			want:   map[string]any{"volume-healer.io/status": nil, "healer.csiaddons.openshift.io/status": nil},
		},
		"set and remove": {
			set:    map[string]string{HealerRestart: "now", Endpoint: "10.0.0.1:9071"},
			remove: []string{SweepHandled},
			want: map[string]any{
				"volume-healer.io/restarted-at": "now", "healer.csiaddons.openshift.io/restarted-at": nil,
				"volume-healer.io/endpoint": "10.0.0.1:9071", "healer.csiaddons.openshift.io/endpoint": nil,
				"volume-healer.io/sweep-handled": nil, "healer.csiaddons.openshift.io/sweep-handled": nil,
			},
		},
		"a key of the csi-addons sidecar has no previous key": {
			set:  map[string]string{CSIAddonsRestart: "2026-01-01T00:00:00Z"},
			want: map[string]any{"sidecar.csiaddons.openshift.io/lastUpdatedAt": "2026-01-01T00:00:00Z"},
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

func TestLabeledMergePatch(t *testing.T) {
	var got struct {
		Metadata struct {
			Annotations map[string]any `json:"annotations"`
			Labels      map[string]any `json:"labels"`
		} `json:"metadata"`
	}
	body := LabeledMergePatch(map[string]string{Endpoint: "10.0.0.1:9071"}, map[string]string{Registration: "ab12"})
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("patch %s does not decode: %v", body, err)
	}
	wantLabels := map[string]any{"volume-healer.io/registration": "ab12", "healer.csiaddons.openshift.io/registration": nil}
	if !reflect.DeepEqual(got.Metadata.Labels, wantLabels) {
		t.Errorf("patch %s sets labels %v, want %v", body, got.Metadata.Labels, wantLabels)
	}
	wantAnnotations := map[string]any{"volume-healer.io/endpoint": "10.0.0.1:9071", "healer.csiaddons.openshift.io/endpoint": nil}
	if !reflect.DeepEqual(got.Metadata.Annotations, wantAnnotations) {
		t.Errorf("patch %s sets annotations %v, want %v", body, got.Metadata.Annotations, wantAnnotations)
	}
}

// TestKeysOfBothReleases pins every key this release writes and the key of release 0.1.0 it
// still reads: an object written by either is understood, and the new key wins where both are.
func TestKeysOfBothReleases(t *testing.T) {
	tests := map[string]struct {
		key, written, previous string
	}{
		"restart marker":          {HealerRestart, "volume-healer.io/restarted-at", "healer.csiaddons.openshift.io/restarted-at"},
		"sidecar endpoint":        {Endpoint, "volume-healer.io/endpoint", "healer.csiaddons.openshift.io/endpoint"},
		"handled restart marker":  {HandledMarker, "volume-healer.io/handled-marker", "healer.csiaddons.openshift.io/handled-marker"},
		"registration label":      {Registration, "volume-healer.io/registration", "healer.csiaddons.openshift.io/registration"},
		"manual sweep request":    {SweepRequest, "volume-healer.io/sweep", "healer.csiaddons.openshift.io/sweep"},
		"manual sweep handled":    {SweepHandled, "volume-healer.io/sweep-handled", "healer.csiaddons.openshift.io/sweep-handled"},
		"StorageClass schedule":   {Schedule, "volume-healer.io/schedule", "healer.csiaddons.openshift.io/schedule"},
		"evict-pods opt-in label": {EvictPodsLabel, "volume-healer.io/evict-pods", "healer.csiaddons.openshift.io/evict-pods"},
		"PVC status":              {VolumeStatus, "volume-healer.io/status", "healer.csiaddons.openshift.io/status"},
		"policy ConfigMap label":  {PolicyLabel, "volume-healer.io/policy", "healer.csiaddons.openshift.io/policy"},
		"policy status":           {PolicyStatus, "volume-healer.io/policy-status", "healer.csiaddons.openshift.io/policy-status"},
		"last good revision":      {PolicyLastGoodRevision, "volume-healer.io/policy-last-good-revision", "healer.csiaddons.openshift.io/policy-last-good-revision"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.key != tc.written {
				t.Errorf("key = %q, want %q", tc.key, tc.written)
			}
			if got := Previous(tc.key); got != tc.previous {
				t.Errorf("Previous(%q) = %q, want %q", tc.key, got, tc.previous)
			}
			if got, want := Keys(tc.key), []string{tc.written, tc.previous}; !reflect.DeepEqual(got, want) {
				t.Errorf("Keys(%q) = %q, want %q", tc.key, got, want)
			}
			objects := map[string]struct {
				m       map[string]string
				want    string
				present bool
			}{
				"written by 0.1.0":   {map[string]string{tc.previous: "old", "other": "x"}, "old", true},
				"written by now":     {map[string]string{tc.written: "new"}, "new", true},
				"both, the new wins": {map[string]string{tc.previous: "old", tc.written: "new"}, "new", true},
				"new and empty wins": {map[string]string{tc.previous: "old", tc.written: ""}, "", true},
				"neither":            {map[string]string{"other": "x"}, "", false},
				"no map":             {nil, "", false},
			}
			for object, o := range objects {
				if got, present := Get(o.m, tc.key); got != o.want || present != o.present {
					t.Errorf("%s: Get = %q, %v; want %q, %v", object, got, present, o.want, o.present)
				}
				if got := Value(o.m, tc.key); got != o.want {
					t.Errorf("%s: Value = %q, want %q", object, got, o.want)
				}
			}
		})
	}
	for _, key := range []string{CSIAddonsRestart, CSIAddonsPod, "example.com/other"} {
		if p := Previous(key); p != "" {
			t.Errorf("Previous(%q) = %q, want none", key, p)
		}
		if got := Keys(key); !reflect.DeepEqual(got, []string{key}) {
			t.Errorf("Keys(%q) = %q, want only the key", key, got)
		}
	}
}
