package realcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/volume-healer/volume-healer/test/cluster"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

// The releases the suite installs, as an operator would.
const (
	healerNS      = "volume-healer"
	driverNS      = "healer-refdriver"
	driverName    = "healer.example.com"
	storageClass  = "healer-fuse"
	nodePluginDS  = "healer-refdriver-node"
	controllerDep = "volume-healer"
	// nodePluginPods selects the node plugin's pods.
	nodePluginPods = "app.kubernetes.io/component=node-plugin"
)

// The second release of the reference driver's chart, as a driver that operators run today: stock
// mode (no Healer service; its NodeStage and NodePublish mount a broken volume again by
// themselves) with rclone as its FUSE mounter, under its own driver name, StorageClass, node folder
// and namespace.
const (
	stockNS       = "healer-stock"
	stockRelease  = "healer-refdriver-stock"
	stockDriver   = "stock.healer.example.com"
	stockClass    = "healer-stock-rclone"
	stockDS       = "healer-refdriver-stock-node"
	stockStateDir = "/var/lib/healer-refdriver-stock"
	// stockPods selects the stock node plugin's pods.
	stockPods = "app.kubernetes.io/instance=" + stockRelease + ",app.kubernetes.io/component=node-plugin"
)

// Env is the suite's cluster with the two charts installed.
type Env struct {
	t      harness.TB
	c      *cluster.Cluster
	assets cluster.Assets
	root   string
	tools  map[string]string
	// helmHome holds helm's cache, configuration and data.
	helmHome string
	opts     InstallOptions
	// sidecarCA signed the node's sidecar certificate (PEM): the controller's CA, read from the
	// Secret it created once the sidecar's certificate was signed.
	sidecarCA []byte
	// stock is true once InstallStock installed the stock driver, kept once InstallKept
	// installed the driver with the mount supervisor.
	stock, kept bool
	// outages gathers the workloads' outages by remedy.
	outages OutageTable
	// made are the node folders the driver releases write that were not there before the test;
	// they are removed after the teardown.
	made []madeFolder
}

// madeFolder is a node folder a driver release writes, which the test removes.
type madeFolder struct{ path, release string }

// removeAfterTeardown has the node folder path, which release writes, removed after the teardown
// unless it is there before the test.
func (e *Env) removeAfterTeardown(path, release string) {
	if _, err := os.Stat(path); err != nil {
		e.made = append(e.made, madeFolder{path: path, release: release})
	}
}

// InstallOptions change what Install installs from the suite's defaults.
type InstallOptions struct {
	// ContainerRestart gives the healer sidecar the node's containerd socket
	// (healerSidecar.containerRuntime.enabled), so that it serves RestartContainers.
	ContainerRestart bool
	// NoRemediation leaves the controller's remediation off: it evicts no pod.
	NoRemediation bool
}

// tools builds or finds helm (hack/tools.sh) and kubectl (the machine's, else hack/tools.sh).
func findTools(t harness.TB, root string) map[string]string {
	t.Helper()
	names := []string{"helm"}
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		names = append(names, "kubectl")
	}
	out, err := exec.Command("bash", append([]string{filepath.Join(root, "hack", "tools.sh")}, names...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("hack/tools.sh %s: %v\n%s", strings.Join(names, " "), err, ee.Stderr)
		}
		t.Fatalf("%v", err)
	}
	paths := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		paths[filepath.Base(line)] = line
	}
	if kubectl != "" {
		paths["kubectl"] = kubectl
	}
	return paths
}

// run runs a tool against the cluster with the administrator's kubeconfig, until ctx ends.
func (e *Env) run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, e.tools[name], args...)
	cmd.Dir = e.root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.c.Kubeconfig, "HELM_CACHE_HOME="+e.helmHome, "HELM_CONFIG_HOME="+e.helmHome, "HELM_DATA_HOME="+e.helmHome)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

func (e *Env) must(t harness.TB, name string, args ...string) string {
	t.Helper()
	out, err := e.run(t.Context(), name, args...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return out
}

// Install installs the CSIAddonsNode CRD and the charts on the node, as the suite does by default.
func Install(t harness.TB, c *cluster.Cluster, assets cluster.Assets) *Env {
	t.Helper()
	return InstallWith(t, c, assets, InstallOptions{})
}

// InstallWith installs the CSIAddonsNode CRD and the charts on the node, with opts.
func InstallWith(t harness.TB, c *cluster.Cluster, assets cluster.Assets, opts InstallOptions) *Env {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatalf("%v", err)
	}
	helmHome, err := os.MkdirTemp("", "volume-healer-helm-")
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(helmHome) })
	e := &Env{t: t, c: c, assets: assets, root: root, tools: findTools(t, root), helmHome: helmHome, opts: opts}
	ctrllog.SetLogger(logr.Discard())
	crd, err := controlplane.CSIAddonsNodeCRDPath()
	if err != nil {
		t.Fatalf("%v", err)
	}
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{Paths: []string{crd}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("install the CSIAddonsNode CRD: %v", err)
	}
	// The reference driver keeps its volumes in this host folder (the chart's stateDir).
	e.removeAfterTeardown(driverStateDir, "healer-refdriver")
	t.Cleanup(func() {
		e.teardown()
		// Only now: a node plugin that still ran, or a workload that still wrote through its
		// mount, would put files into a folder while it is being removed.
		for _, f := range e.made {
			if err := os.RemoveAll(f.path); err != nil {
				t.Errorf("remove %s's folder: %v", f.release, err)
			}
		}
	})
	e.sidecarTLS()
	e.installCharts()
	e.waitSidecarCertificateIssued()
	return e
}

// driverStateDir is the reference driver chart's stateDir.
const driverStateDir = "/var/lib/healer-refdriver"

// teardown removes the workloads, so that kubelet unpublishes and unstages their volumes through
// the driver, then the releases, as an operator would; what does not go in time the node's Stop
// removes.
func (e *Env) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := e.c.Clientset
	_ = cs.CoreV1().Namespaces().Delete(ctx, appsNS, metav1.DeleteOptions{})
	for ctx.Err() == nil {
		pods, err := cs.CoreV1().Pods(appsNS).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) == 0 {
			break
		}
		time.Sleep(time.Second)
	}
	// The PVs go with their claims (reclaim policy Delete) while the controller plugin runs.
	for ctx.Err() == nil {
		pvs, err := cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil || len(pvs.Items) == 0 {
			break
		}
		time.Sleep(time.Second)
	}
	for _, release := range []struct{ name, ns string }{{keptRelease, keptNS}, {stockRelease, stockNS}, {"healer-refdriver", driverNS}, {"volume-healer", healerNS}} {
		if release.name == stockRelease && !e.stock || release.name == keptRelease && !e.kept {
			continue
		}
		// ctx, not the test's context: that one has ended when the cleanups run.
		if out, err := e.run(ctx, "helm", "uninstall", release.name, "--namespace", release.ns, "--wait", "--timeout", "60s"); err != nil {
			e.t.Logf("helm uninstall %s: %v\n%s", release.name, err, out)
		}
	}
}

// namespace creates ns.
func (e *Env) namespace(ns string, labels map[string]string) {
	e.t.Helper()
	_, err := e.c.Clientset.CoreV1().Namespaces().Create(e.t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatalf("%v", err)
	}
}

// sidecarTLS makes the namespaces of the two charts. The node's healer sidecar asks for its
// serving certificate with a CertificateSigningRequest (the reference driver chart's
// healerSidecar.tls.request, on by default), which the controller signs with the CA it creates:
// nothing is made outside the cluster (docs/operations.md, "Certificates and tokens").
func (e *Env) sidecarTLS() {
	e.t.Helper()
	e.namespace(healerNS, nil)
	e.namespace(driverNS, nil)
}

// installCharts installs the volume-healer chart and the reference driver's chart with the images
// built here, and waits until the controller, the node plugin and the driver's registration with
// kubelet are up.
func (e *Env) installCharts() {
	t := e.t
	t.Helper()
	img := e.assets.Images
	begin := time.Now()
	e.must(t, "helm", "install", "volume-healer", "deploy/helm/volume-healer", "--namespace", healerNS,
		"--set", "replicaCount=1",
		"--set", "image.repository="+img["volume-healer"].Repository, "--set", "image.tag="+img["volume-healer"].Tag,
		"--set", "image.pullPolicy=Never",
		"--set", "config.webhook.enabled=false",
		"--set", fmt.Sprintf("config.remediation.enabled=%t", !e.opts.NoRemediation),
		"--set", "podDisruptionBudget.enabled=false",
		"--set", "sidecar.enabled=true", "--set", "sidecar.namespace="+driverNS,
		"--set", "sidecar.serviceAccountName=healer-refdriver-node",
		// The stock and the kept driver's node plugins ask for their sidecars' certificates too
		// (the chart adds the first driver's ServiceAccount itself).
		"--set", "config.sidecar.tls.signer.requesters=system:serviceaccount:"+stockNS+":healer-refdriver-node\\,system:serviceaccount:"+keptNS+":healer-refdriver-node",
		"--set", "sidecar.podLabels.app\\.kubernetes\\.io/name=healer-refdriver",
		"--set", "sidecar.podLabels.app\\.kubernetes\\.io/component=node-plugin",
		"--set", "metrics.serviceMonitor.enabled=false", "--set", "prometheusRule.enabled=false",
		"--set", "sidecar.podMonitor.enabled=false",
		"--wait", "--timeout", "5m")
	t.Logf("helm install volume-healer: %s", time.Since(begin).Round(100*time.Millisecond))
	begin = time.Now()
	args := []string{"install", "healer-refdriver", "deploy/helm/healer-refdriver", "--namespace", driverNS,
		"--set", "images.refdriver.repository=" + img["healer-refdriver"].Repository, "--set", "images.refdriver.tag=" + img["healer-refdriver"].Tag,
		"--set", "images.healerSidecar.repository=" + img["healer-sidecar"].Repository, "--set", "images.healerSidecar.tag=" + img["healer-sidecar"].Tag,
		"--set", "images.csiProvisioner.repository=" + img["csi-provisioner"].Repository, "--set", "images.csiProvisioner.tag=" + img["csi-provisioner"].Tag,
		"--set", "images.csiAttacher.repository=" + img["csi-attacher"].Repository, "--set", "images.csiAttacher.tag=" + img["csi-attacher"].Tag,
		// The csi-addons sidecar beside the healer sidecar, as a driver that has one runs it.
		"--set", "csiAddons.enabled=true",
		"--set", "images.csiAddons.repository=" + img["csi-addons-sidecar"].Repository, "--set", "images.csiAddons.tag=" + img["csi-addons-sidecar"].Tag,
		// Periodic sweeps of the class every 10s: they find a mounter that died alone.
		"--set-string", "storageClass.annotations.healer\\.csiaddons\\.openshift\\.io/schedule=@every 10s",
		"--wait", "--timeout", "5m"}
	if e.opts.ContainerRestart {
		// The node's containerd, at its own socket: the chart mounts it at the same path.
		args = append(args, "--set", "healerSidecar.containerRuntime.enabled=true",
			"--set", "healerSidecar.containerRuntime.socketPath="+e.c.ContainerdSocket())
	}
	for _, name := range []string{"refdriver", "healerSidecar", "csiProvisioner", "csiAttacher", "csiAddons"} {
		args = append(args, "--set", "images."+name+".pullPolicy=Never")
	}
	e.must(t, "helm", args...)
	t.Logf("helm install healer-refdriver: %s", time.Since(begin).Round(100*time.Millisecond))
	e.waitRegistered(driverName)
}

// waitRegistered waits until kubelet lists the driver named driver on the node's CSINode, which
// it does once the driver registered itself through kubelet's plugin registration.
func (e *Env) waitRegistered(driver string) {
	e.t.Helper()
	harness.Eventually(e.t, 2*time.Minute, "kubelet to register "+driver, func() (bool, string) {
		n, err := e.c.Clientset.StorageV1().CSINodes().Get(e.t.Context(), e.c.NodeName(), metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, d := range n.Spec.Drivers {
			if d.Name == driver {
				return true, ""
			}
		}
		return false, fmt.Sprintf("CSINode drivers: %v", n.Spec.Drivers)
	})
}

// EnableContainerRestart gives the reference driver's healer sidecar the node's containerd socket
// (healerSidecar.containerRuntime.enabled) by a helm upgrade of its release, as an operator who
// opts in does; the node plugin's DaemonSet rolls its pod. From then on Disrupt expects a pod with
// propagation None to be back by a restart of its containers in place instead of an eviction.
func (e *Env) EnableContainerRestart(t harness.TB) {
	t.Helper()
	begin := time.Now()
	e.must(t, "helm", "upgrade", "healer-refdriver", "deploy/helm/healer-refdriver", "--namespace", driverNS, "--reuse-values",
		"--set", "healerSidecar.containerRuntime.enabled=true",
		"--set", "healerSidecar.containerRuntime.socketPath="+e.c.ContainerdSocket(),
		"--wait", "--timeout", "5m")
	e.opts.ContainerRestart = true
	t.Logf("helm upgrade healer-refdriver with the container runtime for the sidecar: %s", time.Since(begin).Round(100*time.Millisecond))
}
