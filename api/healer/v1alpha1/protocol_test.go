package healerv1alpha1_test

import (
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

func TestStagingTargetPath(t *testing.T) {
	tests := map[string]struct {
		pluginDir, driver, handle string
		want                      string
	}{
		"ceph rbd volume handle under the default kubelet folder": {
			pluginDir: healerv1alpha1.DefaultKubeletCSIPluginDir,
			driver:    "rbd.csi.ceph.com",
			handle:    "0001-0009-rook-ceph-0000000000000002-7c1e2d3f-4a5b-11ef-9c1d-0a580a810212",
			want:      "/var/lib/kubelet/plugins/kubernetes.io/csi/rbd.csi.ceph.com/7e7225c075d8b5241bb5a63188ba52b367b193c8a871b62b029d37f4645d2e13/globalmount",
		},
		"custom kubelet root": {
			pluginDir: "/data/kubelet/plugins/kubernetes.io/csi",
			driver:    "healer.example.com",
			handle:    "vol-1",
			want:      "/data/kubelet/plugins/kubernetes.io/csi/healer.example.com/d2e8363faaac7ae76def3b14091d8eb5755f6b92e9531627aeec833a8731cc49/globalmount",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := healerv1alpha1.StagingTargetPath(tt.pluginDir, tt.driver, tt.handle); got != tt.want {
				t.Errorf("StagingTargetPath() = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestHasRPC(t *testing.T) {
	probeAndHeal := []*healerv1alpha1.HealerCapability{
		healerv1alpha1.NewRPCCapability(healerv1alpha1.HealerCapability_RPC_PROBE),
		nil, // a driver sending an empty entry must not confuse the lookup
		healerv1alpha1.NewRPCCapability(healerv1alpha1.HealerCapability_RPC_HEAL),
	}
	tests := map[string]struct {
		caps []*healerv1alpha1.HealerCapability
		rpc  healerv1alpha1.HealerCapability_RPC_Type
		want bool
	}{
		"advertised":       {caps: probeAndHeal, rpc: healerv1alpha1.HealerCapability_RPC_HEAL, want: true},
		"not advertised":   {caps: probeAndHeal, rpc: healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES, want: false},
		"empty list":       {caps: nil, rpc: healerv1alpha1.HealerCapability_RPC_PROBE, want: false},
		"UNKNOWN never is": {caps: []*healerv1alpha1.HealerCapability{{}}, rpc: healerv1alpha1.HealerCapability_RPC_UNKNOWN, want: false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := healerv1alpha1.HasRPC(tt.caps, tt.rpc); got != tt.want {
				t.Errorf("HasRPC(%s) = %t, want %t", tt.rpc, got, tt.want)
			}
		})
	}
}

func TestVolumeKeepingOf(t *testing.T) {
	plugin := healerv1alpha1.NewVolumeKeepingCapability(healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART)
	mounter := healerv1alpha1.NewVolumeKeepingCapability(healerv1alpha1.HealerCapability_VolumeKeeping_MOUNTER_RESTART)
	probe := healerv1alpha1.NewRPCCapability(healerv1alpha1.HealerCapability_RPC_PROBE)
	tests := map[string]struct {
		caps []*healerv1alpha1.HealerCapability
		want []healerv1alpha1.HealerCapability_VolumeKeeping_Type
	}{
		"RPCs only keep nothing": {caps: []*healerv1alpha1.HealerCapability{probe}},
		"both, in the driver's order": {caps: []*healerv1alpha1.HealerCapability{mounter, probe, nil, plugin},
			want: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_MOUNTER_RESTART, healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART}},
		"a repeated entry counts once": {caps: []*healerv1alpha1.HealerCapability{plugin, plugin},
			want: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART}},
		"UNKNOWN and unknown values are ignored": {caps: []*healerv1alpha1.HealerCapability{
			healerv1alpha1.NewVolumeKeepingCapability(healerv1alpha1.HealerCapability_VolumeKeeping_UNKNOWN),
			healerv1alpha1.NewVolumeKeepingCapability(99),
		}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := healerv1alpha1.VolumeKeepingOf(tt.caps); !slices.Equal(got, tt.want) {
				t.Errorf("VolumeKeepingOf = %v, want %v", got, tt.want)
			}
		})
	}
}

// The csi.proto import must resolve to the descriptor the CSI Go bindings register; otherwise
// the reused CSI messages would be placeholders to reflection (protojson, gRPC reflection).
func TestCSIImportResolves(t *testing.T) {
	imports := healerv1alpha1.File_healer_v1alpha1_healer_proto.Imports()
	found := false
	for i := range imports.Len() {
		imp := imports.Get(i)
		if imp.Path() != "csi.proto" {
			continue
		}
		found = true
		if imp.IsPlaceholder() {
			t.Errorf("import csi.proto is a placeholder: the CSI bindings register it under another name")
		}
	}
	if !found {
		t.Fatalf("healer.proto does not import csi.proto")
	}
}

// Secrets must carry the csi_secret option, which is how loggers and the sidecar know to redact
// them.
func TestSecretsAreMarkedSensitive(t *testing.T) {
	for _, msg := range []proto.Message{&healerv1alpha1.ProbeVolumeRequest{}, &healerv1alpha1.HealVolumeRequest{}} {
		desc := msg.ProtoReflect().Descriptor()
		f := desc.Fields().ByName(protoreflect.Name("secrets"))
		if f == nil {
			t.Fatalf("%s has no secrets field", desc.FullName())
		}
		if !proto.GetExtension(f.Options(), csi.E_CsiSecret).(bool) {
			t.Errorf("%s.secrets is not marked csi_secret", desc.FullName())
		}
	}
}

func TestServiceNames(t *testing.T) {
	// The sidecar and drivers find each other by these names; renaming them breaks the wire.
	if got, want := healerv1alpha1.Healer_ServiceDesc.ServiceName, "healer.v1alpha1.Healer"; got != want {
		t.Errorf("driver-facing service = %s, want %s", got, want)
	}
	if got, want := healerv1alpha1.NodeHealer_ServiceDesc.ServiceName, "healer.v1alpha1.NodeHealer"; got != want {
		t.Errorf("controller-facing service = %s, want %s", got, want)
	}
}
