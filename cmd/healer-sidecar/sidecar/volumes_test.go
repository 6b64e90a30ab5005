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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
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

// startVolumes runs the caches against a fake clientset holding objs, for driver "d".
func startVolumes(t *testing.T, objs ...any) *volumes {
	t.Helper()
	return startVolumesFor(t, "d", objs...)
}

// startVolumesFor runs the caches against a fake clientset holding objs, for driver driverName.
func startVolumesFor(t testing.TB, driverName string, objs ...any) *volumes {
	t.Helper()
	client := fake.NewClientset()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.PersistentVolume:
			_, err = client.CoreV1().PersistentVolumes().Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Secret:
			_, err = client.CoreV1().Secrets(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	v := runVolumes(t, client, 2*time.Second)
	v.setDriver(driverName)
	return v
}

func runVolumes(t testing.TB, client *fake.Clientset, secretSync time.Duration) *volumes {
	t.Helper()
	v, err := newVolumes(client, &Options{KubeletDir: "/var/lib/kubelet", SecretSyncTimeout: secretSync})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	v.start(ctx)
	t.Cleanup(func() {
		cancel()
		v.stop()
	})
	deadline := time.Now().Add(5 * time.Second)
	for !v.synced() {
		if time.Now().After(deadline) {
			t.Fatal("PV cache did not sync")
		}
		time.Sleep(10 * time.Millisecond)
	}
	v.setDriver("d")
	return v
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
		"PV whose secret is missing":       {pv: "no-secret", wantErr: ErrSecretNotFound, wantCode: codes.FailedPrecondition},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			vol, err := v.resolve(context.Background(), "d", tc.pv)
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

func TestPVNameFor(t *testing.T) {
	v := startVolumes(t,
		testPV("b-static", "d", "shared"),
		testPV("a-static", "d", "shared"),
		testPV("other", "x", "vol-x"),
	)
	tests := map[string]struct {
		driver, handle, want string
	}{
		"two PVs share a handle: the first by name": {driver: "d", handle: "shared", want: "a-static"},
		"handle of another driver":                  {driver: "d", handle: "vol-x", want: ""},
		"unknown handle":                            {driver: "d", handle: "nothing", want: ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := v.pvNameFor(tc.driver, tc.handle); got != tc.want {
				t.Errorf("pvNameFor(%q, %q) = %q, want %q", tc.driver, tc.handle, got, tc.want)
			}
		})
	}
}

// TestSecretsForbidden fails calls quickly, with a message about RBAC, when the sidecar may not
// list the Secrets of a namespace.
func TestSecretsForbidden(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "", errors.New("RBAC: access denied"))
	})
	pv := testPV("mine", "d", "vol-1", func(pv *corev1.PersistentVolume) {
		pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: "ceph", Name: "stage"}
	})
	if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v := runVolumes(t, client, time.Minute)
	for i := range 2 {
		start := time.Now()
		_, err := v.resolve(context.Background(), "d", "mine")
		if !errors.Is(err, ErrSecretsUnavailable) || !strings.Contains(err.Error(), "forbidden") {
			t.Fatalf("call %d: %v, want ErrSecretsUnavailable saying why", i+1, err)
		}
		if status.Code(toStatus(err)) != codes.Unavailable {
			t.Errorf("call %d: code %s, want UNAVAILABLE", i+1, status.Code(toStatus(err)))
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("call %d took %s; a failed list should not wait out the one-minute sync timeout", i+1, took)
		}
	}
}

// The cache keeps a lean copy of every PV: what the driver is sent must not change because of it.
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
			obj, err := LeanPersistentVolume(pv.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			lean := obj.(*corev1.PersistentVolume)
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
