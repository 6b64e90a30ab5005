package sidecar

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

func testPV(name, driver, handle string, mutate ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: handle, FSType: "xfs",
			}},
		},
	}
	for _, m := range mutate {
		m(pv)
	}
	return pv
}

func TestVolumeCapability(t *testing.T) {
	block := corev1.PersistentVolumeBlock
	mount := func(mode csi.VolumeCapability_AccessMode_Mode, fsType string, flags ...string) *csi.VolumeCapability {
		return &csi.VolumeCapability{
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: flags}},
		}
	}
	tests := map[string]struct {
		pv   *corev1.PersistentVolume
		want *csi.VolumeCapability
	}{
		"ReadWriteOnce filesystem": {
			pv:   testPV("a", "d", "h"),
			want: mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "xfs"),
		},
		"mount options become mount flags": {
			pv:   testPV("a", "d", "h", func(pv *corev1.PersistentVolume) { pv.Spec.MountOptions = []string{"noatime", "discard"} }),
			want: mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "xfs", "noatime", "discard"),
		},
		"ReadWriteMany uses the first mode": {
			pv: testPV("a", "d", "h", func(pv *corev1.PersistentVolume) {
				pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany, corev1.ReadOnlyMany}
			}),
			want: mount(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "xfs"),
		},
		"ReadOnlyMany": {
			pv: testPV("a", "d", "h", func(pv *corev1.PersistentVolume) {
				pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}
			}),
			want: mount(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, "xfs"),
		},
		"ReadWriteOncePod": {
			pv: testPV("a", "d", "h", func(pv *corev1.PersistentVolume) {
				pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
			}),
			want: mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, "xfs"),
		},
		"no access mode defaults to ReadWriteOnce": {
			pv:   testPV("a", "d", "h", func(pv *corev1.PersistentVolume) { pv.Spec.AccessModes = nil }),
			want: mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "xfs"),
		},
		"raw block": {
			pv: testPV("a", "d", "h", func(pv *corev1.PersistentVolume) { pv.Spec.VolumeMode = &block }),
			want: &csi.VolumeCapability{
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
				AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := volumeCapability(tc.pv); !proto.Equal(got, tc.want) {
				t.Errorf("volumeCapability = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStagingPath(t *testing.T) {
	block := corev1.PersistentVolumeBlock
	tests := map[string]struct {
		pv   *corev1.PersistentVolume
		want string
	}{
		"filesystem volume: driver and hash of the handle": {
			pv: testPV("pvc-1", "rbd.csi.ceph.com", "0001-0009-rook-ceph-0000000000000002-abc"),
			// sha256("0001-0009-rook-ceph-0000000000000002-abc")
			want: "/var/lib/kubelet/plugins/kubernetes.io/csi/rbd.csi.ceph.com/" +
				"81bf8208e0d6c5e9cfa19d234d342ce88095586aa94d4a6fdff191b313819d27/globalmount",
		},
		"block volume: by PV name": {
			pv:   testPV("pvc-1", "rbd.csi.ceph.com", "h", func(pv *corev1.PersistentVolume) { pv.Spec.VolumeMode = &block }),
			want: "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := stagingPath("/var/lib/kubelet", tc.pv); got != tc.want {
				t.Errorf("stagingPath = %q, want %q", got, tc.want)
			}
		})
	}
}

// startVolumes reads from a fake clientset holding objs, for driver "d".
func startVolumes(t *testing.T, objs ...any) *volumes {
	t.Helper()
	return startVolumesFor(t, objs...)
}

// startVolumesFor reads from a fake clientset holding objs.
func startVolumesFor(t testing.TB, objs ...any) *volumes {
	t.Helper()
	client := fake.NewClientset()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.PersistentVolume:
			_, err = client.CoreV1().PersistentVolumes().Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Secret:
			_, err = client.CoreV1().Secrets(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{})
		case *storagev1.VolumeAttachment:
			_, err = client.StorageV1().VolumeAttachments().Create(context.Background(), o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return runVolumes(client)
}

// attachedHere is the VolumeAttachment of volume "vol-1" of driver "d", attached to node-1 for
// the PV named pvName.
func attachedHere(pvName string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: healerv1alpha1.VolumeAttachmentName("vol-1", "d", "node-1")},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: "d", NodeName: "node-1",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
}

func runVolumes(client *fake.Clientset) *volumes {
	return newVolumes(client, &Options{NodeName: "node-1", KubeletDir: "/var/lib/kubelet", SecretCacheTTL: time.Minute})
}

// resolveWithSecrets resolves pv as a call does once the volume is known to be on the node.
func resolveWithSecrets(v *volumes, driver, pv string) (*volume, error) {
	vol, err := v.resolve(context.Background(), driver, pv)
	if err != nil {
		return nil, err
	}
	if err := v.stageSecrets(context.Background(), vol); err != nil {
		return nil, err
	}
	return vol, nil
}

func TestResolve(t *testing.T) {
	secretRef := func(name string) func(*corev1.PersistentVolume) {
		return func(pv *corev1.PersistentVolume) {
			pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: "ceph", Name: name}
			pv.Spec.CSI.VolumeAttributes = map[string]string{"pool": "rbd"}
		}
	}
	v := startVolumes(t,
		testPV("mine", "d", "vol-1", secretRef("stage")),
		testPV("no-secret", "d", "vol-2", secretRef("gone")),
		testPV("theirs", "other", "vol-3"),
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "nfs"}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs", Path: "/"}},
		}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ceph", Name: "stage"}, Data: map[string][]byte{"key": []byte("s3cret")}},
	)
	tests := map[string]struct {
		pv       string
		wantErr  error
		wantCode codes.Code
	}{
		"PV of the driver with its secret": {pv: "mine"},
		"unknown PV":                       {pv: "nope", wantErr: ErrPVNotFound, wantCode: codes.NotFound},
		"PV of another driver":             {pv: "theirs", wantErr: ErrOtherDriver, wantCode: codes.InvalidArgument},
		"PV that is not CSI":               {pv: "nfs", wantErr: ErrNotCSIVolume, wantCode: codes.InvalidArgument},
		"PV whose secret is missing":       {pv: "no-secret", wantErr: ErrSecretNotFound, wantCode: codes.Unavailable},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			vol, err := resolveWithSecrets(v, "d", tc.pv)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("resolve: %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				if got := status.Code(toStatus(err)); got != tc.wantCode {
					t.Errorf("code = %s, want %s", got, tc.wantCode)
				}
				return
			}
			if vol.volumeID != "vol-1" || vol.secrets["key"] != "s3cret" || vol.context["pool"] != "rbd" {
				t.Errorf("resolved %+v, want vol-1 with its secret and volume context", vol)
			}
		})
	}
}

// TestPVNameFor names the PV of a volume the driver lists from the PVs the sidecar read, and
// leaves the others to the controller.
func TestPVNameFor(t *testing.T) {
	v := startVolumes(t,
		testPV("read", "d", "vol-1"),
		testPV("unread", "d", "vol-2"),
		testPV("other", "x", "vol-x"),
	)
	if _, err := v.resolve(context.Background(), "d", "read"); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		driver, handle, want string
	}{
		"a PV the sidecar read":    {driver: "d", handle: "vol-1", want: "read"},
		"a PV it has not read":     {driver: "d", handle: "vol-2", want: ""},
		"handle of another driver": {driver: "d", handle: "vol-x", want: ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := v.pvNameFor(tc.driver, tc.handle); got != tc.want {
				t.Errorf("pvNameFor(%q, %q) = %q, want %q", tc.driver, tc.handle, got, tc.want)
			}
		})
	}
}

// TestSecretsForbidden fails a call at once, with a message naming the Secret and the RBAC it
// needs, when the sidecar may not get the node-stage Secret.
func TestSecretsForbidden(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "stage", errors.New("RBAC: access denied"))
	})
	pv := testPV("mine", "d", "vol-1", func(pv *corev1.PersistentVolume) {
		pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: "ceph", Name: "stage"}
	})
	if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v := runVolumes(client)
	_, err := resolveWithSecrets(v, "d", "mine")
	if !errors.Is(err, ErrSecretsUnavailable) || !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "ceph/stage") {
		t.Fatalf("%v, want ErrSecretsUnavailable naming ceph/stage and saying why", err)
	}
	if status.Code(toStatus(err)) != codes.Unavailable {
		t.Errorf("code %s, want UNAVAILABLE", status.Code(toStatus(err)))
	}
}

// TestVolumesReadOnlyWhatACallNeeds: resolving a volume, checking its attachment and reading its
// Secret are GETs of those objects by name, each PV and Secret read once however many calls need
// it; nothing is listed or watched, so the rest of the cluster costs the sidecar nothing.
func TestVolumesReadOnlyWhatACallNeeds(t *testing.T) {
	pvName := "mine"
	client := fake.NewClientset(
		testPV(pvName, "d", "vol-1", func(pv *corev1.PersistentVolume) {
			pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: "ceph", Name: "stage"}
		}),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ceph", Name: "stage"}, Data: map[string][]byte{"key": []byte("k")}},
		attachedHere(pvName),
	)
	v := runVolumes(client)
	for range 3 {
		vol, err := resolveWithSecrets(v, "d", pvName)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := v.attachedHere(context.Background(), "d", pvName, vol.volumeID, 0); !ok || err != nil {
			t.Fatalf("attachedHere = %v, %v; want true", ok, err)
		}
	}
	got := map[string]int{}
	for _, a := range client.Actions() {
		got[a.GetVerb()+" "+a.GetResource().Resource]++
	}
	want := map[string]int{"get persistentvolumes": 1, "get secrets": 1, "get volumeattachments": 3}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("API requests %v, want %v", got, want)
	}
}

// TestProbesGoByARecentAttachment: a probe takes an "attached here" read in the last minute as it
// is; a heal reads the VolumeAttachment again, and so does any call once the answer is older or
// was "not attached", so that a volume that left the node is refused from the first read that
// saw it leave.
func TestProbesGoByARecentAttachment(t *testing.T) {
	pvName := "mine"
	va := attachedHere(pvName)
	client := fake.NewClientset(va)
	clk := testingclock.NewFakeClock(time.Now())
	v := newVolumes(client, &Options{NodeName: "node-1", KubeletDir: "/var/lib/kubelet", Clock: clk})
	ctx := context.Background()
	reads := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "volumeattachments" {
				n++
			}
		}
		return n
	}
	step := func(what string, reuse time.Duration, wantAttached bool, wantReads int) {
		t.Helper()
		ok, err := v.attachedHere(ctx, "d", pvName, "vol-1", reuse)
		if err != nil || ok != wantAttached {
			t.Fatalf("%s: attached %v, %v; want %v", what, ok, err, wantAttached)
		}
		if got := reads(); got != wantReads {
			t.Errorf("%s: %d reads of the VolumeAttachment so far, want %d", what, got, wantReads)
		}
	}
	step("first probe", probeAttachmentFresh, true, 1)
	clk.Step(probeAttachmentFresh / 2)
	step("probe within the minute", probeAttachmentFresh, true, 1)
	step("heal", 0, true, 2)
	clk.Step(probeAttachmentFresh)
	step("probe after the minute", probeAttachmentFresh, true, 3)

	// The volume leaves the node: the next heal sees it, and a probe within the minute of the
	// last "attached" does not go by that one any more.
	va.Status.Attached = false
	if err := client.Tracker().Update(storagev1.SchemeGroupVersion.WithResource("volumeattachments"), va, ""); err != nil {
		t.Fatal(err)
	}
	step("heal after the detach", 0, false, 4)
	step("probe after the detach", probeAttachmentFresh, false, 5)
	step("probe again", probeAttachmentFresh, false, 6)
}

// The cache keeps a lean copy of each PV it reads: what the driver is sent must not change because of it.
func TestLeanPersistentVolumeResolvesTheSame(t *testing.T) {
	block := corev1.PersistentVolumeBlock
	pvs := map[string]*corev1.PersistentVolume{
		"filesystem": testPV("fs", "d", "vol-1", func(pv *corev1.PersistentVolume) {
			pv.Labels = map[string]string{"big": "label"}
			pv.Spec.MountOptions = []string{"discard"}
			pv.Spec.CSI.ReadOnly = true
			pv.Spec.CSI.VolumeAttributes = map[string]string{"pool": "rbd"}
			pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: "ceph", Name: "stage"}
			pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "shop", Name: "db"}
		}),
		"raw block": testPV("blk", "d", "vol-2", func(pv *corev1.PersistentVolume) {
			pv.Spec.VolumeMode = &block
			pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
		}),
	}
	for name, pv := range pvs {
		t.Run(name, func(t *testing.T) {
			lean := leanPersistentVolume(pv.DeepCopy())
			if lean.Labels != nil || lean.Spec.ClaimRef != nil {
				t.Errorf("lean copy keeps fields nothing reads: %+v", lean)
			}
			if got, want := stagingPath("/var/lib/kubelet", lean), stagingPath("/var/lib/kubelet", pv); got != want {
				t.Errorf("staging path %q, want %q", got, want)
			}
			if got, want := volumeCapability(lean).String(), volumeCapability(pv).String(); got != want {
				t.Errorf("capability %s, want %s", got, want)
			}
			if !reflect.DeepEqual(lean.Spec.CSI, pv.Spec.CSI) {
				t.Errorf("CSI source %+v, want %+v", lean.Spec.CSI, pv.Spec.CSI)
			}
		})
	}
}

// TestAnsweredThroughAnOutage: once read, a PV, its attachment and its Secret are used while the
// API server cannot be reached, past their freshness, and not when the API server says the
// object is gone.
func TestAnsweredThroughAnOutage(t *testing.T) {
	pvName := "mine"
	va := attachedHere(pvName)
	client := fake.NewClientset(
		testPV(pvName, "d", "vol-1", func(pv *corev1.PersistentVolume) {
			pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: "ceph", Name: "stage"}
		}),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ceph", Name: "stage"}, Data: map[string][]byte{"key": []byte("k")}},
		va,
	)
	clk := testingclock.NewFakeClock(time.Now())
	v := newVolumes(client, &Options{NodeName: "node-1", KubeletDir: "/var/lib/kubelet", SecretCacheTTL: time.Minute, Clock: clk})
	ctx := context.Background()
	check := func(when string) error {
		vol, err := resolveWithSecrets(v, "d", pvName)
		if err != nil {
			return err
		}
		ok, err := v.attachedHere(ctx, "d", pvName, vol.volumeID, 0)
		if err != nil {
			return err
		}
		if !ok || vol.secrets["key"] != "k" {
			t.Fatalf("%s: attached %v, secrets %v; want attached with its Secret", when, ok, vol.secrets)
		}
		return nil
	}
	if err := check("API server up"); err != nil {
		t.Fatal(err)
	}
	clk.Step(10 * time.Minute)
	client.PrependReactor("get", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("the API server is down")
	})
	if err := check("API server down"); err != nil {
		t.Fatalf("API server down: %v, want the last answers", err)
	}
	client.PrependReactor("get", "volumeattachments", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "storage.k8s.io", Resource: "volumeattachments"}, va.Name)
	})
	if ok, err := v.attachedHere(ctx, "d", pvName, "vol-1", probeAttachmentFresh); ok || err != nil {
		t.Errorf("VolumeAttachment gone: attached %v, %v; want not attached", ok, err)
	}
}
