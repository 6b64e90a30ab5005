package sidecar

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// pvByHandleIndex indexes PersistentVolumes by CSI driver and volume handle, so that a volume
// ID from the driver maps back to its PV without a scan.
const pvByHandleIndex = "csiDriverVolumeHandle"

func driverHandleKey(driver, handle string) string {
	// NUL cannot occur in a driver name, so the key is unambiguous.
	return driver + "\x00" + handle
}

func indexByDriverHandle(obj any) ([]string, error) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.CSI == nil {
		return nil, nil
	}
	return []string{driverHandleKey(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle)}, nil
}

// PersistentVolumeIndexers are the indexes of the sidecar's PersistentVolume informer: by driver
// and volume handle, to name the PV of a volume the driver lists.
func PersistentVolumeIndexers() cache.Indexers {
	return cache.Indexers{pvByHandleIndex: indexByDriverHandle}
}

// LeanPersistentVolume is the transform of the sidecar's PersistentVolume informer: it keeps of a
// PersistentVolume what resolving it for the driver reads. The
// sidecar caches every PV of the cluster (a field selector cannot pick a node's PVs), so every
// byte dropped here is saved once per PV on every node.
func LeanPersistentVolume(obj any) (any, error) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok {
		return stripManagedFields(obj)
	}
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
	return lean, nil
}

// stripManagedFields keeps cached objects small: nothing here reads managed fields.
func stripManagedFields(obj any) (any, error) {
	if o, err := meta.Accessor(obj); err == nil {
		o.SetManagedFields(nil)
	}
	return obj, nil
}

// volume is a PersistentVolume resolved into what the driver's Healer calls need.
type volume struct {
	pvName      string
	volumeID    string
	stagingPath string
	context     map[string]string
	capability  *csi.VolumeCapability
	secrets     map[string]string
}

// volumes resolves PersistentVolume names from informer caches: one cluster-wide PV informer,
// indexed by driver and volume handle, and one Secret informer per namespace that this driver's
// node-stage secrets live in, started when the first such PV is seen. No call makes an API
// request of its own.
type volumes struct {
	pvs cache.SharedIndexInformer
	// vas caches the VolumeAttachments of the sidecar's node in full, and of other nodes only
	// their names (leanVolumeAttachment).
	vas        cache.SharedIndexInformer
	nodeName   string
	factory    informers.SharedInformerFactory
	secrets    *secretCache
	kubeletDir string
	// driverName is the driver's name once known; PV events use it to start Secret informers
	// early.
	driverName atomic.Pointer[string]
}

func newVolumes(client kubernetes.Interface, o *Options) (*volumes, error) {
	node := o.NodeName
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(func(obj any) (any, error) {
		if va, ok := obj.(*storagev1.VolumeAttachment); ok {
			return leanVolumeAttachment(va, node), nil
		}
		return LeanPersistentVolume(obj)
	}))
	pvs := factory.Core().V1().PersistentVolumes().Informer()
	if err := pvs.AddIndexers(PersistentVolumeIndexers()); err != nil {
		return nil, fmt.Errorf("index PersistentVolumes: %w", err)
	}
	vas := factory.Storage().V1().VolumeAttachments().Informer()
	if err := vas.AddIndexers(cache.Indexers{vaByPVIndex: indexByPV}); err != nil {
		return nil, fmt.Errorf("index VolumeAttachments: %w", err)
	}
	v := &volumes{
		pvs:        pvs,
		vas:        vas,
		nodeName:   node,
		factory:    factory,
		secrets:    newSecretCache(client, o.SecretSyncTimeout),
		kubeletDir: o.KubeletDir,
	}
	if _, err := pvs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    v.pvChanged,
		UpdateFunc: func(_, obj any) { v.pvChanged(obj) },
	}); err != nil {
		return nil, fmt.Errorf("watch PersistentVolumes: %w", err)
	}
	return v, nil
}

// start runs the informers until ctx is done; stop waits for them to end.
func (v *volumes) start(ctx context.Context) {
	v.factory.Start(ctx.Done())
	v.secrets.start(ctx)
}

func (v *volumes) stop() {
	v.factory.Shutdown()
	v.secrets.shutdown()
}

func (v *volumes) synced() bool {
	return v.pvs.HasSynced() && v.vas.HasSynced()
}

// vaByPVIndex indexes the VolumeAttachments of the sidecar's node by PersistentVolume name.
const vaByPVIndex = "persistentVolumeName"

func indexByPV(obj any) ([]string, error) {
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok || va.Spec.Source.PersistentVolumeName == nil {
		return nil, nil
	}
	return []string{*va.Spec.Source.PersistentVolumeName}, nil
}

// leanVolumeAttachment keeps of a VolumeAttachment to node what attachedHere reads, and of one
// to another node its name alone: the sidecar never acts on those, and the informer needs an
// entry to follow their deletion.
func leanVolumeAttachment(va *storagev1.VolumeAttachment, node string) *storagev1.VolumeAttachment {
	lean := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: va.Name, UID: va.UID, ResourceVersion: va.ResourceVersion}}
	if va.Spec.NodeName != node {
		return lean
	}
	lean.DeletionTimestamp = va.DeletionTimestamp
	lean.Spec = storagev1.VolumeAttachmentSpec{Attacher: va.Spec.Attacher, NodeName: va.Spec.NodeName,
		Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: va.Spec.Source.PersistentVolumeName}}
	lean.Status.Attached = va.Status.Attached
	return lean
}

// attachedHere reports whether PersistentVolume pvName is attached to the sidecar's node by
// driverName: a VolumeAttachment there, attached, and not being deleted (the volume is
// detaching).
func (v *volumes) attachedHere(driverName, pvName string) bool {
	objs, err := v.vas.GetIndexer().ByIndex(vaByPVIndex, pvName)
	if err != nil {
		return false
	}
	for _, o := range objs {
		va := o.(*storagev1.VolumeAttachment)
		if va.Spec.NodeName == v.nodeName && va.Spec.Attacher == driverName && va.Status.Attached && va.DeletionTimestamp == nil {
			return true
		}
	}
	return false
}

// setDriver records the driver's name and starts the Secret informers of the namespaces its
// PVs' node-stage secrets live in, so that the first probe does not wait for them.
func (v *volumes) setDriver(name string) {
	v.driverName.Store(&name)
	for _, obj := range v.pvs.GetStore().List() {
		v.pvChanged(obj)
	}
}

func (v *volumes) pvChanged(obj any) {
	pv, ok := obj.(*corev1.PersistentVolume)
	name := v.driverName.Load()
	if !ok || name == nil || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != *name {
		return
	}
	if ref := pv.Spec.CSI.NodeStageSecretRef; ref != nil && ref.Namespace != "" {
		v.secrets.ensure(ref.Namespace)
	}
}

// resolve finds the PV named pvName in the cache and builds the request fields the driver
// needs. The PV must be a CSI volume of driverName.
func (v *volumes) resolve(ctx context.Context, driverName, pvName string) (*volume, error) {
	if !v.synced() {
		return nil, fmt.Errorf("%w: the PersistentVolume cache has not synced yet", ErrNotReady)
	}
	obj, ok, err := v.pvs.GetStore().GetByKey(pvName)
	if err != nil {
		return nil, fmt.Errorf("read PersistentVolume %q from the cache: %w", pvName, err)
	}
	if !ok {
		return nil, fmt.Errorf("%w: %q is not in the sidecar's cache", ErrPVNotFound, pvName)
	}
	pv := obj.(*corev1.PersistentVolume)
	src := pv.Spec.CSI
	if src == nil {
		return nil, fmt.Errorf("%w: %q has no spec.csi", ErrNotCSIVolume, pvName)
	}
	if src.Driver != driverName {
		return nil, fmt.Errorf("%w: %q belongs to driver %q, this sidecar serves %q", ErrOtherDriver, pvName, src.Driver, driverName)
	}
	vol := &volume{
		pvName:      pv.Name,
		volumeID:    src.VolumeHandle,
		stagingPath: stagingPath(v.kubeletDir, pv),
		context:     src.VolumeAttributes,
		capability:  volumeCapability(pv),
	}
	if ref := src.NodeStageSecretRef; ref != nil {
		if vol.secrets, err = v.secrets.get(ctx, ref.Namespace, ref.Name); err != nil {
			return nil, fmt.Errorf("PersistentVolume %q: %w", pvName, err)
		}
	}
	return vol, nil
}

// pvNameFor returns the PV of driverName whose volume handle is volumeID, or "" when the cache
// has none. Should several PVs share a handle, the first by name is taken, so that the answer is
// stable.
func (v *volumes) pvNameFor(driverName, volumeID string) string {
	objs, err := v.pvs.GetIndexer().ByIndex(pvByHandleIndex, driverHandleKey(driverName, volumeID))
	if err != nil || len(objs) == 0 {
		return ""
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		names = append(names, o.(*corev1.PersistentVolume).Name)
	}
	return slices.Min(names)
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

// secretCache holds one Secret informer per namespace, started on first need. The sidecar thus
// needs list and watch on Secrets only in the namespaces its driver's PVs name.
type secretCache struct {
	client      kubernetes.Interface
	syncTimeout time.Duration

	mu         sync.Mutex
	ctx        context.Context // set by start; nil before
	namespaces map[string]*namespaceSecrets
	wg         sync.WaitGroup
}

type namespaceSecrets struct {
	informer cache.SharedIndexInformer
	// lastErr is the last list or watch failure, to explain a cache that does not sync.
	lastErr atomic.Pointer[error]
	started bool
}

func newSecretCache(client kubernetes.Interface, syncTimeout time.Duration) *secretCache {
	return &secretCache{client: client, syncTimeout: syncTimeout, namespaces: map[string]*namespaceSecrets{}}
}

func (c *secretCache) start(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ctx = ctx
	for name, ns := range c.namespaces {
		c.run(name, ns)
	}
}

func (c *secretCache) shutdown() {
	c.wg.Wait()
}

// ensure returns the informer of namespace, creating it, and starting it once start ran.
func (c *secretCache) ensure(namespace string) *namespaceSecrets {
	c.mu.Lock()
	defer c.mu.Unlock()
	ns, ok := c.namespaces[namespace]
	if !ok {
		factory := informers.NewSharedInformerFactoryWithOptions(c.client, 0,
			informers.WithNamespace(namespace), informers.WithTransform(stripManagedFields))
		ns = &namespaceSecrets{informer: factory.Core().V1().Secrets().Informer()}
		_ = ns.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			ns.lastErr.Store(&err)
			cache.DefaultWatchErrorHandler(ctx, r, err)
		})
		c.namespaces[namespace] = ns
	}
	if c.ctx != nil {
		c.run(namespace, ns)
	}
	return ns
}

// run starts ns's informer once; c.mu is held.
func (c *secretCache) run(namespace string, ns *namespaceSecrets) {
	if ns.started {
		return
	}
	ns.started = true
	klog.FromContext(c.ctx).V(2).Info("Caching node-stage Secrets", "namespace", namespace)
	c.wg.Go(func() { ns.informer.RunWithContext(c.ctx) })
}

// get returns the data of a Secret as the strings NodeStageVolume received. The first call for a
// namespace waits, up to the sync timeout, for its Secrets to be cached.
func (c *secretCache) get(ctx context.Context, namespace, name string) (map[string]string, error) {
	ns := c.ensure(namespace)
	if !ns.informer.HasSynced() {
		unavailable := func(why string) error {
			return fmt.Errorf("%w: Secrets of namespace %q (the sidecar needs get, list and watch on Secrets there): %s",
				ErrSecretsUnavailable, namespace, why)
		}
		// A list that already failed (RBAC, most likely) fails the call at once: a sweep of many
		// volumes should not wait out the sync timeout once per volume.
		if err := ns.lastErr.Load(); err != nil {
			return nil, unavailable((*err).Error())
		}
		wctx, cancel := context.WithTimeout(ctx, c.syncTimeout)
		defer cancel()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for !ns.informer.HasSynced() {
			if err := ns.lastErr.Load(); err != nil {
				return nil, unavailable((*err).Error())
			}
			select {
			case <-wctx.Done():
				return nil, unavailable("not cached within " + c.syncTimeout.String())
			case <-tick.C:
			}
		}
	}
	obj, ok, err := ns.informer.GetStore().GetByKey(namespace + "/" + name)
	if err != nil {
		return nil, fmt.Errorf("read Secret %s/%s from the cache: %w", namespace, name, err)
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s/%s", ErrSecretNotFound, namespace, name)
	}
	s := obj.(*corev1.Secret)
	out := make(map[string]string, len(s.Data))
	for k, val := range s.Data {
		out[k] = string(val)
	}
	return out, nil
}
