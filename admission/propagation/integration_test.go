package propagation

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/policy/webhook"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

// breakable is the policy engine, or a failing policy while broken is set.
type breakable struct {
	engine *policy.Engine
	broken atomic.Bool
}

func (b *breakable) DecidePropagation(ctx context.Context, in *policy.PropagationInput) (policy.PropagationDecisions, bool, error) {
	if b.broken.Load() {
		return failingPolicy{}.DecidePropagation(ctx, in)
	}
	return b.engine.DecidePropagation(ctx, in)
}

// TestWebhookAgainstAPIServer registers the webhook with a real kube-apiserver as deploy/ does (a
// URL and a caBundle in place of the Service), served by the policy webhook's server over HTTPS,
// and creates pods: the apiserver stores HostToContainer on the mounts of opted-in CSI claims
// only; a pod that is not opted in is stored as it was sent; while the policy fails, and while
// the webhook is down, pods are still created, unchanged, and the failure shows in the metric
// and as an Event the apiserver stored.
func TestWebhookAgainstAPIServer(t *testing.T) {
	env := controlplane.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := env.Clientset

	const driver = "fuse.csi.example.com"
	create(t, client, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driver}})
	create(t, client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fuse"}, Provisioner: driver})
	create(t, client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "opted", Labels: optIn}})
	create(t, client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain"}})
	for _, ns := range []string{"opted", "plain"} {
		pv := "pv-" + ns
		create(t, client, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv}, Spec: corev1.PersistentVolumeSpec{
			StorageClassName: "fuse", AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: "data"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: pv}},
		}})
		class := "fuse"
		create(t, client, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data"}, Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class, VolumeName: pv, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		}})
	}

	// The controller's caches, as informers of the objects the webhook reads.
	factory := informers.NewSharedInformerFactory(client, 0)
	objects := &Caches{
		Namespaces: factory.Core().V1().Namespaces().Informer().GetStore(), Claims: factory.Core().V1().PersistentVolumeClaims().Informer().GetStore(),
		Volumes: factory.Core().V1().PersistentVolumes().Informer().GetStore(), StorageClasses: factory.Storage().V1().StorageClasses().Informer().GetStore(),
		CSIDrivers: factory.Storage().V1().CSIDrivers().Informer().GetStore(), Client: client,
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	defer func() {
		cancel() // the informers stop with the context
		factory.Shutdown()
	}()

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	engine, err := policy.NewEngine(ctx, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	decider := &breakable{engine: engine}
	reg := prometheus.NewRegistry()
	h, err := NewHandler(Options{Policy: decider, Objects: objects, Metrics: NewMetrics(reg),
		Recorder: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "volume-healer"})})
	if err != nil {
		t.Fatal(err)
	}
	stop, caBundle, url := serve(t, h)

	register(t, client, url, caBundle)
	// The apiserver picks a new webhook configuration up from its own cache: a dry run stores
	// nothing.
	harness.Eventually(t, 30*time.Second, "the apiserver to call the propagation webhook", func() (bool, string) {
		p, err := client.CoreV1().Pods("opted").Create(ctx, appPod("probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		return propagationOf(p)["app:/data"] == "HostToContainer", fmt.Sprint(propagationOf(p))
	})

	// Opted in: HostToContainer on both containers' mounts of the CSI claim, nothing else.
	got := propagationOf(createPod(t, client, "opted", appPod("web")))
	want := map[string]string{"app:/data": "HostToContainer", "app:/cache": "", "sidecar:/data": "HostToContainer", "sidecar:/config": ""}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("opted-in pod stored with %v, want %v", got, want)
	}
	// Not opted in: stored as sent.
	want = map[string]string{"app:/data": "", "app:/cache": "", "sidecar:/data": "None", "sidecar:/config": ""}
	if got := propagationOf(createPod(t, client, "plain", appPod("web"))); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pod not opted in stored with %v, want %v", got, want)
	}

	// The policy fails: created unchanged, counted, and an Event in the pod's namespace.
	decider.broken.Store(true)
	want = map[string]string{"app:/data": "", "app:/cache": "", "sidecar:/data": "None", "sidecar:/config": ""}
	if got := propagationOf(createPod(t, client, "opted", appPod("failing"))); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pod created while the policy fails stored with %v, want %v", got, want)
	}
	decider.broken.Store(false)
	if n := requests(t, reg, ResultFailedOpen); n != 1 {
		t.Errorf("failed_open = %v, want 1", n)
	}
	harness.Eventually(t, 30*time.Second, "the MountPropagationNotSet Event to be stored", func() (bool, string) {
		events, err := client.CoreV1().Events("opted").List(ctx, metav1.ListOptions{FieldSelector: "reason=" + ReasonNotSet})
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range events.Items {
			if ev.InvolvedObject.Kind == "Namespace" && ev.Type == corev1.EventTypeWarning &&
				strings.Contains(ev.Message, "pod opted/failing") && strings.Contains(ev.Message, "divide by zero") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d Events", len(events.Items))
	})

	// The webhook is down: the apiserver applies failurePolicy Ignore.
	stop()
	if got := propagationOf(createPod(t, client, "opted", appPod("down"))); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pod created while the webhook is down stored with %v, want %v", got, want)
	}
	if n := requests(t, reg, ResultPatched); n < 2 {
		t.Errorf("patched = %v, want the dry run and the opted-in pod at least", n)
	}
}

// serve runs h on the policy webhook's server with a new certificate for 127.0.0.1, and returns
// how to stop it, the CA bundle and the webhook's URL.
func serve(t *testing.T, h http.Handler) (stop func(), caBundle []byte, url string) {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM, err := harness.SelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for file, data := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := webhook.NewServer(webhook.Options{Addr: addr, CertFile: certFile, KeyFile: keyFile, Checker: allowAll{},
		Handlers: map[string]http.Handler{Path: h}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	harness.Eventually(t, 10*time.Second, "the webhook to listen", func() (bool, string) {
		err := srv.Ready(nil)
		return err == nil, fmt.Sprint(err)
	})
	var stopped atomic.Bool
	stop = func() {
		if stopped.Swap(true) {
			return
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook server: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop, certPEM, "https://" + addr + Path
}

// allowAll stands in for the policy ConfigMaps' checker, which this test does not call.
type allowAll struct{}

func (allowAll) Check(context.Context, *corev1.ConfigMap, *corev1.ConfigMap) error { return nil }

// register registers the webhook as deploy/ does, with url and caBundle in place of the Service.
func register(t *testing.T, client kubernetes.Interface, url string, caBundle []byte) {
	t.Helper()
	ignore, none, never, timeout := admissionregistrationv1.Ignore, admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.NeverReinvocationPolicy, int32(3)
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "volume-healer-propagation"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "propagation.volume-healer.io",
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             &none,
			FailurePolicy:           &ignore,
			ReinvocationPolicy:      &never,
			TimeoutSeconds:          &timeout,
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "volume-healer"}}}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caBundle},
		}},
	}
	if _, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(), mwc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("register the propagation webhook: %v", err)
	}
}

// appPod is a pod whose container app mounts the claim data and an emptyDir, and whose container
// sidecar mounts the claim with propagation None and a ConfigMap.
func appPod(name string) *corev1.Pod {
	none := corev1.MountPropagationNone
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}},
				{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}}},
			},
			Containers: []corev1.Container{
				{Name: "app", Image: "app", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "cache", MountPath: "/cache"}}},
				{Name: "sidecar", Image: "sidecar", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data", MountPropagation: &none}, {Name: "config", MountPath: "/config"}}},
			},
		},
	}
}

func createPod(t *testing.T, client kubernetes.Interface, namespace string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if _, err := client.CoreV1().Pods(namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", namespace, pod.Name, err)
	}
	// What the apiserver stored, read back.
	p, err := client.CoreV1().Pods(namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// propagationOf maps "container:mountPath" to the mount's propagation, "" when unset.
func propagationOf(p *corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, c := range p.Spec.Containers {
		for _, m := range c.VolumeMounts {
			v := ""
			if m.MountPropagation != nil {
				v = string(*m.MountPropagation)
			}
			out[c.Name+":"+m.MountPath] = v
		}
	}
	return out
}

func create[T interface{ GetName() string }](t *testing.T, client kubernetes.Interface, obj T) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch o := any(obj).(type) {
	case *storagev1.CSIDriver:
		_, err = client.StorageV1().CSIDrivers().Create(ctx, o, metav1.CreateOptions{})
	case *storagev1.StorageClass:
		_, err = client.StorageV1().StorageClasses().Create(ctx, o, metav1.CreateOptions{})
	case *corev1.Namespace:
		_, err = client.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
	case *corev1.PersistentVolume:
		_, err = client.CoreV1().PersistentVolumes().Create(ctx, o, metav1.CreateOptions{})
	case *corev1.PersistentVolumeClaim:
		_, err = client.CoreV1().PersistentVolumeClaims(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	default:
		t.Fatalf("create: %T not handled", obj)
	}
	if err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}
