package sidecar

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// The sidecar's caches of what it read from the API server. They hold what the node's volumes
// need and nothing of the rest of the cluster, so that the sidecar's memory and its load on the
// API server follow its own node's volumes, not the cluster's.
const (
	// volumeCacheSize bounds each cache: PVs, attachments, volume handles and node-stage
	// Secrets. A node with more volumes than this reads the oldest again.
	volumeCacheSize = 1024
	// pvCacheTTL is how long a PV read is used. What the sidecar reads of a PV (spec.csi, access
	// modes, volume mode, mount options) does not change while the PV exists.
	pvCacheTTL = 5 * time.Minute
	// staleFor is how long an object read stays usable while the API server cannot be reached
	// (not for an object that is gone, nor for a refusal): calls are answered through an outage
	// with what was last read, as informer caches would.
	staleFor = 30 * time.Minute
	// apiTimeout bounds each GET.
	apiTimeout = 10 * time.Second
	// probeAttachmentFresh is how long a probe goes by an "attached here" read of an earlier call
	// instead of reading the VolumeAttachment again (only while the sidecar cannot read its Node,
	// onNode). A probe changes nothing, and a volume leaves a node only after
	// kubelet unstaged it there: a probe of a volume that left within this time reaches a driver
	// that staged it here before and answers that it is not staged. A heal, which stages again,
	// and every "not attached here" are read again at every call.
	probeAttachmentFresh = time.Minute
)

// fromWatchCache are the options of every GET: resourceVersion "0" lets the API server answer
// from its watch cache instead of a quorum read of etcd. A call of an older controller reads its
// PV and VolumeAttachment, and a heal its Secret; in a rollout that is one read per
// call in flight over the whole cluster, and quorum reads made the API server and etcd the
// bottleneck of the calls. The watch cache trails etcd by the time a watch event takes to arrive,
// the freshness an informer of these objects would give; the controller checks its own caches
// again before each call, and the driver's per-volume lock orders the call with kubelet's.
var fromWatchCache = metav1.GetOptions{ResourceVersion: "0"}

// leanPersistentVolume keeps of a PersistentVolume what resolving it for the driver reads, for the
// sidecar's cache of PVs.
func leanPersistentVolume(pv *corev1.PersistentVolume) *corev1.PersistentVolume {
	lean := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pv.Name, UID: pv.UID, ResourceVersion: pv.ResourceVersion},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes: pv.Spec.AccessModes, MountOptions: pv.Spec.MountOptions, VolumeMode: pv.Spec.VolumeMode,
		},
	}
	if src := pv.Spec.CSI; src != nil {
		lean.Spec.CSI = &corev1.CSIPersistentVolumeSource{
			Driver: src.Driver, VolumeHandle: src.VolumeHandle, ReadOnly: src.ReadOnly, FSType: src.FSType,
			VolumeAttributes: src.VolumeAttributes, NodeStageSecretRef: src.NodeStageSecretRef,
		}
	}
	return lean
}

// volume is a PersistentVolume resolved into what the driver's Healer calls need.
type volume struct {
	pvName      string
	volumeID    string
	stagingPath string
	context     map[string]string
	capability  *csi.VolumeCapability
	// secretRef names the node-stage Secret, read into secrets once the volume is known to be on
	// this node.
	secretRef *corev1.SecretReference
	secrets   map[string]string
	// block is a raw block volume; readOnly a PV whose spec.csi.readOnly is set.
	block, readOnly bool
	// publishTargets are where kubelet's records on this node show the volume published, one
	// per pod, once the volume is known to be on this node.
	publishTargets []string
}

// volumes builds the volumes of calls from the caller's facts, and reads by name what a call needs
// beyond them: the node-stage Secret of a heal, kept briefly in a small bounded cache, and, for a
// call of an older controller, the PV (cached too) and its VolumeAttachment on this node. It lists
// and watches nothing: a cluster of 40,000 PVs costs the sidecar what its own node's volumes cost.
type volumes struct {
	client     kubernetes.Interface
	nodeName   string
	kubeletDir string

	// pvs holds lean PVs by name; attachments whether a VolumeAttachment name attaches a PV here,
	// by "<VolumeAttachment>/<PV>"; secrets the data of node-stage Secrets by "namespace/name".
	pvs         *readCache
	attachments *readCache
	secrets     *readCache
	// handles holds PV names by driver and volume handle, for the volumes the driver lists.
	handles *utilcache.LRUExpireCache
}

// readCache keeps what the sidecar read from the API server, at most volumeCacheSize entries.
// An entry is used while it is fresh; after that it is read again, and while the API server
// cannot be reached the last value read is used up to staleFor.
type readCache struct {
	lru   *utilcache.LRUExpireCache
	fresh time.Duration
	clock clock.PassiveClock
}

// cached is one value read, and when.
type cached struct {
	value any
	at    time.Time
}

func newReadCache(fresh time.Duration, clk clock.PassiveClock) *readCache {
	return &readCache{lru: utilcache.NewLRUExpireCacheWithClock(volumeCacheSize, clk), fresh: fresh, clock: clk}
}

// recent returns the value of key if it was read less than within ago.
func (c *readCache) recent(key string, within time.Duration) (any, bool) {
	e, ok := c.lru.Get(key)
	if !ok || c.clock.Since(e.(cached).at) >= within {
		return nil, false
	}
	return e.(cached).value, true
}

// get returns the value of key: from the cache while fresh, else from read. When read fails
// because the API server is unreachable, it returns the last value read, if any, not older than
// staleFor, and the failure otherwise.
func (c *readCache) get(key string, read func() (any, error)) (any, error) {
	e, ok := c.lru.Get(key)
	if ok && c.clock.Since(e.(cached).at) < c.fresh {
		return e.(cached).value, nil
	}
	v, err := read()
	if err == nil {
		c.lru.Add(key, cached{value: v, at: c.clock.Now()}, staleFor)
		return v, nil
	}
	if ok && unreachable(err) {
		return e.(cached).value, nil
	}
	return nil, err
}

// unreachable tells an API server that could not answer (a connection refused, a timeout, a 5xx
// or 429) from one that answered no: an object that does not exist, or a refusal.
func unreachable(err error) bool {
	return !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) &&
		!apierrors.IsBadRequest(err) && !apierrors.IsInvalid(err)
}

func newVolumes(client kubernetes.Interface, o *Options) *volumes {
	clk := o.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &volumes{
		client:      client,
		nodeName:    o.NodeName,
		kubeletDir:  o.KubeletDir,
		pvs:         newReadCache(pvCacheTTL, clk),
		attachments: newReadCache(0, clk),
		secrets:     newReadCache(o.SecretCacheTTL, clk),
		handles:     utilcache.NewLRUExpireCacheWithClock(volumeCacheSize, clk),
	}
}

func driverHandleKey(driver, handle string) string {
	// NUL cannot occur in a driver name, so the key is unambiguous.
	return driver + "\x00" + handle
}

// persistentVolume returns the PV named name, from the cache or with one GET.
func (v *volumes) persistentVolume(ctx context.Context, name string) (*corev1.PersistentVolume, error) {
	obj, err := v.pvs.get(name, func() (any, error) {
		gctx, cancel := context.WithTimeout(ctx, apiTimeout)
		defer cancel()
		pv, err := v.client.CoreV1().PersistentVolumes().Get(gctx, name, fromWatchCache)
		if err != nil {
			return nil, err
		}
		return leanPersistentVolume(pv), nil
	})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: %q does not exist", ErrPVNotFound, name)
	case err != nil:
		return nil, fmt.Errorf("%w: get PersistentVolume %q: %w", ErrNotReady, name, err)
	}
	pv := obj.(*corev1.PersistentVolume)
	if pv.Spec.CSI != nil {
		v.handles.Add(driverHandleKey(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle), name, staleFor)
	}
	return pv, nil
}

// attachedHere reports whether PersistentVolume pvName, of volume handle handle, is attached to
// the sidecar's node by driverName: its VolumeAttachment there (named as the attach/detach
// controller names it) is for this PV, attached, and not being deleted (the volume is
// detaching). It is read from the API server's watch cache (fromWatchCache) at every call,
// attachment being what the sidecar's trust rests on, except that an "attached" read less than
// reuse ago is taken as it is (probeAttachmentFresh, for probes); only while the API server
// cannot be reached is the last answer used.
func (v *volumes) attachedHere(ctx context.Context, driverName, pvName, handle string, reuse time.Duration) (bool, error) {
	name := healerv1alpha1.VolumeAttachmentName(handle, driverName, v.nodeName)
	key := name + "/" + pvName
	if reuse > 0 {
		if was, ok := v.attachments.recent(key, reuse); ok && was.(bool) {
			return true, nil
		}
	}
	attached, err := v.attachments.get(key, func() (any, error) {
		gctx, cancel := context.WithTimeout(ctx, apiTimeout)
		defer cancel()
		va, err := v.client.StorageV1().VolumeAttachments().Get(gctx, name, fromWatchCache)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return nil, err
		}
		return isAttachedHere(va, driverName, pvName, v.nodeName), nil
	})
	if err != nil {
		return false, fmt.Errorf("%w: get VolumeAttachment %s of PersistentVolume %q on node %q: %w", ErrNotReady, name, pvName, v.nodeName, err)
	}
	return attached.(bool), nil
}

func isAttachedHere(va *storagev1.VolumeAttachment, driverName, pvName, node string) bool {
	src := va.Spec.Source.PersistentVolumeName
	return va.Spec.NodeName == node && va.Spec.Attacher == driverName && src != nil && *src == pvName &&
		va.Status.Attached && va.DeletionTimestamp == nil
}

// resolve reads the PV named pvName and builds the request fields the driver needs. The PV must
// be a CSI volume of driverName. It serves callers that send no VolumeFacts.
func (v *volumes) resolve(ctx context.Context, driverName, pvName string) (*volume, error) {
	pv, err := v.persistentVolume(ctx, pvName)
	if err != nil {
		return nil, err
	}
	return v.volumeOf(driverName, pv)
}

// fromFacts builds the volume from the caller's facts about PersistentVolume pvName, reading
// nothing: the facts must describe a CSI volume of driverName. Whether the volume is on this
// node is not taken from them (onNode).
func (v *volumes) fromFacts(driverName, pvName string, f *healerv1alpha1.VolumeFacts) (*volume, error) {
	pv, err := persistentVolumeOf(pvName, f)
	if err != nil {
		return nil, err
	}
	vol, err := v.volumeOf(driverName, pv)
	if err != nil {
		return nil, err
	}
	v.handles.Add(driverHandleKey(driverName, vol.volumeID), pvName, staleFor)
	return vol, nil
}

// persistentVolumeOf is the PersistentVolume that VolumeFacts describe, with the fields
// leanPersistentVolume keeps, or an ErrInvalidRequest naming the field that is not valid.
func persistentVolumeOf(pvName string, f *healerv1alpha1.VolumeFacts) (*corev1.PersistentVolume, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: volume facts of PersistentVolume %q: %s", ErrInvalidRequest, pvName, fmt.Sprintf(format, args...))
	}
	if f.GetDriverName() == "" {
		return nil, bad("driver_name is required")
	}
	if f.GetVolumeHandle() == "" {
		return nil, bad("volume_handle is required")
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			MountOptions: f.GetMountOptions(),
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: f.GetDriverName(), VolumeHandle: f.GetVolumeHandle(), ReadOnly: f.GetReadOnly(),
				FSType: f.GetFsType(), VolumeAttributes: f.GetVolumeContext(),
			}},
		},
	}
	for _, m := range f.GetAccessModes() {
		mode := corev1.PersistentVolumeAccessMode(m)
		if _, ok := accessModes[mode]; !ok {
			return nil, bad("access mode %q is not one of ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod", m)
		}
		pv.Spec.AccessModes = append(pv.Spec.AccessModes, mode)
	}
	switch mode := corev1.PersistentVolumeMode(f.GetVolumeMode()); mode {
	case "":
	case corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeBlock:
		pv.Spec.VolumeMode = &mode
	default:
		return nil, bad("volume_mode %q is neither Filesystem nor Block", f.GetVolumeMode())
	}
	if ref := f.GetNodeStageSecretRef(); ref != nil {
		if ref.GetNamespace() == "" || ref.GetName() == "" {
			return nil, bad("node_stage_secret_ref needs both namespace and name, got %q/%q", ref.GetNamespace(), ref.GetName())
		}
		pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: ref.GetNamespace(), Name: ref.GetName()}
	}
	return pv, nil
}

// volumeOf builds the request fields the driver needs from pv, which must be a CSI volume of
// driverName.
func (v *volumes) volumeOf(driverName string, pv *corev1.PersistentVolume) (*volume, error) {
	src := pv.Spec.CSI
	if src == nil {
		return nil, fmt.Errorf("%w: %q has no spec.csi", ErrNotCSIVolume, pv.Name)
	}
	if src.Driver != driverName {
		return nil, fmt.Errorf("%w: %q belongs to driver %q, this sidecar serves %q", ErrOtherDriver, pv.Name, src.Driver, driverName)
	}
	return &volume{
		pvName:      pv.Name,
		volumeID:    src.VolumeHandle,
		stagingPath: stagingPath(v.kubeletDir, pv),
		context:     src.VolumeAttributes,
		capability:  volumeCapability(pv),
		secretRef:   src.NodeStageSecretRef,
		block:       isBlock(pv),
		readOnly:    src.ReadOnly,
	}, nil
}

// stageSecrets reads the node-stage Secret of vol's PV, if it names one: called only once the
// volume is known to be on this node, so that the sidecar reads no Secret for another node's
// volume.
func (v *volumes) stageSecrets(ctx context.Context, vol *volume) error {
	ref := vol.secretRef
	if ref == nil {
		return nil
	}
	secrets, err := v.secret(ctx, ref.Namespace, ref.Name)
	if err != nil {
		return fmt.Errorf("PersistentVolume %q: %w", vol.pvName, err)
	}
	vol.secrets = secrets
	return nil
}

// secret returns the data of a Secret as the strings NodeStageVolume received, from the cache or
// with one GET.
func (v *volumes) secret(ctx context.Context, namespace, name string) (map[string]string, error) {
	key := namespace + "/" + name
	data, err := v.secrets.get(key, func() (any, error) {
		gctx, cancel := context.WithTimeout(ctx, apiTimeout)
		defer cancel()
		s, err := v.client.CoreV1().Secrets(namespace).Get(gctx, name, fromWatchCache)
		if err != nil {
			return nil, err
		}
		out := make(map[string]string, len(s.Data))
		for k, val := range s.Data {
			out[k] = string(val)
		}
		return out, nil
	})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: %s (create it, or fix the PersistentVolume's nodeStageSecretRef)", ErrSecretNotFound, key)
	case err != nil:
		return nil, fmt.Errorf("%w: Secret %s (the sidecar needs get on Secrets in namespace %q): %w", ErrSecretsUnavailable, key, namespace, err)
	}
	return data.(map[string]string), nil
}

// pvNameFor returns the PV of driverName whose volume handle is volumeID, among the PVs the
// sidecar read recently, or "" (the controller maps the volume itself).
func (v *volumes) pvNameFor(driverName, volumeID string) string {
	if name, ok := v.handles.Get(driverHandleKey(driverName, volumeID)); ok {
		return name.(string)
	}
	return ""
}

// stagingPath is the path kubelet gives NodeStageVolume for the PV: for a filesystem volume
// <kubelet>/plugins/kubernetes.io/csi/<driver>/<sha256 of handle>/globalmount, for a raw block
// volume <kubelet>/plugins/kubernetes.io/csi/volumeDevices/staging/<pv name>.
func stagingPath(kubeletDir string, pv *corev1.PersistentVolume) string {
	pluginDir := filepath.Join(kubeletDir, "plugins", "kubernetes.io", "csi")
	if isBlock(pv) {
		return filepath.Join(pluginDir, "volumeDevices", "staging", pv.Name)
	}
	return healerv1alpha1.StagingTargetPath(pluginDir, pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle)
}

func isBlock(pv *corev1.PersistentVolume) bool {
	return pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock
}

// accessModes maps a PV access mode to the CSI access mode kubelet sends for it to a driver
// without the SINGLE_NODE_MULTI_WRITER capability (the sidecar cannot see that capability).
var accessModes = map[corev1.PersistentVolumeAccessMode]csi.VolumeCapability_AccessMode_Mode{
	corev1.ReadWriteOnce:    csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	corev1.ReadOnlyMany:     csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
	corev1.ReadWriteMany:    csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
	corev1.ReadWriteOncePod: csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
}

// volumeCapability builds the capability kubelet staged the volume with: the first access mode
// of the PV (kubelet's choice too; ReadWriteOnce when there is none), block for a Block
// volumeMode, else mount with the PV's fsType and mount options.
func volumeCapability(pv *corev1.PersistentVolume) *csi.VolumeCapability {
	mode := corev1.ReadWriteOnce
	if len(pv.Spec.AccessModes) > 0 {
		mode = pv.Spec.AccessModes[0]
	}
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: accessModes[mode]}}
	if isBlock(pv) {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		return c
	}
	c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
		FsType:     pv.Spec.CSI.FSType,
		MountFlags: slices.Clone(pv.Spec.MountOptions),
	}}
	return c
}
