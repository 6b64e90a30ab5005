package scheduler

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/tools/cache"
)

// Index names on the planner's informers.
const (
	// IndexDriverNode indexes VolumeAttachments by "<attacher>/<node>".
	IndexDriverNode = "driverNode"
	// IndexStorageClass indexes PersistentVolumes by StorageClass name.
	IndexStorageClass = "storageClass"
	// IndexDriver indexes PersistentVolumes by CSI driver name.
	IndexDriver = "driver"
	// IndexVolumeName indexes VolumeAttachments and PersistentVolumeClaims by PV name.
	IndexVolumeName = "volumeName"
)

// PVIndexers are the indexes the planner needs on the PersistentVolume informer.
func PVIndexers() cache.Indexers {
	return cache.Indexers{
		IndexStorageClass: func(obj any) ([]string, error) {
			pv, ok := obj.(*corev1.PersistentVolume)
			if !ok || pv.Spec.StorageClassName == "" {
				return nil, nil
			}
			return []string{pv.Spec.StorageClassName}, nil
		},
		IndexDriver: func(obj any) ([]string, error) {
			pv, ok := obj.(*corev1.PersistentVolume)
			if !ok || pv.Spec.CSI == nil {
				return nil, nil
			}
			return []string{pv.Spec.CSI.Driver}, nil
		},
	}
}

// VAIndexers are the indexes the planner needs on the VolumeAttachment informer.
func VAIndexers() cache.Indexers {
	return cache.Indexers{
		IndexDriverNode: func(obj any) ([]string, error) {
			va, ok := obj.(*storagev1.VolumeAttachment)
			if !ok {
				return nil, nil
			}
			return []string{driverNodeKey(va.Spec.Attacher, va.Spec.NodeName)}, nil
		},
		IndexVolumeName: func(obj any) ([]string, error) {
			va, ok := obj.(*storagev1.VolumeAttachment)
			if !ok || va.Spec.Source.PersistentVolumeName == nil {
				return nil, nil
			}
			return []string{*va.Spec.Source.PersistentVolumeName}, nil
		},
	}
}

// PVCIndexers are the indexes the planner needs on the PersistentVolumeClaim informer.
func PVCIndexers() cache.Indexers {
	return cache.Indexers{
		IndexVolumeName: func(obj any) ([]string, error) {
			pvc, ok := obj.(*corev1.PersistentVolumeClaim)
			if !ok || pvc.Spec.VolumeName == "" {
				return nil, nil
			}
			return []string{pvc.Spec.VolumeName}, nil
		},
	}
}

func driverNodeKey(driver, node string) string { return driver + "/" + node }

// Caches are the informer stores the planner reads. Every store comes from a shared informer;
// the planner never calls the API server.
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

// Volume is one volume a sweep may act on, with the objects the policy reads.
type Volume struct {
	// PV is the PersistentVolume.
	PV *corev1.PersistentVolume
	// PVC is the claim bound to PV; nil when it is not in the cache.
	PVC *corev1.PersistentVolumeClaim
	// StorageClass is PV's StorageClass; nil when it has none or it is gone.
	StorageClass *storagev1.StorageClass
	// Attachment is the VolumeAttachment on Node; nil for drivers without an attach step.
	Attachment *storagev1.VolumeAttachment
	// Node is the node object; nil when it is not in the cache.
	Node *corev1.Node
	// NodeName is the node the volume is used on.
	NodeName string
	// Driver is the CSI driver name.
	Driver string
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
	c Caches
}

// NewPlanner returns a planner over c.
func NewPlanner(c Caches) *Planner { return &Planner{c: c} }

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
		va := obj.(*storagev1.VolumeAttachment)
		if va.Spec.Source.PersistentVolumeName == nil {
			continue // an inline volume: no PV to act on
		}
		v, reason := p.volume(*va.Spec.Source.PersistentVolumeName, va, node)
		if reason != "" {
			skipped = append(skipped, Skipped{PV: *va.Spec.Source.PersistentVolumeName, Node: node, Reason: reason})
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
	objs, _ := p.c.PVs.ByIndex(IndexStorageClass, sc)
	var vols []Volume
	var skipped []Skipped
	for _, obj := range objs {
		pv := obj.(*corev1.PersistentVolume)
		if pv.Spec.CSI == nil || !p.AttachRequired(pv.Spec.CSI.Driver) {
			continue
		}
		vas, _ := p.c.VolumeAttachments.ByIndex(IndexVolumeName, pv.Name)
		for _, o := range vas {
			va := o.(*storagev1.VolumeAttachment)
			v, reason := p.volume(pv.Name, va, va.Spec.NodeName)
			if reason != "" {
				skipped = append(skipped, Skipped{PV: pv.Name, Node: va.Spec.NodeName, Reason: reason})
				continue
			}
			vols = append(vols, v)
		}
	}
	sortVolumes(vols)
	return vols, skipped
}

// PVVolumes returns the volume of the PersistentVolume named pv on every node it is attached to.
// For a driver without an attach step it returns nothing: its nodes come from the sidecars.
func (p *Planner) PVVolumes(pv string) ([]Volume, []Skipped) {
	vas, _ := p.c.VolumeAttachments.ByIndex(IndexVolumeName, pv)
	var vols []Volume
	var skipped []Skipped
	for _, o := range vas {
		va := o.(*storagev1.VolumeAttachment)
		v, reason := p.volume(pv, va, va.Spec.NodeName)
		if reason != "" {
			skipped = append(skipped, Skipped{PV: pv, Node: va.Spec.NodeName, Reason: reason})
			continue
		}
		vols = append(vols, v)
	}
	sortVolumes(vols)
	return vols, skipped
}

// PVDriver returns the CSI driver of the PersistentVolume named pv, if it is in the cache.
func (p *Planner) PVDriver(pv string) (string, bool) {
	obj, ok, _ := p.c.PVs.GetByKey(pv)
	if !ok || obj.(*corev1.PersistentVolume).Spec.CSI == nil {
		return "", false
	}
	return obj.(*corev1.PersistentVolume).Spec.CSI.Driver, true
}

// ClassDrivers returns the drivers without an attach step that have PVs in StorageClass sc: a
// periodic sweep asks their sidecars which of those volumes are staged where.
func (p *Planner) ClassDrivers(sc string) []string {
	objs, _ := p.c.PVs.ByIndex(IndexStorageClass, sc)
	seen := map[string]bool{}
	var out []string
	for _, obj := range objs {
		pv := obj.(*corev1.PersistentVolume)
		if pv.Spec.CSI == nil || seen[pv.Spec.CSI.Driver] || p.AttachRequired(pv.Spec.CSI.Driver) {
			continue
		}
		seen[pv.Spec.CSI.Driver] = true
		out = append(out, pv.Spec.CSI.Driver)
	}
	sort.Strings(out)
	return out
}

// InClass reports whether the PV named pv belongs to StorageClass sc.
func (p *Planner) InClass(pv, sc string) bool {
	obj, ok, _ := p.c.PVs.GetByKey(pv)
	return ok && obj.(*corev1.PersistentVolume).Spec.StorageClassName == sc
}

// Recheck applies the built-in guards again to a volume planned earlier, from the caches as they
// are now: a sweep's task may run long after planning, and its VolumeAttachment may have started
// to go away meanwhile. It returns the volume with fresh objects, or the reason to leave it alone.
func (p *Planner) Recheck(v Volume) (Volume, string) {
	var va *storagev1.VolumeAttachment
	if v.Attachment != nil {
		obj, ok, _ := p.c.VolumeAttachments.GetByKey(v.Attachment.Name)
		if !ok {
			return Volume{}, "VolumeAttachment is gone (detached)"
		}
		va = obj.(*storagev1.VolumeAttachment)
	}
	return p.volume(v.PV.Name, va, v.NodeName)
}

// volume gathers the objects of one volume and applies the built-in guards, which no policy can
// override: never act on a volume whose attachment is going away, or whose PV is not Bound or is
// being deleted.
func (p *Planner) volume(pvName string, va *storagev1.VolumeAttachment, node string) (Volume, string) {
	obj, ok, _ := p.c.PVs.GetByKey(pvName)
	if !ok {
		return Volume{}, "PV not found"
	}
	pv := obj.(*corev1.PersistentVolume)
	switch {
	case pv.Spec.CSI == nil:
		return Volume{}, "not a CSI volume"
	case pv.DeletionTimestamp != nil:
		return Volume{}, "PV is being deleted"
	case pv.Status.Phase != corev1.VolumeBound:
		return Volume{}, fmt.Sprintf("PV is %s, not Bound", pv.Status.Phase)
	}
	if va != nil {
		switch {
		case va.DeletionTimestamp != nil:
			return Volume{}, "VolumeAttachment is being deleted (detaching)"
		case !va.Status.Attached:
			return Volume{}, "VolumeAttachment is not attached"
		case va.Status.DetachError != nil:
			return Volume{}, "VolumeAttachment has a detach error (detaching)"
		}
	}
	v := Volume{PV: pv, Attachment: va, NodeName: node, Driver: pv.Spec.CSI.Driver}
	if pvcs, _ := p.c.PVCs.ByIndex(IndexVolumeName, pv.Name); len(pvcs) > 0 {
		v.PVC = pvcs[0].(*corev1.PersistentVolumeClaim)
	}
	if pv.Spec.StorageClassName != "" {
		if o, ok, _ := p.c.StorageClasses.GetByKey(pv.Spec.StorageClassName); ok {
			v.StorageClass = o.(*storagev1.StorageClass)
		}
	}
	if o, ok, _ := p.c.Nodes.GetByKey(node); ok {
		v.Node = o.(*corev1.Node)
	}
	return v, ""
}

func sortVolumes(vols []Volume) {
	sort.Slice(vols, func(i, j int) bool {
		if vols[i].NodeName != vols[j].NodeName {
			return vols[i].NodeName < vols[j].NodeName
		}
		return vols[i].PV.Name < vols[j].PV.Name
	})
}
