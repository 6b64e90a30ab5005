package controlplane_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/fixtures"
)

// TestStorageObjectsRoundTrip puts the objects the healer works with into a real apiserver and reads
// them back the way the controller does: through informers.
func TestStorageObjectsRoundTrip(t *testing.T) {
	env := controlplane.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	version, err := env.Clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if version.GitVersion == "v0.0.0-master" || version.Major != "1" {
		t.Errorf("apiserver reports version %q (major %q); hack/control-plane.sh must stamp a release version", version.GitVersion, version.Major)
	}
	if want := os.Getenv(controlplane.KubeVersionEnv); want != "" && version.GitVersion != want {
		t.Errorf("apiserver reports version %q, but %s chose %s", version.GitVersion, controlplane.KubeVersionEnv, want)
	}
	minor, err := env.Minor()
	if err != nil {
		t.Fatal(err)
	}
	if version.Minor != strconv.Itoa(minor) {
		t.Errorf("Minor() = %d, the apiserver reports minor %q", minor, version.Minor)
	}
	t.Run("RequireMinor of a newer release skips", func(t *testing.T) {
		env.RequireMinor(t, minor+1, "a newer release")
		t.Errorf("RequireMinor(%d) did not skip on Kubernetes 1.%d", minor+1, minor)
	})
	t.Run("RequireMinor of this release runs", func(t *testing.T) {
		env.RequireMinor(t, minor, "this release")
		if t.Skipped() {
			t.Errorf("RequireMinor(%d) skipped on Kubernetes 1.%d", minor, minor)
		}
	})

	set, err := fixtures.Drivers()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range set.CSIDrivers {
		mustCreate(ctx, t, env.Client, d)
	}
	for _, sc := range set.StorageClasses {
		mustCreate(ctx, t, env.Client, sc)
	}
	for _, pv := range set.PVs {
		mustCreate(ctx, t, env.Client, pv)
	}
	mustCreate(ctx, t, env.Client, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	for _, ns := range []string{"shop", "csi-system"} {
		mustCreate(ctx, t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	mustCreate(ctx, t, env.Client, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-db"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr("ceph-rbd-nbd"),
			VolumeName:       set.PVs[0].Name,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: set.PVs[0].Spec.Capacity[corev1.ResourceStorage],
			}},
		},
	})
	mustCreate(ctx, t, env.Client, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-orders-db-node-a"},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: "rbd.csi.ceph.com",
			NodeName: "node-a",
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &set.PVs[0].Name},
		},
	})
	mustCreate(ctx, t, env.Client, &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   "csi-system",
			Name:        "node-a-rbd",
			Annotations: map[string]string{"sidecar.csiaddons.openshift.io/lastUpdatedAt": "2026-11-29T10:00:00Z"},
		},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
			Name: "rbd.csi.ceph.com", NodeID: "node-a", EndPoint: "pod://csi-rbdplugin-abcde.csi-system:9070",
		}},
	})

	// Storage objects through a client-go shared informer, indexed the way the planner selects volumes.
	factory := informers.NewSharedInformerFactory(env.Clientset, 0)
	vaInformer := factory.Storage().V1().VolumeAttachments().Informer()
	if err := vaInformer.AddIndexers(cache.Indexers{"driverNode": func(obj any) ([]string, error) {
		va := obj.(*storagev1.VolumeAttachment)
		return []string{va.Spec.Attacher + "/" + va.Spec.NodeName}, nil
	}}); err != nil {
		t.Fatal(err)
	}
	pvLister := factory.Core().V1().PersistentVolumes().Lister()
	scLister := factory.Storage().V1().StorageClasses().Lister()
	factory.Start(ctx.Done())
	// Shutdown waits for the informers, which stop when ctx ends: cancel first.
	defer factory.Shutdown()
	defer cancel()
	for typ, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			t.Fatalf("informer for %v did not sync", typ)
		}
	}
	vas, err := vaInformer.GetIndexer().ByIndex("driverNode", "rbd.csi.ceph.com/node-a")
	if err != nil || len(vas) != 1 {
		t.Fatalf("VolumeAttachments for rbd.csi.ceph.com on node-a: got %d (%v), want 1", len(vas), err)
	}
	pvs, err := pvLister.List(labels.Everything())
	if err != nil || len(pvs) != len(set.PVs) {
		t.Fatalf("PVs through the informer: got %d (%v), want %d", len(pvs), err, len(set.PVs))
	}
	sc, err := scLister.Get("ceph-rbd-nbd")
	if err != nil {
		t.Fatalf("StorageClass ceph-rbd-nbd through the informer: %v", err)
	}
	if sc.Parameters["mounter"] != "rbd-nbd" {
		t.Errorf("StorageClass ceph-rbd-nbd mounter = %q, want rbd-nbd", sc.Parameters["mounter"])
	}

	// CSIAddonsNode through a controller-runtime informer cache: the CRD from the module is served.
	informerCache, err := crcache.New(env.Config, crcache.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = informerCache.Start(ctx) }()
	if !informerCache.WaitForCacheSync(ctx) {
		t.Fatal("controller-runtime cache did not sync")
	}
	var node csiaddonsv1alpha1.CSIAddonsNode
	key := client.ObjectKey{Namespace: "csi-system", Name: "node-a-rbd"}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := informerCache.Get(ctx, key, &node)
		return err == nil, client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatalf("CSIAddonsNode through the cache: %v", err)
	}
	if node.Spec.Driver.NodeID != "node-a" || node.Annotations["sidecar.csiaddons.openshift.io/lastUpdatedAt"] == "" {
		t.Errorf("CSIAddonsNode read back = %+v, want nodeID node-a with its restart marker", node.Spec.Driver)
	}

	// The CRD's own validation runs: nodeID is immutable.
	node.Spec.Driver.NodeID = "node-b"
	if err := env.Client.Update(ctx, &node); err == nil || !apierrors.IsInvalid(err) {
		t.Errorf("changing an immutable nodeID: got %v, want an Invalid error from the CRD's validation", err)
	}

	// The kubeconfig written for people and processes reaches the same apiserver.
	cfg, err := clientcmd.BuildConfigFromFlags("", env.Kubeconfig)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", env.Kubeconfig, err)
	}
	if strings.TrimSuffix(cfg.Host, "/") != strings.TrimSuffix(env.Config.Host, "/") {
		t.Errorf("kubeconfig host %s, want %s", cfg.Host, env.Config.Host)
	}
}

func mustCreate(ctx context.Context, t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(ctx, obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestAPIServerRestart stops kube-apiserver while etcd keeps running and starts it again: the
// objects are still there, the clients, the kubeconfig file and a ServiceAccount token made before
// the restart work again, and a watch started before the restart resumes and delivers what was
// created after it.
func TestAPIServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and restarts kube-apiserver; run without -short")
	}
	env := controlplane.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs := env.Clientset
	mustCreate(ctx, t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "restart"}})
	mustCreate(ctx, t, env.Client, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "restart", Name: "robot"}})
	mustCreate(ctx, t, env.Client, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "restart", Name: "before"}})
	tok, err := cs.CoreV1().ServiceAccounts("restart").CreateToken(ctx, "robot", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace("restart"))
	cmInformer := factory.Core().V1().ConfigMaps().Informer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), cmInformer.HasSynced) {
		t.Fatal("ConfigMap informer did not sync")
	}

	if err := env.StopAPIServer(); err != nil {
		t.Fatalf("StopAPIServer: %v", err)
	}
	if _, err := cs.CoreV1().ConfigMaps("restart").Get(ctx, "before", metav1.GetOptions{}); err == nil {
		t.Fatal("the apiserver still answers after StopAPIServer returned")
	}
	if err := env.StopAPIServer(); err != nil {
		t.Errorf("StopAPIServer on a stopped apiserver: %v, want nil", err)
	}
	if err := env.StartAPIServer(); err != nil {
		t.Fatalf("StartAPIServer: %v", err)
	}
	if err := env.StartAPIServer(); err != nil {
		t.Errorf("StartAPIServer on a running apiserver: %v, want nil", err)
	}
	if err := env.Ready(ctx); err != nil {
		t.Fatal(err)
	}

	if _, err := cs.CoreV1().ConfigMaps("restart").Get(ctx, "before", metav1.GetOptions{}); err != nil {
		t.Errorf("the ConfigMap created before the restart: %v", err)
	}
	mustCreate(ctx, t, env.Client, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "restart", Name: "after"}})
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, ok, err := cmInformer.GetStore().GetByKey("restart/after")
		return ok, err
	}); err != nil {
		t.Errorf("the informer started before the restart did not see the ConfigMap created after it: %v", err)
	}

	review, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tok.Status.Token}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !review.Status.Authenticated || review.Status.User.Username != "system:serviceaccount:restart:robot" {
		t.Errorf("a token issued before the restart: authenticated %v as %q (%s); want the ServiceAccount",
			review.Status.Authenticated, review.Status.User.Username, review.Status.Error)
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fromFile.CoreV1().Namespaces().Get(ctx, "restart", metav1.GetOptions{}); err != nil {
		t.Errorf("the kubeconfig file written before the restart: %v", err)
	}
}
