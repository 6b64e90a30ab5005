package planner

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/volume-healer/volume-healer/policy"
)

// Index names on the planner's informers.
const (
	// IndexDriverNode indexes VolumeAttachments by "<attacher>/<node>".
	IndexDriverNode = "driverNode"
)

// The planner has no index with one value per volume (PV name to VolumeAttachment, PV name to
// claim): each would cost a set per volume, about 200 bytes, for lookups that the claim reference
// on the PV and a walk over one driver's VolumeAttachments do as well. Nor does it index by a
// value that most objects share (StorageClass, driver): a set of hundreds of thousands of keys
// costs about 45 bytes an object (13 MiB for 300,000 VolumeAttachments), for lookups that a walk
// over the driver's nodes in IndexDriverNode, or over the PVs once a sweep, do as well.

// PVIndexers are the indexes the planner needs on the PersistentVolume informer: none.
func PVIndexers() cache.Indexers { return cache.Indexers{} }

// VAIndexers are the indexes the planner needs on the VolumeAttachment informer.
func VAIndexers() cache.Indexers {
	return cache.Indexers{
		IndexDriverNode: func(obj any) ([]string, error) {
			va := recordOf[cachedAttachment](obj)
			if va == nil {
				return nil, nil
			}
			return []string{driverNodeKey(va.attacher, va.node)}, nil
		},
	}
}

// PVCIndexers are the indexes the planner needs on the PersistentVolumeClaim informer: none, a
// PV's claim is found by its claim reference.
func PVCIndexers() cache.Indexers { return cache.Indexers{} }

func driverNodeKey(driver, node string) string { return driver + "/" + node }

// Caches are the informer stores the planner reads. Every store comes from a shared informer
// whose transform is CacheTransform; the planner never calls the API server.
type Caches struct {
	// PVs is indexed with PVIndexers.
	PVs cache.Indexer
	// VolumeAttachments is indexed with VAIndexers.
	VolumeAttachments cache.Indexer
	// PVCs is indexed with PVCIndexers.
	PVCs cache.Indexer
	// StorageClasses, CSIDrivers and Nodes are keyed by name.
	StorageClasses, CSIDrivers, Nodes cache.Store
}

// NewLocalCaches returns empty caches with the planner's indexes, filled with Add rather than by
// informers: for tools and tests that plan over objects they hold.
func NewLocalCaches() Caches {
	return Caches{
		PVs:               cache.NewIndexer(cache.MetaNamespaceKeyFunc, PVIndexers()),
		VolumeAttachments: cache.NewIndexer(cache.MetaNamespaceKeyFunc, VAIndexers()),
		PVCs:              cache.NewIndexer(cache.MetaNamespaceKeyFunc, PVCIndexers()),
		StorageClasses:    cache.NewStore(cache.MetaNamespaceKeyFunc),
		CSIDrivers:        cache.NewStore(cache.MetaNamespaceKeyFunc),
		Nodes:             cache.NewStore(cache.MetaNamespaceKeyFunc),
	}
}

// Add puts obj, transformed as the informers do, into the store of its kind, replacing an older
// version.
func (c Caches) Add(obj runtime.Object) error {
	var store cache.Store
	switch obj.(type) {
	case *corev1.PersistentVolume:
		store = c.PVs
	case *storagev1.VolumeAttachment:
		store = c.VolumeAttachments
	case *corev1.PersistentVolumeClaim:
		store = c.PVCs
	case *storagev1.StorageClass:
		store = c.StorageClasses
	case *storagev1.CSIDriver:
		store = c.CSIDrivers
	case *corev1.Node:
		store = c.Nodes
	default:
		return fmt.Errorf("planner caches: no store for %T", obj)
	}
	rec, err := CacheTransform(obj.DeepCopyObject())
	if err != nil {
		return err
	}
	return store.Update(rec)
}

// InformerCaches registers the planner's informers and indexes with factory and returns their
// stores. The factory's transform should be CacheTransform.
func InformerCaches(factory informers.SharedInformerFactory) (Caches, error) {
	pvs := factory.Core().V1().PersistentVolumes().Informer()
	vas := factory.Storage().V1().VolumeAttachments().Informer()
	pvcs := factory.Core().V1().PersistentVolumeClaims().Informer()
	for _, add := range []struct {
		informer cache.SharedIndexInformer
		indexers cache.Indexers
	}{{pvs, PVIndexers()}, {vas, VAIndexers()}, {pvcs, PVCIndexers()}} {
		if err := add.informer.AddIndexers(add.indexers); err != nil {
			return Caches{}, err
		}
	}
	return Caches{
		PVs:               pvs.GetIndexer(),
		VolumeAttachments: vas.GetIndexer(),
		PVCs:              pvcs.GetIndexer(),
		StorageClasses:    factory.Storage().V1().StorageClasses().Informer().GetStore(),
		CSIDrivers:        factory.Storage().V1().CSIDrivers().Informer().GetStore(),
		Nodes:             factory.Core().V1().Nodes().Informer().GetStore(),
	}, nil
}

// Volume is one volume a sweep may act on. It points into the caches' compact records;
// Objects builds the API objects the policy reads when the volume's turn comes, so that a sweep
// of many volumes does not hold a copy of each.
type Volume struct {
	// PVName is the PersistentVolume's name.
	PVName string
	// NodeName is the node the volume is used on.
	NodeName string
	// Driver is the CSI driver name.
	Driver string
	// AttachmentName is the VolumeAttachment's name; empty for drivers without an attach step.
	AttachmentName string

	pv           *cachedPV
	claim        *cachedClaim
	attachment   *cachedAttachment
	storageClass *storagev1.StorageClass
	node         *corev1.Node
	terms        *policyTerms
}

// VolumeObjects are a volume's cluster objects as the policy reads them. PV is never nil; the
// others are nil when they do not exist or are not in the caches.
type VolumeObjects struct {
	PV           *corev1.PersistentVolume
	PVC          *corev1.PersistentVolumeClaim
	StorageClass *storagev1.StorageClass
	Attachment   *storagev1.VolumeAttachment
	Node         *corev1.Node
}

// Objects builds the volume's objects, with the fields the controller keeps of them. They are
// read-only: the StorageClass and Node are the cached objects themselves, and maps (labels,
// annotations, attributes) may be shared with the caches.
func (v Volume) Objects() VolumeObjects {
	out := VolumeObjects{StorageClass: v.storageClass, Node: v.node}
	if v.pv != nil {
		out.PV = v.pv.object()
	} else {
		out.PV = &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: v.PVName}}
	}
	if v.claim != nil {
		out.PVC = v.claim.object()
	}
	if v.attachment != nil {
		out.Attachment = v.attachment.object()
	}
	return out
}

// Claim returns the PersistentVolumeClaim bound to the volume, for Events and status patches;
// nil when it is not in the caches. Read-only, as Objects.
func (v Volume) Claim() *corev1.PersistentVolumeClaim {
	if v.claim == nil {
		return nil
	}
	return v.claim.object()
}

// ClaimAnnotation returns the annotation key of the volume's claim, without building the claim.
func (v Volume) ClaimAnnotation(key string) (string, bool) {
	if v.claim == nil {
		return "", false
	}
	return v.claim.annotations.get(key)
}

// ClaimName returns the namespace and name of the volume's claim; empty when it is not in the
// caches.
func (v Volume) ClaimName() types.NamespacedName {
	if v.claim == nil {
		return types.NamespacedName{}
	}
	return types.NamespacedName{Namespace: v.claim.namespace, Name: v.claim.name}
}

// Skipped is a volume the planner left out before any policy ran, and why.
type Skipped struct {
	// PV is the PersistentVolume name.
	PV string
	// Node is the node name.
	Node string
	// Reason says why, for logs and the sweep summary.
	Reason string
}

// Planner selects the volumes of a sweep from informer caches.
type Planner struct {
	c     Caches
	terms *policyTerms
}

// New returns a planner over c.
func New(c Caches) *Planner { return &Planner{c: c, terms: newPolicyTerms()} }

// PersistentVolume returns the PersistentVolume named name as the caches keep it (the fields the
// policy and the sidecar's calls read), without a read from the API server; false when it is not
// in the caches. Read-only, as Volume.Objects.
func (p *Planner) PersistentVolume(name string) (*corev1.PersistentVolume, bool) {
	pv := p.pv(name)
	if pv == nil {
		return nil, false
	}
	return pv.object(), true
}

// AttachRequired reports whether the driver's volumes have VolumeAttachments. A driver without a
// CSIDriver object is assumed to attach, as kubelet and the attach/detach controller assume.
func (p *Planner) AttachRequired(driver string) bool {
	obj, ok, _ := p.c.CSIDrivers.GetByKey(driver)
	if !ok {
		return true
	}
	d := obj.(*storagev1.CSIDriver)
	return d.Spec.AttachRequired == nil || *d.Spec.AttachRequired
}

// NodeVolumes returns the volumes of driver attached to node, from the VolumeAttachment index,
// and those the built-in guards leave out. For drivers without an attach step use StagedVolumes.
func (p *Planner) NodeVolumes(driver, node string) ([]Volume, []Skipped) {
	objs, _ := p.c.VolumeAttachments.ByIndex(IndexDriverNode, driverNodeKey(driver, node))
	var vols []Volume
	var skipped []Skipped
	for _, obj := range objs {
		va := recordOf[cachedAttachment](obj)
		if va.pv == "" {
			continue // an inline volume: no PV to act on
		}
		v, reason := p.volume(va.pv, va, node)
		if reason != "" {
			skipped = append(skipped, Skipped{PV: va.pv, Node: node, Reason: reason})
			continue
		}
		vols = append(vols, v)
	}
	sortVolumes(vols)
	return vols, skipped
}

// StagedVolumes turns the PV names that a sidecar listed as staged on node into volumes, for
// drivers without an attach step.
func (p *Planner) StagedVolumes(driver, node string, pvNames []string) ([]Volume, []Skipped) {
	var vols []Volume
	var skipped []Skipped
	for _, name := range pvNames {
		v, reason := p.volume(name, nil, node)
		if reason == "" && v.Driver != driver {
			reason = fmt.Sprintf("PV belongs to driver %s, not %s", v.Driver, driver)
		}
		if reason != "" {
			skipped = append(skipped, Skipped{PV: name, Node: node, Reason: reason})
			continue
		}
		vols = append(vols, v)
	}
	sortVolumes(vols)
	return vols, skipped
}

// ClassVolumes returns the volumes of StorageClass sc that are attached somewhere, one per
// attachment. Volumes of drivers without an attach step are not among them: their nodes are learnt
// from the sidecars (see ClassDrivers and StagedVolumes).
func (p *Planner) ClassVolumes(sc string) ([]Volume, []Skipped) {
	// The attachments of the class are found first and the volumes made after, in a slice of
	// their number: a class can hold 100,000 volumes, and a slice grown by append would be copied
	// over and over, several times the volumes' size in garbage for every periodic sweep.
	type match struct {
		va *cachedAttachment
		pv *cachedPV
	}
	var matches []match
	for _, driver := range p.classDrivers(sc, true) {
		// One walk over the driver's VolumeAttachments finds the attachments of every PV of the class.
		vas := p.driverAttachments(driver)
		if matches == nil {
			matches = make([]match, 0, len(vas))
		}
		for _, va := range vas {
			if va.pv == "" {
				continue
			}
			// One lookup of the PV serves the class test and the volume.
			if pv := p.pv(va.pv); pv != nil && pv.storageClass == sc {
				matches = append(matches, match{va, pv})
			}
		}
	}
	vols := make([]Volume, 0, len(matches))
	var skipped []Skipped
	for _, m := range matches {
		v, reason := p.volumeOf(m.va.pv, m.pv, m.va, m.va.node)
		if reason != "" {
			skipped = append(skipped, Skipped{PV: m.va.pv, Node: m.va.node, Reason: reason})
			continue
		}
		vols = append(vols, v)
	}
	sortVolumes(vols)
	return vols, skipped
}

// driverAttachments returns the VolumeAttachments of driver: the sets of its nodes in
// IndexDriverNode, found among the index's values (one per node and driver).
func (p *Planner) driverAttachments(driver string) []*cachedAttachment {
	prefix := driverNodeKey(driver, "")
	var out []*cachedAttachment
	for _, key := range p.c.VolumeAttachments.ListIndexFuncValues(IndexDriverNode) {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		objs, _ := p.c.VolumeAttachments.ByIndex(IndexDriverNode, key)
		for _, obj := range objs {
			// A node name holds no "/", a driver name might: the prefix alone could match
			// another driver's.
			if va := recordOf[cachedAttachment](obj); va != nil && va.attacher == driver {
				out = append(out, va)
			}
		}
	}
	return out
}

// PVVolumes returns the volume of the PersistentVolume named pv on every node it is attached to.
// For a driver without an attach step it returns nothing: its nodes come from the sidecars.
func (p *Planner) PVVolumes(pv string) ([]Volume, []Skipped) {
	driver, ok := p.PVDriver(pv)
	if !ok {
		return nil, nil
	}
	var vols []Volume
	var skipped []Skipped
	for _, va := range p.driverAttachments(driver) {
		if va.pv != pv {
			continue
		}
		v, reason := p.volume(pv, va, va.node)
		if reason != "" {
			skipped = append(skipped, Skipped{PV: pv, Node: va.node, Reason: reason})
			continue
		}
		vols = append(vols, v)
	}
	sortVolumes(vols)
	return vols, skipped
}

// PVNamesByHandle maps volume handles of driver to the names of their PVs, for the volumes a
// sidecar listed without a PV name (the sidecars keep no view of the cluster's PVs). Should
// several PVs share a handle, the first by name is taken, so that the answer is stable. It walks
// the PV cache once, and is asked once per listing of a node's staged volumes, for drivers without
// an attach step only: an index of handles would cost every PV of the cluster a set entry.
func (p *Planner) PVNamesByHandle(driver string, handles []string) map[string]string {
	want := make(map[string]bool, len(handles))
	for _, h := range handles {
		want[h] = true
	}
	out := map[string]string{}
	if len(want) == 0 {
		return out
	}
	for _, obj := range p.c.PVs.List() {
		pv := recordOf[cachedPV](obj)
		if pv == nil || !pv.csi || pv.driver != driver || !want[pv.handle] {
			continue
		}
		if have, ok := out[pv.handle]; !ok || pv.name < have {
			out[pv.handle] = pv.name
		}
	}
	return out
}

// PVDriver returns the CSI driver of the PersistentVolume named pv, if it is in the cache.
func (p *Planner) PVDriver(pv string) (string, bool) {
	rec := p.pv(pv)
	if rec == nil || !rec.csi {
		return "", false
	}
	return rec.driver, true
}

// ClassDrivers returns the drivers without an attach step that have PVs in StorageClass sc: a
// periodic sweep asks their sidecars which of those volumes are staged where.
func (p *Planner) ClassDrivers(sc string) []string { return p.classDrivers(sc, false) }

// classDrivers returns the drivers with PVs in StorageClass sc that attach (attach true) or do
// not.
func (p *Planner) classDrivers(sc string, attach bool) []string {
	if sc == "" {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, obj := range p.c.PVs.List() {
		pv := recordOf[cachedPV](obj)
		if pv == nil || pv.storageClass != sc || !pv.csi || seen[pv.driver] {
			continue
		}
		seen[pv.driver] = true
		if p.AttachRequired(pv.driver) == attach {
			out = append(out, pv.driver)
		}
	}
	sort.Strings(out)
	return out
}

// InClass reports whether the PV named pv belongs to StorageClass sc.
func (p *Planner) InClass(pv, sc string) bool {
	rec := p.pv(pv)
	return rec != nil && rec.storageClass == sc
}

// Recheck applies the built-in guards again to a volume planned earlier, from the caches as they
// are now: a sweep's task may run long after planning, and its VolumeAttachment may have started
// to go away meanwhile. It returns the volume with fresh objects, or the reason to leave it alone.
func (p *Planner) Recheck(v Volume) (Volume, string) {
	var va *cachedAttachment
	if v.AttachmentName != "" {
		obj, ok, _ := p.c.VolumeAttachments.GetByKey(v.AttachmentName)
		if !ok {
			return Volume{}, "VolumeAttachment is gone (detached)"
		}
		va = recordOf[cachedAttachment](obj)
	}
	return p.volume(v.PVName, va, v.NodeName)
}

func (p *Planner) pv(name string) *cachedPV {
	obj, ok, _ := p.c.PVs.GetByKey(name)
	if !ok {
		return nil
	}
	return recordOf[cachedPV](obj)
}

// volume gathers the records of one volume and applies the built-in guards, which no policy can
// override: never act on a volume whose attachment is going away, or whose PV is not Bound or is
// being deleted.
func (p *Planner) volume(pvName string, va *cachedAttachment, node string) (Volume, string) {
	return p.volumeOf(pvName, p.pv(pvName), va, node)
}

// volumeOf is volume with the PV's record, nil when it is not cached, already looked up.
func (p *Planner) volumeOf(pvName string, pv *cachedPV, va *cachedAttachment, node string) (Volume, string) {
	switch {
	case pv == nil:
		return Volume{}, "PV not found"
	case !pv.csi:
		return Volume{}, "not a CSI volume"
	case pv.deleting:
		return Volume{}, "PV is being deleted"
	case pv.phase != corev1.VolumeBound:
		return Volume{}, fmt.Sprintf("PV is %s, not Bound", pv.phase)
	}
	if va != nil {
		switch {
		case va.deleting:
			return Volume{}, "VolumeAttachment is being deleted (detaching)"
		case !va.attached:
			return Volume{}, "VolumeAttachment is not attached"
		case va.detachError:
			return Volume{}, "VolumeAttachment has a detach error (detaching)"
		}
	}
	v := Volume{PVName: pv.name, NodeName: node, Driver: pv.driver, pv: pv, attachment: va, terms: p.terms}
	if va != nil {
		v.AttachmentName = va.name
	}
	if pv.claimName != "" {
		if obj, ok, _ := p.c.PVCs.GetByKey(pv.claimNamespace + "/" + pv.claimName); ok {
			// A claim of the same name created after the PV's was deleted is not this volume's.
			if c := recordOf[cachedClaim](obj); c.volumeName == pv.name && (pv.claimUID == packedUID{} || c.uid.equal(pv.claimUID)) {
				v.claim = c
			}
		}
	}
	if pv.storageClass != "" {
		if o, ok, _ := p.c.StorageClasses.GetByKey(pv.storageClass); ok {
			v.storageClass = o.(*storagev1.StorageClass)
		}
	}
	if o, ok, _ := p.c.Nodes.GetByKey(node); ok {
		v.node = o.(*corev1.Node)
	}
	return v, ""
}

func sortVolumes(vols []Volume) {
	sort.Slice(vols, func(i, j int) bool {
		if vols[i].NodeName != vols[j].NodeName {
			return vols[i].NodeName < vols[j].NodeName
		}
		return vols[i].PVName < vols[j].PVName
	})
}

// PolicyInput builds the policy's first-evaluation input for the volume from the cached records,
// without the API objects Objects would build: it is what policy.BuildInput(Objects()...) returns
// (TestPolicyInputMatchesBuildInput keeps the two equal), at a fraction of the allocations, which
// matters when a periodic sweep decides 100,000 volumes. The parts that other volumes share (the
// StorageClass, the node, the attachment state, label, annotation and attribute sets, access
// modes) come with their Rego form in Input.Terms, converted once for all the volumes that share
// them; they are shared: read-only. The caller sets History, and Probe for the second
// evaluation.
func (v Volume) PolicyInput(driver policy.DriverInfo, trigger policy.Trigger) policy.Input {
	if v.pv == nil || v.terms == nil {
		o := v.Objects()
		return policy.BuildInput(o.PV, o.PVC, o.StorageClass, o.Attachment, o.Node, driver, trigger)
	}
	pv := v.pv
	in := policy.Input{Trigger: trigger, Driver: driver}
	in.Volume.PV = pv.name
	if pv.csi {
		in.Volume.Handle = pv.handle
		in.Volume.Driver = pv.driver
		in.Volume.Attributes = pv.attributes.toMap()
		in.Terms.Attributes = pv.attributes.policyTerm()
	} else {
		in.Terms.Attributes = policy.StringMapTerm(nil)
	}
	if in.Driver.Name == "" {
		in.Driver.Name = in.Volume.Driver
	}
	in.Volume.MountOptions = pv.mountOptions
	in.Volume.AccessModes, in.Terms.AccessModes = policyModes(pv.accessModes)
	if pv.storageClass != "" {
		if sc := v.storageClass; sc != nil && sc.Name == pv.storageClass {
			c := v.terms.class(sc)
			in.Volume.StorageClass, in.Terms.StorageClass = c.class, c.term
		} else {
			in.Volume.StorageClass = &policy.StorageClass{Name: pv.storageClass}
		}
	}
	switch c := v.claim; {
	case c != nil:
		in.Volume.PVC = &policy.Claim{Namespace: c.namespace, Name: c.name, Labels: c.labels.toMap(), Annotations: c.annotations.toMap()}
		in.Terms.ClaimLabels, in.Terms.ClaimAnnotations = c.labels.policyTerm(), c.annotations.policyTerm()
	case pv.claimName != "" && pv.phase == corev1.VolumeBound:
		in.Volume.PVC = &policy.Claim{Namespace: pv.claimNamespace, Name: pv.claimName}
	}
	if va := v.attachment; va != nil {
		in.Attachment = &policy.Attachment{Node: va.node, Attached: va.attached, Detaching: va.deleting}
		in.Terms.Attachment = v.terms.attachment(in.Attachment)
	}
	switch {
	case v.node != nil:
		n := v.terms.node(v.node)
		in.Node, in.Terms.Node = n.node, n.term
	case v.attachment != nil:
		in.Node = &policy.Node{Name: v.attachment.node}
	}
	return in
}
