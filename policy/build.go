package policy

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// BuildInput builds the first-evaluation input for a volume from its cluster objects. pv is
// required; pvc, sc, va and node may be nil when they do not exist (an unbound PV, a deleted
// StorageClass, a driver without attach step, a node not in the cache). The caller sets History,
// and Probe for the second evaluation.
//
// Maps and slices are shared with the objects, not copied: the input is read-only to the engine,
// and objects from informer caches must not be modified anyway.
func BuildInput(pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass,
	va *storagev1.VolumeAttachment, node *corev1.Node, driver DriverInfo, trigger Trigger) Input {
	in := Input{Trigger: trigger, Driver: driver}
	in.Volume.PV = pv.Name
	if csi := pv.Spec.CSI; csi != nil {
		in.Volume.Handle = csi.VolumeHandle
		in.Volume.Driver = csi.Driver
		in.Volume.Attributes = csi.VolumeAttributes
	}
	if in.Driver.Name == "" {
		in.Driver.Name = in.Volume.Driver
	}
	in.Volume.MountOptions = pv.Spec.MountOptions
	for _, m := range pv.Spec.AccessModes {
		in.Volume.AccessModes = append(in.Volume.AccessModes, string(m))
	}
	if name := pv.Spec.StorageClassName; name != "" {
		in.Volume.StorageClass = &StorageClass{Name: name}
		if sc != nil && sc.Name == name {
			in.Volume.StorageClass.Parameters = sc.Parameters
		}
	}
	switch ref := pv.Spec.ClaimRef; {
	case pvc != nil:
		in.Volume.PVC = &Claim{Namespace: pvc.Namespace, Name: pvc.Name, Labels: pvc.Labels, Annotations: pvc.Annotations}
	case ref != nil && pv.Status.Phase == corev1.VolumeBound:
		// Bound, but the claim is not at hand (a cache that lags): what the PV says is still true.
		in.Volume.PVC = &Claim{Namespace: ref.Namespace, Name: ref.Name}
	}
	if va != nil {
		in.Attachment = &Attachment{Node: va.Spec.NodeName, Attached: va.Status.Attached, Detaching: va.DeletionTimestamp != nil}
	}
	switch {
	case node != nil:
		in.Node = &Node{Name: node.Name, Labels: node.Labels}
	case va != nil:
		in.Node = &Node{Name: va.Spec.NodeName}
	}
	return in
}

// ClusterInputOptions say what InputFromCluster cannot read from the API server.
type ClusterInputOptions struct {
	// Trigger is the sweep to pretend. Required.
	Trigger Trigger
	// Node is the node to assume when the volume has no VolumeAttachment. Default "": taken from
	// the VolumeAttachment, absent without one.
	Node string
	// Driver is what to assume the driver advertises; only the driver itself knows. Name defaults
	// to the PV's driver.
	Driver DriverInfo
	// History is what to assume the controller remembers. Default: nothing.
	History History
	// Probe is the probe result to assume, for the second evaluation. Default nil: the first.
	Probe *ProbeResult
	// Remedies are the remedies to assume allowed; Heal is always taken from Driver. Default:
	// none but heal.
	Remedies Remedies
}

// InputFromCluster builds the input for the PersistentVolume named pv from a live cluster, with
// GETs and one LIST of VolumeAttachments. It calls no sidecar and no driver: what only they know
// comes from opts.
func InputFromCluster(ctx context.Context, client kubernetes.Interface, pv string, opts ClusterInputOptions) (Input, error) {
	vol, err := client.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
	if err != nil {
		return Input{}, fmt.Errorf("reading PersistentVolume %s: %w", pv, err)
	}
	var pvc *corev1.PersistentVolumeClaim
	if ref := vol.Spec.ClaimRef; ref != nil {
		pvc, err = getOptional(client.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{}))
		if err != nil {
			return Input{}, fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", ref.Namespace, ref.Name, err)
		}
		if pvc != nil && ref.UID != "" && pvc.UID != ref.UID {
			pvc = nil // a newer claim of the same name, not the one the PV is bound to
		}
	}
	var sc *storagev1.StorageClass
	if name := vol.Spec.StorageClassName; name != "" {
		sc, err = getOptional(client.StorageV1().StorageClasses().Get(ctx, name, metav1.GetOptions{}))
		if err != nil {
			return Input{}, fmt.Errorf("reading StorageClass %s: %w", name, err)
		}
	}
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return Input{}, fmt.Errorf("listing VolumeAttachments: %w", err)
	}
	var va *storagev1.VolumeAttachment
	for i := range vas.Items {
		a := &vas.Items[i]
		if src := a.Spec.Source.PersistentVolumeName; src == nil || *src != pv {
			continue
		}
		if opts.Node != "" && a.Spec.NodeName != opts.Node {
			continue
		}
		if va == nil || (a.Status.Attached && !va.Status.Attached) {
			va = a
		}
	}
	nodeName := opts.Node
	if nodeName == "" && va != nil {
		nodeName = va.Spec.NodeName
	}
	var node *corev1.Node
	if nodeName != "" {
		node, err = getOptional(client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}))
		if err != nil {
			return Input{}, fmt.Errorf("reading Node %s: %w", nodeName, err)
		}
	}
	in := BuildInput(vol, pvc, sc, va, node, opts.Driver, opts.Trigger)
	if in.Node == nil && nodeName != "" {
		in.Node = &Node{Name: nodeName}
	}
	in.History = opts.History
	in.Probe = opts.Probe
	in.Remedies = opts.Remedies
	in.Remedies.Heal = in.Driver.Healer.Heal
	return in, nil
}

// getOptional turns the result of a GET of an object that may not exist into the object or nil.
func getOptional[T any](obj *T, err error) (*T, error) {
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return obj, nil
}

// AssumedDriver builds the driver part of an input from what an operator says the driver
// advertises: healer capabilities by name (probe, heal, listVolumes, and the volume keeping
// pluginRestart and mounterRestart), identity capabilities and attributes.
func AssumedDriver(healer, identity []string, attributes map[string]string) (DriverInfo, error) {
	d := DriverInfo{IdentityCapabilities: identity, Healer: HealerCapabilities{Attributes: attributes}}
	for _, c := range healer {
		switch strings.ToLower(strings.TrimSpace(c)) {
		case "probe":
			d.Healer.Probe = true
		case "heal":
			d.Healer.Heal = true
		case "listvolumes":
			d.Healer.ListVolumes = true
		case "pluginrestart":
			d.Healer.VolumeKeeping.PluginRestart = true
		case "mounterrestart":
			d.Healer.VolumeKeeping.MounterRestart = true
		case "", "none":
		default:
			return DriverInfo{}, fmt.Errorf("%w: healer capability %q is not one of probe, heal, listVolumes, pluginRestart, mounterRestart", ErrInvalidInput, c)
		}
	}
	// A driver that does not probe has its volumes probed by the sidecar.
	d.ProbeSource = "driver"
	if !d.Healer.Probe {
		d.ProbeSource = "sidecar"
	}
	d.Tier = TierOf(d.Healer.Probe, d.Healer.Heal, d.ProbeSource)
	return d, nil
}

// AssumedProbe builds a probe result from a status: "healthy", or a CSI VolumeHealth status
// (DEGRADED, INACCESSIBLE, DATA_LOSS; case and dashes do not matter).
func AssumedProbe(status, reason string, healable bool) (*ProbeResult, error) {
	s := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(status), "-", "_"))
	switch HealthStatus(s) {
	case "HEALTHY":
		return &ProbeResult{Healthy: true, Healable: healable}, nil
	case HealthDegraded, HealthInaccessible, HealthDataLoss:
		return &ProbeResult{Healable: healable, Health: []Health{{Status: HealthStatus(s), Reason: reason, Message: "assumed"}}}, nil
	}
	return nil, fmt.Errorf("%w: probe status %q is not one of healthy, DEGRADED, INACCESSIBLE, DATA_LOSS", ErrInvalidInput, status)
}
