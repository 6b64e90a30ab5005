package controller

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/admission/propagation"
	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestPropagationWebhookOfRun runs the controller with the propagation webhook on against a real
// control plane, registered as deploy/ registers it, and creates pods as a workload would: the
// apiserver stores HostToContainer on the mounts of a claim bound to a CSI volume and of a claim
// not bound yet whose StorageClass's provisioner is a CSI driver (read from the controller's
// compact cache records), both in a namespace that opted in, and nothing in a namespace that did
// not; the result shows in the controller's metrics.
func TestPropagationWebhookOfRun(t *testing.T) {
	env := controlplane.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const driver = "fuse.csi.example.com"
	class := "fuse"
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "volume-healer"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{
			annotations.MountPropagationLabel: annotations.MountPropagationHostToContainer}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driver}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: driver},
	}
	for _, ns := range []string{"shop", "plain"} {
		objs = append(objs,
			&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + ns}, Spec: corev1.PersistentVolumeSpec{
				StorageClassName: class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: "data"},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "pv-" + ns}},
			}},
			claim(ns, "data", class, "pv-"+ns),
			claim(ns, "later", class, ""),
		)
	}
	for _, o := range objs {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

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
	metricsAddr, healthAddr, webhookAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	cfg, err := config.Load(nil, func(k string) (string, bool) {
		v, ok := map[string]string{
			"VOLUME_HEALER_KUBECONFIG":                  env.Kubeconfig,
			"VOLUME_HEALER_METRICS_BIND_ADDRESS":        metricsAddr,
			"VOLUME_HEALER_HEALTH_BIND_ADDRESS":         healthAddr,
			"VOLUME_HEALER_SIDECAR_TLS_ENABLED":         "false",
			"VOLUME_HEALER_LEADER_ELECTION_ENABLED":     "false",
			"VOLUME_HEALER_WEBHOOK_ENABLED":             "true",
			"VOLUME_HEALER_WEBHOOK_BIND_ADDRESS":        webhookAddr,
			"VOLUME_HEALER_WEBHOOK_CERT_FILE":           certFile,
			"VOLUME_HEALER_WEBHOOK_KEY_FILE":            keyFile,
			"VOLUME_HEALER_PROPAGATION_WEBHOOK_ENABLED": "true",
		}[k]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg) }()
	defer func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(shutdownTimeout + 5*time.Second):
			t.Error("Run did not return after its context ended")
		}
	}()
	harness.Eventually(t, time.Minute, "/readyz answers ok", func() (bool, string) {
		code, body := httpGet("http://" + healthAddr + "/readyz")
		return code == http.StatusOK, body
	})

	url := "https://" + webhookAddr + propagation.Path
	ignore, none, never := admissionregistrationv1.Ignore, admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.NeverReinvocationPolicy
	if err := env.Client.Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "volume-healer-propagation"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "propagation.volume-healer.io", AdmissionReviewVersions: []string{"v1"},
			SideEffects: &none, FailurePolicy: &ignore, ReinvocationPolicy: &never,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: certPEM},
		}},
	}); err != nil {
		t.Fatal(err)
	}
	mounts := func(p *corev1.Pod) string {
		var out []string
		for _, m := range p.Spec.Containers[0].VolumeMounts {
			v := "unset"
			if m.MountPropagation != nil {
				v = string(*m.MountPropagation)
			}
			out = append(out, m.Name+"="+v)
		}
		return strings.Join(out, ",")
	}
	// The apiserver reads a new webhook configuration from its own cache; a dry run stores
	// nothing.
	harness.Eventually(t, 30*time.Second, "the apiserver to call the controller's propagation webhook", func() (bool, string) {
		p := workload("probe")
		if err := env.Client.Create(ctx, p, client.DryRunAll); err != nil {
			return false, err.Error()
		}
		return mounts(p) == "data=HostToContainer,later=HostToContainer,scratch=unset", mounts(p)
	})
	for ns, want := range map[string]string{
		"shop":  "data=HostToContainer,later=HostToContainer,scratch=unset",
		"plain": "data=unset,later=unset,scratch=unset",
	} {
		p := workload("web")
		p.Namespace = ns
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		var stored corev1.Pod
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), &stored); err != nil {
			t.Fatal(err)
		}
		if got := mounts(&stored); got != want {
			t.Errorf("pod in namespace %s stored with %s, want %s", ns, got, want)
		}
	}
	_, body := httpGet("http://" + metricsAddr + "/metrics")
	for _, series := range []string{
		fmt.Sprintf("volume_healer_propagation_webhook_requests_total{result=%q} ", propagation.ResultPatched),
		fmt.Sprintf("volume_healer_propagation_webhook_requests_total{result=%q} 1\n", propagation.ResultUnchanged),
	} {
		if !strings.Contains(body, series) {
			t.Errorf("/metrics has no %q", series)
		}
	}
}

// claim is a claim of class in namespace ns, bound to pv unless it is empty.
func claim(ns, name, class, pv string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
		StorageClassName: &class, VolumeName: pv, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}}
}

// workload is a pod of namespace shop mounting the claims data and later and an emptyDir.
func workload(name string) *corev1.Pod {
	volume := func(name string, src corev1.VolumeSource) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: src}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{
				volume("data", corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}),
				volume("later", corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "later"}}),
				volume("scratch", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}),
			},
			Containers: []corev1.Container{{Name: "app", Image: "app", VolumeMounts: []corev1.VolumeMount{
				{Name: "data", MountPath: "/data"}, {Name: "later", MountPath: "/later"}, {Name: "scratch", MountPath: "/tmp"}}}},
		},
	}
}

func httpGet(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
