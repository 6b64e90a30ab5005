package planner

import (
	"slices"
	"strings"
	"sync"
	"unique"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/volume-healer/volume-healer/policy"
)

// The informer caches of a large cluster hold one PersistentVolume, one PersistentVolumeClaim and
// one VolumeAttachment per volume. As API objects, even with managed fields stripped, they take
// about 8 KB per volume; the controller reads a handful of their fields. CacheTransform turns them
// into the compact records below as they enter the caches, and the planner builds the API objects
// the policy reads from those records only for the volume being decided.
//
// Strings that repeat across objects (namespaces, StorageClass, driver and node names, attribute
// keys and most attribute values, label and annotation pairs) are interned, so that thousands of
// records share one copy.

// CacheTransform is the transform of the planner's informers: PersistentVolumes,
// PersistentVolumeClaims and VolumeAttachments become compact records, Nodes keep their name and
// labels, and every other object loses its managed fields.
func CacheTransform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.PersistentVolume:
		return compactPV(o), nil
	case *corev1.PersistentVolumeClaim:
		return compactClaim(o), nil
	case *storagev1.VolumeAttachment:
		return compactAttachment(o), nil
	case *corev1.Node:
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion, Labels: internMap(o.Labels),
		}}, nil
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}

// pair is one entry of a string map.
type pair struct{ key, value string }

// stringMap is a map[string]string kept as slices of pairs sorted by key: a slice of ten pairs
// takes half the memory of a map of ten entries. The pairs with short values (pool and cluster
// names, flags) are usually the same for every volume of a StorageClass or every claim of an
// application, and are shared between the records that have the same ones; the pairs with long
// values (image names, IDs) are the record's own.
type stringMap struct {
	shared *pairSet
	own    []pair
}

// pairSet is a sorted slice of pairs, shared between records. m is the same entries as a map,
// read-only, for the sets the table holds: a record whose entries are all shared hands it out
// instead of building a map per use; term is their Rego form, which the policy input of every
// volume with the set shares.
type pairSet struct {
	pairs []pair
	m     map[string]string
	term  policy.Term
}

func newStringMap(m map[string]string) stringMap {
	if len(m) == 0 {
		return stringMap{}
	}
	var shared, own []pair
	for k, v := range m {
		if len(v) > maxInternedValue && !longValues.repeats(k, v) {
			own = append(own, pair{intern(k), v})
			continue
		}
		shared = append(shared, pair{intern(k), intern(v)})
	}
	byKey := func(a, b pair) int { return strings.Compare(a.key, b.key) }
	slices.SortFunc(shared, byKey)
	slices.SortFunc(own, byKey)
	return stringMap{shared: sharedPairs.get(shared), own: slices.Clip(own)}
}

// recentLongValues remembers, per key, the last few long values seen. A long value seen again
// for its key (a provisioner's identity, a StorageClass's image features: the same for every
// volume of a class) is shared like a short one; one that differs every time (an image name, an
// ID) stays with its record, and interning it would only add an entry.
type recentLongValues struct {
	mu   sync.Mutex
	last map[string]*[recentPerKey]string
}

// recentPerKey is how many long values are remembered per key: more than the StorageClasses
// whose volumes usually come in turn.
const recentPerKey = 8

var longValues = &recentLongValues{last: map[string]*[recentPerKey]string{}}

// repeats reports whether v is among the values recently seen for key k, and remembers it. It
// remembers at most maxSharedSets keys.
func (r *recentLongValues) repeats(k, v string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	recent := r.last[k]
	if recent == nil {
		if len(r.last) >= maxSharedSets {
			return false
		}
		recent = new([recentPerKey]string)
		r.last[intern(k)] = recent
	}
	if slices.Contains(recent[:], v) {
		return true
	}
	copy(recent[1:], recent[:recentPerKey-1])
	// A copy of its own, so that the decoded object v came from is not kept.
	recent[0] = strings.Clone(v)
	return false
}

// get returns the value of key.
func (m stringMap) get(key string) (string, bool) {
	var shared []pair
	if m.shared != nil {
		shared = m.shared.pairs
	}
	for _, p := range [][]pair{shared, m.own} {
		if i, ok := slices.BinarySearchFunc(p, key, func(e pair, k string) int { return strings.Compare(e.key, k) }); ok {
			return p[i].value, true
		}
	}
	return "", false
}

// toMap returns the entries as a map, nil when there are none. The map may be shared with other
// records: read-only.
func (m stringMap) toMap() map[string]string {
	if len(m.own) == 0 && m.shared != nil && m.shared.m != nil {
		return m.shared.m
	}
	var shared []pair
	if m.shared != nil {
		shared = m.shared.pairs
	}
	if len(shared)+len(m.own) == 0 {
		return nil
	}
	out := make(map[string]string, len(shared)+len(m.own))
	for _, p := range shared {
		out[p.key] = p.value
	}
	for _, p := range m.own {
		out[p.key] = p.value
	}
	return out
}

// policyTerm returns the Rego form of the entries, reusing the shared set's. With entries of the
// record's own it is built only when an evaluation needs it: for most volumes the memo answers.
// Unset when the shared set has no Rego form (a set past the table's bound): the policy engine
// then converts the map.
func (m stringMap) policyTerm() policy.Term {
	switch {
	case m.shared == nil && len(m.own) == 0:
		return policy.StringMapTerm(nil)
	case m.shared != nil && !m.shared.term.IsSet():
		return policy.Term{}
	case len(m.own) == 0:
		return m.shared.term
	}
	return policy.LazyTerm(func() policy.Term {
		var base policy.Term
		if m.shared != nil {
			base = m.shared.term
		}
		return policy.ExtendStringMapTerm(base, len(m.own), m.ownEntry)
	})
}

func (m stringMap) ownEntry(i int) (string, string) { return m.own[i].key, m.own[i].value }

// pairTable shares equal sets of pairs between records. It holds at most maxSharedSets sets:
// past that, new sets are kept by their records alone, so that values that are short and yet
// differ per volume cannot grow it without end.
type pairTable struct {
	mu   sync.Mutex
	sets map[string]*pairSet
}

// maxSharedSets bounds pairTable: far more than the distinct attribute, label and annotation sets
// of the StorageClasses and applications of a cluster.
const maxSharedSets = 4096

var sharedPairs = &pairTable{sets: map[string]*pairSet{}}

func (t *pairTable) get(p []pair) *pairSet {
	if len(p) == 0 {
		return nil
	}
	var key strings.Builder
	for _, e := range p {
		key.WriteString(e.key)
		key.WriteByte(0)
		key.WriteString(e.value)
		key.WriteByte(0)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if set, ok := t.sets[key.String()]; ok {
		return set
	}
	set := &pairSet{pairs: p}
	if len(t.sets) < maxSharedSets {
		set.m = make(map[string]string, len(p))
		for _, e := range p {
			set.m[e.key] = e.value
		}
		set.term = policy.StringMapTerm(set.m)
		t.sets[key.String()] = set
	}
	return set
}

// intern returns the canonical copy of s. The canonical copies are weak: one no record uses any
// more is collected.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// maxInternedValue is the longest map value that is always interned. Longer ones (image names,
// volume IDs) are usually unique to their object, and are interned only once seen again
// (recentLongValues).
const maxInternedValue = 32

// internValue interns a map value unless it looks unique to its object.
func internValue(s string) string {
	if len(s) > maxInternedValue {
		return s
	}
	return intern(s)
}

// internMap returns m with its keys and short values interned.
func internMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[intern(k)] = internValue(v)
	}
	return out
}

// packedUID is a UID in 16 bytes when it is a UUID in the canonical form the apiserver gives
// (lowercase, hyphenated): as a string it takes 64. Any other UID is kept as it is.
type packedUID struct {
	uuid  uuid.UUID
	other *types.UID
}

func packUID(u types.UID) packedUID {
	var p packedUID
	if u == "" {
		return p
	}
	// Only a UUID that prints back as it was given packs: uuid.Parse also reads upper case,
	// braces and URNs.
	if id, err := uuid.Parse(string(u)); err == nil && id != uuid.Nil && id.String() == string(u) {
		p.uuid = id
		return p
	}
	p.other = &u
	return p
}

// uid returns the UID packUID was given.
func (p packedUID) uid() types.UID {
	switch {
	case p.other != nil:
		return *p.other
	case p.uuid == uuid.Nil:
		return ""
	}
	return types.UID(p.uuid.String())
}

// equal reports whether p and q hold the same UID.
func (p packedUID) equal(q packedUID) bool {
	if p.other != nil || q.other != nil {
		return p.other != nil && q.other != nil && *p.other == *q.other
	}
	return p.uuid == q.uuid
}

// deletionMarker stands for a deletion timestamp in the API objects built from records: the
// records keep only whether one is set, which is all the guards read.
var deletionMarker = metav1.Unix(0, 0)

func deletionOf(deleting bool) *metav1.Time {
	if !deleting {
		return nil
	}
	t := deletionMarker
	return &t
}

// cachedPV is what the controller keeps of a PersistentVolume. The fields that most PVs of a
// StorageClass have alike are a pvShape that their records share.
type cachedPV struct {
	*pvShape
	name, resourceVersion string
	handle                string
	attributes            stringMap
	claimNamespace        string
	claimName             string
	claimUID              packedUID
	deleting              bool
}

// pvShape is the part of a PersistentVolume that is usually the same for every volume of a
// StorageClass: read-only once made, and shared between records through shapeTable.
type pvShape struct {
	storageClass string
	// csi is false for volumes of other plugins; driver, handle and attributes are then empty.
	csi          bool
	driver       string
	accessModes  []corev1.PersistentVolumeAccessMode
	mountOptions []string
	phase        corev1.PersistentVolumePhase
	// What the sidecar's calls carry to stage the volume alike (probe.Options.PersistentVolume):
	// spec.volumeMode, spec.csi.fsType, spec.csi.readOnly and spec.csi.nodeStageSecretRef.
	volumeMode                            corev1.PersistentVolumeMode
	fsType                                string
	readOnly                              bool
	stageSecretNamespace, stageSecretName string
}

// shapeTable shares equal pvShapes between records, at most maxSharedSets of them: past that a
// record keeps its own.
type shapeTable struct {
	mu     sync.Mutex
	shapes map[string]*pvShape
}

var sharedShapes = &shapeTable{shapes: map[string]*pvShape{}}

func (t *shapeTable) get(s pvShape) *pvShape {
	var key strings.Builder
	key.WriteString(s.storageClass)
	key.WriteByte(0)
	key.WriteString(s.driver)
	key.WriteByte(0)
	key.WriteString(string(s.phase))
	if s.csi {
		key.WriteString("\x00csi")
	}
	// NUL occurs in none of these names, so the key stays unambiguous.
	key.WriteString("\x00v" + string(s.volumeMode) + "\x00f" + s.fsType + "\x00s" + s.stageSecretNamespace + "/" + s.stageSecretName)
	if s.readOnly {
		key.WriteString("\x00ro")
	}
	for _, m := range s.accessModes {
		key.WriteString("\x00m")
		key.WriteString(string(m))
	}
	for _, o := range s.mountOptions {
		key.WriteString("\x00o")
		key.WriteString(o)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if shared, ok := t.shapes[key.String()]; ok {
		return shared
	}
	p := &s
	if len(t.shapes) < maxSharedSets {
		t.shapes[key.String()] = p
	}
	return p
}

func compactPV(o *corev1.PersistentVolume) *cachedPV {
	shape := pvShape{
		storageClass: intern(o.Spec.StorageClassName),
		accessModes:  internModes(o.Spec.AccessModes), mountOptions: internList(o.Spec.MountOptions),
		phase: corev1.PersistentVolumePhase(intern(string(o.Status.Phase))),
	}
	c := &cachedPV{name: o.Name, resourceVersion: o.ResourceVersion, deleting: o.DeletionTimestamp != nil}
	if o.Spec.VolumeMode != nil {
		shape.volumeMode = *o.Spec.VolumeMode
	}
	if csi := o.Spec.CSI; csi != nil {
		shape.csi, shape.driver = true, intern(csi.Driver)
		shape.fsType, shape.readOnly = intern(csi.FSType), csi.ReadOnly
		if ref := csi.NodeStageSecretRef; ref != nil {
			shape.stageSecretNamespace, shape.stageSecretName = intern(ref.Namespace), intern(ref.Name)
		}
		c.handle = csi.VolumeHandle
		c.attributes = newStringMap(csi.VolumeAttributes)
	}
	c.pvShape = sharedShapes.get(shape)
	if ref := o.Spec.ClaimRef; ref != nil {
		c.claimNamespace, c.claimName, c.claimUID = intern(ref.Namespace), ref.Name, packUID(ref.UID)
	}
	return c
}

// GetObjectMeta makes the record keyable by the informer's store.
func (c *cachedPV) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: c.name, ResourceVersion: c.resourceVersion, DeletionTimestamp: deletionOf(c.deleting)}
}

// object builds the PersistentVolume the policy and the healer read.
func (c *cachedPV) object() *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: c.name, ResourceVersion: c.resourceVersion, DeletionTimestamp: deletionOf(c.deleting)},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName: c.storageClass, AccessModes: c.accessModes, MountOptions: c.mountOptions,
		},
		Status: corev1.PersistentVolumeStatus{Phase: c.phase},
	}
	if c.volumeMode != "" {
		mode := c.volumeMode
		pv.Spec.VolumeMode = &mode
	}
	if c.csi {
		pv.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: c.driver, VolumeHandle: c.handle,
			VolumeAttributes: c.attributes.toMap(), FSType: c.fsType, ReadOnly: c.readOnly}
		if c.stageSecretName != "" {
			pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: c.stageSecretNamespace, Name: c.stageSecretName}
		}
	}
	if c.claimName != "" {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: c.claimNamespace, Name: c.claimName, UID: c.claimUID.uid()}
	}
	return pv
}

// cachedClaim is what the controller keeps of a PersistentVolumeClaim: its identity, labels and
// annotations (the policy reads them; manual sweep requests and the status live there), the
// volume it is bound to, and its StorageClass (the propagation webhook reads it while the claim is
// not bound yet).
type cachedClaim struct {
	namespace, name, resourceVersion string
	uid                              packedUID
	volumeName                       string
	// storageClass is the claim's spec.storageClassName when classSet; a claim that names no
	// class gets the default one, an empty name none.
	storageClass        string
	classSet            bool
	labels, annotations stringMap
	deleting            bool
}

func compactClaim(o *corev1.PersistentVolumeClaim) *cachedClaim {
	return compactClaimClass(&cachedClaim{
		namespace: intern(o.Namespace), name: o.Name, resourceVersion: o.ResourceVersion, uid: packUID(o.UID),
		volumeName: o.Spec.VolumeName,
		labels:     newStringMap(o.Labels), annotations: newStringMap(o.Annotations),
		deleting: o.DeletionTimestamp != nil,
	}, o)
}

// compactClaimClass keeps the claim's StorageClass name without an allocation per claim.
func compactClaimClass(c *cachedClaim, o *corev1.PersistentVolumeClaim) *cachedClaim {
	if p := o.Spec.StorageClassName; p != nil {
		c.storageClass, c.classSet = intern(*p), true
	}
	return c
}

// GetObjectMeta makes the record keyable by the informer's store.
func (c *cachedClaim) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, ResourceVersion: c.resourceVersion, UID: c.uid.uid(),
		DeletionTimestamp: deletionOf(c.deleting)}
}

// object builds the PersistentVolumeClaim the policy, Events and status patches use.
func (c *cachedClaim) object() *corev1.PersistentVolumeClaim {
	var class *string
	if c.classSet {
		name := c.storageClass
		class = &name
	}
	return &corev1.PersistentVolumeClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, ResourceVersion: c.resourceVersion, UID: c.uid.uid(),
			Labels: c.labels.toMap(), Annotations: c.annotations.toMap(), DeletionTimestamp: deletionOf(c.deleting)},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: c.volumeName, StorageClassName: class},
	}
}

// cachedAttachment is what the controller keeps of a VolumeAttachment.
type cachedAttachment struct {
	name, resourceVersion string
	attacher, node        string
	// pv is empty for inline volumes.
	pv                              string
	attached, detachError, deleting bool
}

func compactAttachment(o *storagev1.VolumeAttachment) *cachedAttachment {
	c := &cachedAttachment{
		name: o.Name, resourceVersion: o.ResourceVersion, attacher: intern(o.Spec.Attacher), node: intern(o.Spec.NodeName),
		attached: o.Status.Attached, detachError: o.Status.DetachError != nil, deleting: o.DeletionTimestamp != nil,
	}
	if pv := o.Spec.Source.PersistentVolumeName; pv != nil {
		c.pv = *pv
	}
	return c
}

// GetObjectMeta makes the record keyable by the informer's store.
func (c *cachedAttachment) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: c.name, ResourceVersion: c.resourceVersion, DeletionTimestamp: deletionOf(c.deleting)}
}

// object builds the VolumeAttachment the policy reads.
func (c *cachedAttachment) object() *storagev1.VolumeAttachment {
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: c.name, ResourceVersion: c.resourceVersion, DeletionTimestamp: deletionOf(c.deleting)},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: c.attacher, NodeName: c.node},
		Status:     storagev1.VolumeAttachmentStatus{Attached: c.attached},
	}
	if c.pv != "" {
		pv := c.pv
		va.Spec.Source.PersistentVolumeName = &pv
	}
	if c.detachError {
		va.Status.DetachError = &storagev1.VolumeError{}
	}
	return va
}

// internModes shares the access mode lists, which nearly all volumes have one of.
func internModes(modes []corev1.PersistentVolumeAccessMode) []corev1.PersistentVolumeAccessMode {
	if len(modes) == 1 {
		for _, m := range commonModes {
			if m[0] == modes[0] {
				return m
			}
		}
	}
	out := make([]corev1.PersistentVolumeAccessMode, len(modes))
	for i, m := range modes {
		out[i] = corev1.PersistentVolumeAccessMode(intern(string(m)))
	}
	return out
}

var commonModes = [][]corev1.PersistentVolumeAccessMode{
	{corev1.ReadWriteOnce}, {corev1.ReadWriteOncePod}, {corev1.ReadWriteMany}, {corev1.ReadOnlyMany},
}

// commonModeStrings and commonModeTerms are commonModes as the policy input holds them, shared by
// every input.
var commonModeStrings, commonModeTerms = func() ([][]string, []policy.Term) {
	strs := make([][]string, len(commonModes))
	terms := make([]policy.Term, len(commonModes))
	for i, m := range commonModes {
		strs[i] = []string{string(m[0])}
		terms[i] = policy.StringsTerm(strs[i])
	}
	return strs, terms
}()

// policyModes returns the access modes as the policy input holds them, and their Rego form when
// they are one of the common lists. The strings are shared: read-only.
func policyModes(modes []corev1.PersistentVolumeAccessMode) ([]string, policy.Term) {
	if len(modes) == 1 {
		for i, m := range commonModes {
			if m[0] == modes[0] {
				return commonModeStrings[i], commonModeTerms[i]
			}
		}
	}
	var out []string
	for _, m := range modes {
		out = append(out, string(m))
	}
	return out, policy.Term{}
}

func internList(list []string) []string {
	if len(list) == 0 {
		return nil
	}
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = intern(s)
	}
	return out
}

// recordOf returns the record of type R that an informer's store or handler holds, unwrapping a
// deletion tombstone; nil for anything else. Stores are filled through CacheTransform, so they
// hold records only.
func recordOf[R any](obj any) *R {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	r, _ := obj.(*R)
	return r
}

// PersistentVolumeFrom returns the PersistentVolume an informer handler of the planner's caches
// received (a record, or a deletion tombstone of one), with the fields the controller keeps; nil
// for anything else.
func PersistentVolumeFrom(obj any) *corev1.PersistentVolume {
	if r := recordOf[cachedPV](obj); r != nil {
		return r.object()
	}
	return nil
}

// ClaimFrom returns the PersistentVolumeClaim an informer handler of the planner's caches
// received, with the fields the controller keeps; nil for anything else. Its maps may be shared
// with the caches: read-only.
func ClaimFrom(obj any) *corev1.PersistentVolumeClaim {
	if r := recordOf[cachedClaim](obj); r != nil {
		return r.object()
	}
	return nil
}
