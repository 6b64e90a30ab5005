package main

import (
	"slices"
	"testing"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

func TestParseVolumes(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    []string
		wantErr bool
	}{
		"empty keeps the driver's default set": {in: "", want: nil},
		"a count names vol-1 to vol-N":         {in: "3", want: []string{"vol-1", "vol-2", "vol-3"}},
		"a list is taken as is":                {in: "pvc-a, pvc-b,,", want: []string{"pvc-a", "pvc-b"}},
		"zero creates none":                    {in: "0", want: []string{}},
		"a negative count is an error":         {in: "-2", wantErr: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseVolumes(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseVolumes(%q) error = %v, want error %t", tt.in, err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
				t.Errorf("parseVolumes(%q) = %#v, want %#v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseCapabilities(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    []healerv1alpha1.HealerCapability_RPC_Type
		wantErr bool
	}{
		"all three": {in: "probe,heal,list", want: []healerv1alpha1.HealerCapability_RPC_Type{
			healerv1alpha1.HealerCapability_RPC_PROBE, healerv1alpha1.HealerCapability_RPC_HEAL, healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES,
		}},
		"probe only": {in: "probe", want: []healerv1alpha1.HealerCapability_RPC_Type{healerv1alpha1.HealerCapability_RPC_PROBE}},
		"a typo":     {in: "probe,heel", wantErr: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseCapabilities(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseCapabilities(%q) error = %v, want error %t", tt.in, err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("parseCapabilities(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}
