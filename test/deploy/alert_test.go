package deploy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/harness"
)

// The cluster of the test follows deploy/: the controller's namespace and ServiceAccount from
// deploy/base, the node plugin's from deploy/examples/ceph-csi-rbd.
const (
	controllerNamespace = "volume-healer"
	controllerAccount   = "volume-healer"
	pluginNamespace     = "ceph-csi"
	pluginAccount       = "rbd-csi-nodeplugin"
	driverName          = "rbd.csi.ceph.com"
	nodeName            = "worker-1"
	appNamespace        = "shop"
	claimName           = "orders-db"
	volumeName          = "pvc-0b7c2f1e-orders-db"
	volumeHandle        = "0001-0009-rook-ceph-0000000000000002-0b7c2f1e"
)

// TestFailingHealFiresAlert installs deploy/base and the sidecar's RBAC in a real control plane,
// runs the controller binary with the base's configuration file and ServiceAccount, and the real
// sidecar with the node plugin's ServiceAccount in front of the reference driver. One volume's
// mount hangs for longer than a heal may take, so every heal fails. The controller's /metrics is
// scraped, and promtool evaluates the rules of deploy/prometheus/rules.yaml against that scrape:
// VolumeHealFailed must fire for that claim, and nothing must page for a controller that is up.
func TestFailingHealFiresAlert(t *testing.T) {
	promtool := tool(t, "promtool")
	c := startCluster(t)
	c.installCRDs(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()

	// What the operator installs: the base, and the sidecar's RBAC from the example.
	c.apply(t, kustomize(t, "deploy/base"), false)
	c.apply(t, kustomize(t, "deploy/examples/ceph-csi-rbd"), false)
	if t.Failed() {
		t.FailNow()
	}
	createVolume(ctx, t, c.env.Client)

	// TLS as the base expects it: the sidecar's certificate names its node, worker-1.healer-sidecar,
	// signed by the CA the controller trusts.
	caFile, certFile, keyFile := writeCertificates(t, dir)

	// The node plugin: the reference driver with a volume whose mount hangs for 2s on every call,
	// behind the real sidecar, which runs as the node plugin's ServiceAccount.
	socket := filepath.Join(dir, "csi-addons.sock")
	drv, err := simulated.New(simulated.Options{StateDir: filepath.Join(dir, "driver"), Identity: control.Identity{DriverName: driverName, NodeID: nodeName}, SeedVolumes: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.AddVolume(simulated.VolumeSpec{ID: volumeHandle, Mounter: "rbd-nbd", VolumeContext: map[string]string{"clusterID": "rook-ceph", "pool": "replicapool"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.SetCondition(volumeHandle, control.Hung, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	srv, err := simulated.NewServer(drv, simulated.ServerOptions{Endpoint: "unix://" + socket})
	if err != nil {
		t.Fatal(err)
	}
	// The node plugin's ServiceAccount comes with the driver's own manifests.
	if _, err := c.env.Clientset.CoreV1().ServiceAccounts(pluginNamespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: pluginNamespace, Name: pluginAccount}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The projected token of a node plugin pod on the node: the base's admission policy admits
	// the sidecar's CSIAddonsNode writes only for the node the token names.
	sidecarCfg := rest.AnonymousClientConfig(c.env.Config)
	sidecarCfg.BearerToken = podBoundToken(ctx, t, c, pluginNamespace, pluginAccount, nodeName)
	sc, err := sidecar.New(sidecar.Options{
		KubeConfig:     sidecarCfg,
		NodeName:       nodeName,
		Namespace:      pluginNamespace,
		PodUID:         "4b0c7e2a-0000-4000-8000-000000000001",
		DriverEndpoint: "unix://" + socket,
		ListenAddress:  "127.0.0.1:0",
		TLSCertFile:    certFile,
		TLSKeyFile:     keyFile,
		TLSServerName:  "healer-sidecar",
		TokenAudience:  "volume-healer-sidecar",
		MetricsAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- srv.Start(runCtx) }()
	go func() { done <- sc.Start(runCtx) }()
	t.Cleanup(func() {
		stop()
		<-done
		<-done
	})

	// The controller as a process: the base's configuration file, the ServiceAccount's own token
	// for the API server, a token for the sidecars' audience. Only addresses, paths and the
	// timings of the test change, through the environment.
	metricsAddr := freeAddr(t)
	token := serviceAccountToken(ctx, t, c, controllerNamespace, controllerAccount, nil)
	sidecarToken := filepath.Join(dir, "sidecar-token")
	writeFile(t, sidecarToken, serviceAccountToken(ctx, t, c, controllerNamespace, controllerAccount, []string{"volume-healer-sidecar"}))
	kubeconfig := filepath.Join(dir, "controller.kubeconfig")
	writeKubeconfig(t, kubeconfig, c.env.Config, token)
	logPath := filepath.Join(dir, "controller.log")
	// The webhook serves the sidecar's certificate, which names 127.0.0.1 too.
	webhookAddr := freeAddr(t)
	startController(t, []string{
		"VOLUME_HEALER_KUBECONFIG=" + kubeconfig,
		"VOLUME_HEALER_METRICS_BIND_ADDRESS=" + metricsAddr,
		"VOLUME_HEALER_HEALTH_BIND_ADDRESS=" + freeAddr(t),
		"VOLUME_HEALER_WEBHOOK_BIND_ADDRESS=" + webhookAddr,
		"VOLUME_HEALER_WEBHOOK_CERT_FILE=" + certFile,
		"VOLUME_HEALER_WEBHOOK_KEY_FILE=" + keyFile,
		"VOLUME_HEALER_SIDECAR_TLS_CA_FILE=" + caFile,
		"VOLUME_HEALER_SIDECAR_AUTH_TOKEN_FILE=" + sidecarToken,
		"VOLUME_HEALER_RESTART_DEBOUNCE=100ms",
		"VOLUME_HEALER_BACKOFF_BASE=100ms",
		"VOLUME_HEALER_BACKOFF_MAX=400ms",
		"VOLUME_HEALER_TIMEOUTS_HEAL=500ms",
		"VOLUME_HEALER_SCHEDULE_DEFAULT=",
	}, logPath)
	// The controller's status patches on the policy ConfigMap pass through the base's webhook.
	routeWebhook(t, c, webhookAddr, mustRead(t, caFile))

	// Wait until the heal has failed for good.
	want := fmt.Sprintf(`volume_healer_volume_heal_failing{driver=%q,namespace=%q,persistentvolumeclaim=%q} 1`, driverName, appNamespace, claimName)
	var scrape []byte
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(string(scrape), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the controller's /metrics never showed %s\nlast scrape:\n%s\ncontroller log:\n%s", want, grep(scrape, "volume_healer_"), tail(logPath))
		}
		time.Sleep(500 * time.Millisecond)
		scrape = get(t, "http://"+metricsAddr+"/metrics")
	}
	if !strings.Contains(string(scrape), fmt.Sprintf(`volume_healer_heals_total{driver=%q,result="error"}`, driverName)) {
		t.Errorf("the heals did not fail as heals: no volume_healer_heals_total{result=\"error\"} in\n%s", grep(scrape, "volume_healer_heals_total"))
	}

	// Which build runs, for dashboards and for joins in queries.
	if build := regexp.MustCompile(`(?m)^volume_healer_build_info\{commit="[^"]+",goversion="` + regexp.QuoteMeta(runtime.Version()) + `",version="[^"]+"\} 1$`); !build.Match(scrape) {
		t.Errorf("no volume_healer_build_info of a %s build in\n%s", runtime.Version(), grep(scrape, "volume_healer_build_info"))
	}

	// What an operator sees besides the alert: the Event and the claim's status annotation.
	var events corev1.EventList
	if err := c.env.Client.List(ctx, &events, client.InNamespace(appNamespace)); err != nil {
		t.Fatal(err)
	}
	failed := false
	for _, e := range events.Items {
		failed = failed || e.Reason == healer.ReasonVolumeHealFailed && e.InvolvedObject.Name == claimName
	}
	if !failed {
		t.Errorf("no %s Event on the claim %s/%s", healer.ReasonVolumeHealFailed, appNamespace, claimName)
	}
	var pvc corev1.PersistentVolumeClaim
	if err := c.env.Client.Get(ctx, client.ObjectKey{Namespace: appNamespace, Name: claimName}, &pvc); err != nil {
		t.Fatal(err)
	}
	if pvc.Annotations[annotations.VolumeStatus] == "" {
		t.Errorf("the claim has no %s annotation", annotations.VolumeStatus)
	}
	// The base's policy ConfigMap was accepted.
	var cm corev1.ConfigMap
	if err := c.env.Client.Get(ctx, client.ObjectKey{Namespace: controllerNamespace, Name: "volume-healer-policy"}, &cm); err != nil {
		t.Fatal(err)
	}
	if status := cm.Annotations[annotations.PolicyStatus]; !strings.Contains(status, `"status":"ok"`) {
		t.Errorf("the base's policy ConfigMap has the status %q, want ok", status)
	}

	// The base's RBAC sufficed for everything the controller did.
	if log := mustRead(t, logPath); strings.Contains(string(log), "forbidden") {
		t.Errorf("the controller was refused a request with the base's RBAC:\n%s", grep(log, "forbidden"))
	}

	// The alert, evaluated by promtool on this scrape as Prometheus would store it.
	series := scrapeSeries(t, scrape, metricsAddr)
	out, err := runErr(dir, promtool, "test", "rules", writeAlertTest(t, dir, series))
	if err != nil {
		t.Errorf("the alerts evaluated on the controller's scrape are not as expected:\n%v\nscrape:\n%s", err, grep(scrape, "volume_healer_"))
	}
	t.Logf("promtool: %s", strings.TrimSpace(string(out)))
}

// createVolume creates the bound claim, its PV, the driver's objects and the attachment that the
// restart sweep finds.
func createVolume(ctx context.Context, t *testing.T, c client.Client) {
	t.Helper()
	attach := true
	class := "ceph-rbd-nbd"
	size := resource.MustParse("10Gi")
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: volumeName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:         corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: class,
			ClaimRef:         &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: appNamespace, Name: claimName},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driverName, VolumeHandle: volumeHandle, FSType: "ext4",
				VolumeAttributes: map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "mounter": "rbd-nbd", "imageName": "csi-vol-0b7c2f1e"},
			}},
		},
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNamespace, Name: claimName},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			VolumeName:       volumeName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	pvName := volumeName
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-" + volumeName},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driverName, NodeName: nodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
	}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNamespace}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driverName}, Spec: storagev1.CSIDriverSpec{AttachRequired: &attach}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: driverName,
			Parameters: map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "mounter": "rbd-nbd"}},
		pv, pvc, va,
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	pv.Status.Phase = corev1.VolumeBound
	pvc.Status.Phase = corev1.ClaimBound
	va.Status.Attached = true
	for _, obj := range []client.Object{pv, pvc, va} {
		if err := c.Status().Update(ctx, obj); err != nil {
			t.Fatalf("status of %T %s: %v", obj, obj.GetName(), err)
		}
	}
}

// serviceAccountToken asks the API server for a token of the ServiceAccount, for audiences (nil:
// the API server's own).
func serviceAccountToken(ctx context.Context, t *testing.T, c *cluster, namespace, name string, audiences []string) string {
	t.Helper()
	expiry := int64(3600)
	tok, err := c.env.Clientset.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s: %v", namespace, name, err)
	}
	return tok.Status.Token
}

// podBoundToken returns a token of the ServiceAccount namespace/name bound to a new pod of it
// on node (creating the Node when missing), as the kubelet mounts it into a node plugin pod: the
// API server writes the node into it.
func podBoundToken(ctx context.Context, t *testing.T, c *cluster, namespace, name, node string) string {
	t.Helper()
	cs := c.env.Clientset
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, GenerateName: name + "-"},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: name, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "plugin", Image: "plugin"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s bound to pod %s on node %s: %v", namespace, name, pod.Name, node, err)
	}
	return tok.Status.Token
}

// writeKubeconfig writes a kubeconfig that reaches the API server of cfg with token.
func writeKubeconfig(t *testing.T, file string, cfg *rest.Config, token string) {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["controller"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "controller"}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, file); err != nil {
		t.Fatal(err)
	}
}

// startController builds cmd/volume-healer (once per run, see harness.Build) and runs it with
// deploy/base/config.yaml and env until the test ends, or until the stop it returns is called.
func startController(t *testing.T, env []string, logPath string) (stop func()) {
	t.Helper()
	bins, err := harness.Build(harness.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bin := bins.Controller
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", path(t, "deploy", "base", "config.yaml"), "--log-verbosity=2")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			waited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(waited) }()
			select {
			case <-waited:
			case <-time.After(40 * time.Second):
				_ = cmd.Process.Kill()
				<-waited
			}
			_ = logFile.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// scrapeSeries turns a scrape into promtool input series, with the target labels Prometheus adds
// under the base's ServiceMonitor (job and instance; honorLabels keeps the claim's namespace).
// Each sample holds its value for the 20 minutes the test evaluates.
func scrapeSeries(t *testing.T, scrape []byte, instance string) []string {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(scrape)))
	if err != nil {
		t.Fatalf("parse the scrape: %v", err)
	}
	vec, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{Timestamp: model.Now()}, mapValuesOf(families)...)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range vec {
		name := string(s.Metric[model.MetricNameLabel])
		if !strings.HasPrefix(name, "volume_healer_") || s.Value.String() == "NaN" {
			continue
		}
		lbls := []string{fmt.Sprintf("job=%q", "volume-healer"), fmt.Sprintf("instance=%q", instance)}
		for k, v := range s.Metric {
			if k != model.MetricNameLabel {
				lbls = append(lbls, fmt.Sprintf("%s=%s", k, strconv.Quote(string(v))))
			}
		}
		sort.Strings(lbls)
		out = append(out, fmt.Sprintf("%s{%s}\t%s", name, strings.Join(lbls, ","), strconv.FormatFloat(float64(s.Value), 'f', -1, 64)))
	}
	// The scrape itself succeeded: Prometheus records up 1 for the target.
	out = append(out, fmt.Sprintf("up{instance=%q,job=%q}\t1", instance, "volume-healer"))
	sort.Strings(out)
	return out
}

func mapValuesOf[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// writeAlertTest writes a promtool unit test over series: at minute 5 VolumeHealFailed fires for
// the claim, with the summary and description of rules.yaml filled in, and no other alert fires.
func writeAlertTest(t *testing.T, dir string, series []string) string {
	t.Helper()
	var rule struct {
		Annotations map[string]string
	}
	var alerts []string
	for _, g := range readRules(t, mustRead(t, path(t, rulesFile))).Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.Alert == "VolumeHealFailed" {
				rule.Annotations = r.Annotations
			}
		}
	}
	fill := strings.NewReplacer(
		"{{ $labels.namespace }}", appNamespace,
		"{{ $labels.persistentvolumeclaim }}", claimName,
		"{{ $labels.driver }}", driverName,
	)
	var b strings.Builder
	fmt.Fprintf(&b, "rule_files:\n  - %s\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n", path(t, rulesFile))
	for _, s := range series {
		name, value, _ := strings.Cut(s, "\t")
		fmt.Fprintf(&b, "      - series: %s\n        values: '%sx20'\n", strconv.Quote(name), value)
	}
	b.WriteString("    alert_rule_test:\n")
	fmt.Fprintf(&b, "      - eval_time: 5m\n        alertname: VolumeHealFailed\n        exp_alerts:\n          - exp_labels: {severity: critical, namespace: %s, persistentvolumeclaim: %s, driver: %s}\n            exp_annotations:\n", appNamespace, claimName, driverName)
	keys := make([]string, 0, len(rule.Annotations))
	for k := range rule.Annotations {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "              %s: %s\n", k, strconv.Quote(fill.Replace(rule.Annotations[k])))
	}
	for _, a := range alerts {
		// VolumeHealerScheduledSweepOverdue needs hours of history; the others must stay quiet.
		if a != "VolumeHealFailed" {
			fmt.Fprintf(&b, "      - eval_time: 5m\n        alertname: %s\n        exp_alerts: []\n", a)
		}
	}
	file := filepath.Join(dir, "alert_test.yaml")
	writeFile(t, file, b.String())
	return file
}

// writeCertificates writes a CA and a serving certificate signed by it: the sidecar's of nodeName
// (nodeName.healer-sidecar), which is also the webhook's (127.0.0.1).
func writeCertificates(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "healer-sidecar-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: nodeName + ".healer-sidecar"},
		DNSNames: []string{nodeName + ".healer-sidecar"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeFile(t, caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})))
	writeFile(t, certFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, keyFile, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	return caFile, certFile, keyFile
}

func writeFile(t *testing.T, file, content string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url) // a local test server: no context needed
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// grep returns the lines of data that contain s.
func grep(data []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, s) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// tail returns the end of a log file.
func tail(file string) string {
	data, _ := os.ReadFile(file)
	if len(data) > 8000 {
		data = data[len(data)-8000:]
	}
	return string(data)
}
