// Package healerv1alpha1 holds the volume-healer wire protocol: the Healer service that a CSI
// driver serves on its CSI-Addons socket, the NodeHealer service that the sidecar serves to the
// controller, and small helpers that every party needs to agree on. healer.pb.go and
// healer_grpc.pb.go are generated from healer.proto by hack/generate.sh (make generate); the
// helpers in protocol.go are written by hand.
//
// It is the contract every party imports: it must not import any other package of volume-healer.
package healerv1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"slices"
	"time"
)

const (
	// Version is the protocol version this package implements.
	Version = "v1alpha1"

	// IdentityManifestKey is the key a driver puts into the manifest of its CSI-Addons
	// GetIdentity response, with the value Version, to say that it serves the Healer service.
	// The CSI-Addons Identity capabilities have no entry for healing, so the manifest carries it.
	IdentityManifestKey = "volume-healer.io/healer"

	// DefaultKubeletCSIPluginDir is where kubelet keeps the per-driver folders of CSI volumes,
	// and so the root of every staging path it hands to NodeStageVolume.
	DefaultKubeletCSIPluginDir = "/var/lib/kubelet/plugins/kubernetes.io/csi"

	// ReasonStaleMountInPods is the health reason (status INACCESSIBLE) with which a driver says
	// that the volume works on the node, but running pods still see its dead mount: their mount
	// propagation (None) keeps the repaired mount from reaching them, so only restarting those
	// pods gives them the volume back. A heal cannot do more for such a volume; the controller
	// tells the operator, on the PVC, that the pods using it must be restarted.
	ReasonStaleMountInPods = "StaleMountInPods"

	// ReasonPublishTargetNotMounted is the health reason (status INACCESSIBLE) for a publish
	// target that kubelet still has published for a pod (its vol_data.json is there) but that is
	// no longer a mount at all, as after a restarted driver's start-up cleanup unmounted it: pods
	// whose mount propagation is HostToContainer then see an empty folder on the node's own disk
	// and write there, silently. It is data going to the wrong place; the built-in policy recycles
	// such a volume on its node.
	ReasonPublishTargetNotMounted = "PublishTargetNotMounted"

	// DefaultTokenAudience is the base of the audiences of the controller's tokens for the
	// sidecars: the token for the sidecar of a node is for NodeTokenAudience(DefaultTokenAudience,
	// node) alone.
	DefaultTokenAudience = "volume-healer-sidecar"
)

// The keepalive of the controller's connections to the sidecars, which both ends must agree on: a
// client that pings more often than the server enforces gets GOAWAY (too_many_pings) and loses its
// connection, with the calls on it.
const (
	// KeepaliveMinTime is the shortest interval between a client's pings that a sidecar accepts.
	KeepaliveMinTime = 20 * time.Second
	// KeepalivePermitWithoutStream says whether a sidecar accepts pings on a connection without
	// calls in flight. It does: the controller keeps one connection per sidecar between sweeps,
	// and its pings find a sidecar on a node that vanished before the next sweep's calls wait on
	// it.
	KeepalivePermitWithoutStream = true
	// KeepaliveTime is how often the controller pings an idle connection to a sidecar: above
	// KeepaliveMinTime with a margin for timers that fire early, and short enough that a node
	// that vanished without closing its connections is found within a minute.
	KeepaliveTime = 30 * time.Second
	// KeepaliveTimeout is how long either end waits for a ping's answer before it closes the
	// connection.
	KeepaliveTimeout = 10 * time.Second
	// MaxConcurrentStreams is the most calls a sidecar serves at once on one connection; more wait
	// on the client for a slot, inside their own deadlines. The controller's budgets allow 4 per
	// node by default, so this cap only bounds what a faulty or hostile client can make a sidecar
	// (and its driver) hold at once.
	MaxConcurrentStreams = 64
)

// NodeTokenAudience is the audience of the controller's ServiceAccount token for the sidecars of
// node: "<audience>/node/<node>". The controller asks the TokenRequest API for one token per node
// with it, and each sidecar reviews the token it receives against its own node's audience, so
// that a token captured on one node opens no other node's sidecar. A node name is a DNS
// subdomain and holds no "/".
func NodeTokenAudience(audience, node string) string {
	return audience + "/node/" + node
}

// StagingTargetPath returns the staging path that kubelet gives to NodeStageVolume for a volume:
// <pluginDir>/<driverName>/<hex sha256 of volumeHandle>/globalmount. The sidecar uses it to fill
// staging_target_path, and a driver can use it to find its own staging paths. pluginDir is
// normally DefaultKubeletCSIPluginDir. Older kubelets used a layout keyed by PV name
// (<pluginDir>/pv/<pv name>/globalmount), which this function does not produce.
func StagingTargetPath(pluginDir, driverName, volumeHandle string) string {
	sum := sha256.Sum256([]byte(volumeHandle))
	return filepath.Join(pluginDir, driverName, hex.EncodeToString(sum[:]), "globalmount")
}

// NewRPCCapability returns the capability that advertises one Healer RPC, for the capabilities
// list of GetHealerCapabilitiesResponse.
func NewRPCCapability(t HealerCapability_RPC_Type) *HealerCapability {
	return &HealerCapability{Type: &HealerCapability_Rpc{Rpc: &HealerCapability_RPC{Type: t}}}
}

// HasRPC reports whether caps advertises the RPC t. Callers use it before calling an RPC: an RPC
// that is not advertised must not be called.
func HasRPC(caps []*HealerCapability, t HealerCapability_RPC_Type) bool {
	for _, c := range caps {
		if c.GetRpc().GetType() == t && t != HealerCapability_RPC_UNKNOWN {
			return true
		}
	}
	return false
}

// NewVolumeKeepingCapability returns the capability that advertises that the driver's kept
// volumes live through restarts of kind t, for the capabilities list of
// GetHealerCapabilitiesResponse.
func NewVolumeKeepingCapability(t HealerCapability_VolumeKeeping_Type) *HealerCapability {
	return &HealerCapability{Type: &HealerCapability_VolumeKeeping_{VolumeKeeping: &HealerCapability_VolumeKeeping{Type: t}}}
}

// VolumeKeepingOf returns the kinds of restart that caps advertises the driver's kept volumes
// live through, each once, in the order caps lists them; UNKNOWN and values this build does not
// know are left out, as the protocol tells a caller to ignore them.
func VolumeKeepingOf(caps []*HealerCapability) []HealerCapability_VolumeKeeping_Type {
	var out []HealerCapability_VolumeKeeping_Type
	for _, c := range caps {
		k := c.GetVolumeKeeping()
		if k == nil {
			continue
		}
		t := k.GetType()
		if t == HealerCapability_VolumeKeeping_UNKNOWN || HealerCapability_VolumeKeeping_Type_name[int32(t)] == "" || slices.Contains(out, t) {
			continue
		}
		out = append(out, t)
	}
	return out
}

// VolumeAttachmentName returns the name Kubernetes' attach/detach controller gives the
// VolumeAttachment of a CSI volume on a node: "csi-" and the hex SHA-256 of the volume handle, the
// driver name and the node name, concatenated. The sidecar reads its own node's attachment of a
// volume by this name, with a GET, instead of watching every VolumeAttachment of the cluster.
func VolumeAttachmentName(volumeHandle, driverName, nodeName string) string {
	sum := sha256.Sum256([]byte(volumeHandle + driverName + nodeName))
	return "csi-" + hex.EncodeToString(sum[:])
}

// AttachedVolumeName returns the name under which a Node's status.volumesAttached lists a CSI
// volume attached to it: kubelet's unique volume name, "kubernetes.io/csi/" and the driver name
// and the volume handle joined by "^". The attach/detach controller adds the name once the volume
// is attached and removes it before it detaches the volume, and kubelet stages an attachable
// volume only once the name is there; the sidecar checks that a volume is on its node from this
// list, watched as one object.
func AttachedVolumeName(driverName, volumeHandle string) string {
	return "kubernetes.io/csi/" + driverName + "^" + volumeHandle
}
