package main

import (
	"context"
	"slices"
	"strings"
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

func TestRunRejectsFlags(t *testing.T) {
	base := []string{"--endpoint", "unix:///nonexistent/refdriver.sock", "--state-dir", "/nonexistent/refdriver-state"}
	tests := map[string]struct {
		args []string
		want []string
	}{
		"real mode has no seed volumes": {
			args: append([]string{"--volumes", "3"}, base...),
			want: []string{"--volumes", "real mode"},
		},
		"real mode names every meaningless flag": {
			args: append([]string{"--mode", "real", "--heal-mounters", "fuse", "--default-hang", "1s", "--staging-root", "/x"}, base...),
			want: []string{"--staging-root", "--heal-mounters", "--default-hang", "real mode"},
		},
		"simulated mode has no CSI socket": {
			args: append([]string{"--mode", "simulated", "--csi-endpoint", "unix:///nonexistent/csi.sock"}, base...),
			want: []string{"--csi-endpoint", "simulated mode"},
		},
		"simulated mode stats nothing": {
			args: append([]string{"--mode", "simulated", "--stat-timeout", "1s"}, base...),
			want: []string{"--stat-timeout", "simulated mode"},
		},
		"an unknown mode": {
			args: append([]string{"--mode", "fake"}, base...),
			want: []string{`"fake"`, "real or simulated"},
		},
		"no endpoint": {
			args: []string{"--state-dir", "/nonexistent"},
			want: []string{"--endpoint and --state-dir are required"},
		},
		"a stray argument": {
			args: append(slices.Clone(base), "mount"),
			want: []string{"unexpected arguments", "mounter"},
		},
		"a mounter without a source": {
			args: []string{"mounter", "--target", "/nonexistent"},
			want: []string{"--source and --target are required"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), tt.args)
			if err == nil {
				t.Fatalf("run(%q) = nil, want an error", tt.args)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("run(%q) = %q, want it to mention %q", tt.args, err, w)
				}
			}
		})
	}
}

func TestRunVersionNeedsNoOtherFlag(t *testing.T) {
	if err := run(context.Background(), []string{"--version"}); err != nil {
		t.Errorf("run(--version) = %v, want nil", err)
	}
}
