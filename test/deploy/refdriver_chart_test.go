package deploy

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// refdriverChart is the reference driver's Helm chart, relative to the module's root.
const refdriverChart = "deploy/helm/healer-refdriver"

// refdriverNamespace is where the tests install the reference driver.
const refdriverNamespace = "healer-refdriver"

// refdriverTemplate renders the reference driver's chart as release in namespace with --set pairs.
func refdriverTemplate(t *testing.T, release, namespace string, set ...string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", release, refdriverChart, "--namespace", namespace, "--kube-version", kubeVersion}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return decode(t, run(t, repoRoot(t), tool(t, "helm"), args...))
}

// healerForRefdriver renders the volume-healer chart with the sidecar values that fit the
// reference driver's chart installed as refdriverNamespace with its defaults, the way the
// reference driver chart's NOTES tell.
func healerForRefdriver(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	return helmTemplate(t, "volume-healer", "volume-healer", nil,
		"sidecar.enabled=true",
		"sidecar.namespace="+refdriverNamespace,
		"sidecar.serviceAccountName=healer-refdriver-node",
		`sidecar.podLabels.app\.kubernetes\.io/name=healer-refdriver`,
		`sidecar.podLabels.app\.kubernetes\.io/component=node-plugin`,
		"sidecar.port=9072",
	)
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s in the pod", name)
	return corev1.Container{}
}

func volumeNamed(t *testing.T, spec corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no volume %s in the pod", name)
	return corev1.Volume{}
}

func mountOf(c corev1.Container, volume string) (corev1.VolumeMount, bool) {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m, true
		}
	}
	return corev1.VolumeMount{}, false
}

// TestRefdriverChartDefaults checks the objects the reference driver's chart renders with its
// default values: what kubelet, external-provisioner, external-attacher and the healer sidecar
// need to find each other.
func TestRefdriverChartDefaults(t *testing.T) {
	objs := refdriverTemplate(t, "healer-refdriver", refdriverNamespace)

	var driver storagev1.CSIDriver
	convert(t, find(t, objs, "CSIDriver", "healer.example.com"), &driver)
	if driver.Spec.AttachRequired == nil || !*driver.Spec.AttachRequired {
		t.Error("CSIDriver: attachRequired is not true: no VolumeAttachments, and volume-healer finds no volume")
	}
	if driver.Spec.PodInfoOnMount == nil || !*driver.Spec.PodInfoOnMount {
		t.Error("CSIDriver: podInfoOnMount is not true")
	}
	if !slices.Equal(driver.Spec.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}) {
		t.Errorf("CSIDriver: volumeLifecycleModes %v, want [Persistent]", driver.Spec.VolumeLifecycleModes)
	}

	var sc storagev1.StorageClass
	convert(t, find(t, objs, "StorageClass", "healer-fuse"), &sc)
	if sc.Provisioner != "healer.example.com" {
		t.Errorf("StorageClass provisioner %q", sc.Provisioner)
	}
	if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingImmediate {
		t.Errorf("StorageClass volumeBindingMode %v, want Immediate", sc.VolumeBindingMode)
	}
	if sc.AllowVolumeExpansion == nil || *sc.AllowVolumeExpansion {
		t.Errorf("StorageClass allowVolumeExpansion %v, want false", sc.AllowVolumeExpansion)
	}

	var dep appsv1.Deployment
	convert(t, find(t, objs, "Deployment", "healer-refdriver-controller"), &dep)
	ctl := dep.Spec.Template.Spec
	if ctl.ServiceAccountName != "healer-refdriver-controller" {
		t.Errorf("controller ServiceAccount %q", ctl.ServiceAccountName)
	}
	find(t, objs, "ServiceAccount", "healer-refdriver-controller")
	ctlDriver := container(t, ctl, "refdriver")
	for name, want := range map[string]string{
		"refdriver":       "healer-refdriver:v0.1.0",
		"csi-provisioner": "csi-provisioner:v6.4.0",
		"csi-attacher":    "csi-attacher:v4.13.0",
	} {
		if got := container(t, ctl, name).Image; got != want {
			t.Errorf("controller container %s: image %q, want %q", name, got, want)
		}
	}
	if !slices.Contains(ctlDriver.Args, "--csi-endpoint=unix:///csi/csi.sock") {
		t.Errorf("controller refdriver args %q: no CSI socket in /csi", ctlDriver.Args)
	}
	for _, name := range []string{"csi-provisioner", "csi-attacher"} {
		c := container(t, ctl, name)
		if !slices.Contains(c.Args, "--csi-address=/csi/csi.sock") || !slices.Contains(c.Args, "--leader-election=false") {
			t.Errorf("%s args %q: want --csi-address=/csi/csi.sock and --leader-election=false", name, c.Args)
		}
		if m, ok := mountOf(c, "socket-dir"); !ok || m.MountPath != "/csi" {
			t.Errorf("%s does not mount the socket folder at /csi", name)
		}
	}
	if v := volumeNamed(t, ctl, "socket-dir"); v.EmptyDir == nil {
		t.Error("the controller's socket folder is not an emptyDir")
	}
	if v := volumeNamed(t, ctl, "state-dir"); v.HostPath == nil || v.HostPath.Path != "/var/lib/healer-refdriver" {
		t.Errorf("the controller's state folder is %+v, want hostPath /var/lib/healer-refdriver", v.VolumeSource)
	}
	if len(ofKind(objs, "Role")) != 0 {
		t.Error("a Role is rendered without leader election or the csi-addons sidecar")
	}

	var ds appsv1.DaemonSet
	convert(t, find(t, objs, "DaemonSet", "healer-refdriver-node"), &ds)
	node := ds.Spec.Template.Spec
	if node.ServiceAccountName != "healer-refdriver-node" {
		t.Errorf("node plugin ServiceAccount %q", node.ServiceAccountName)
	}
	if node.HostNetwork {
		t.Error("the node plugin runs in the host network")
	}
	if !node.HostPID {
		t.Error("the node plugin is not in the host's PID namespace: a heal cannot find the pods that kept a dead mount")
	}
	drv := container(t, node, "refdriver")
	if drv.SecurityContext == nil || drv.SecurityContext.Privileged == nil || !*drv.SecurityContext.Privileged {
		t.Error("the node plugin's driver is not privileged: it cannot mount FUSE file systems for kubelet")
	}
	for _, want := range []string{
		"--csi-endpoint=unix:///csi/csi.sock",
		"--endpoint=unix:///csi/csi-addons.sock",
		"--kubelet-registration-dir=/registration",
		"--kubelet-csi-endpoint=/var/lib/kubelet/plugins/healer.example.com/csi.sock",
		"--state-dir=/var/lib/healer-refdriver",
		"--driver-name=healer.example.com",
		"--node-id=$(NODE_NAME)",
	} {
		if !slices.Contains(drv.Args, want) {
			t.Errorf("node plugin driver args %q lack %s", drv.Args, want)
		}
	}
	hostPaths := map[string]struct {
		path      string
		typ       corev1.HostPathType
		mountPath string
	}{
		"socket-dir":       {"/var/lib/kubelet/plugins/healer.example.com", corev1.HostPathDirectoryOrCreate, "/csi"},
		"registration-dir": {"/var/lib/kubelet/plugins_registry", corev1.HostPathDirectory, "/registration"},
		"kubelet-dir":      {"/var/lib/kubelet", corev1.HostPathDirectory, "/var/lib/kubelet"},
		"fuse-device":      {"/dev/fuse", corev1.HostPathCharDev, "/dev/fuse"},
		"state-dir":        {"/var/lib/healer-refdriver", corev1.HostPathDirectoryOrCreate, "/var/lib/healer-refdriver"},
	}
	for name, want := range hostPaths {
		v := volumeNamed(t, node, name)
		if v.HostPath == nil || v.HostPath.Path != want.path || v.HostPath.Type == nil || *v.HostPath.Type != want.typ {
			t.Errorf("node plugin volume %s: %+v, want hostPath %s of type %s", name, v.VolumeSource, want.path, want.typ)
		}
		if m, ok := mountOf(drv, name); !ok || m.MountPath != want.mountPath {
			t.Errorf("node plugin driver mounts %s at %q, want %s", name, m.MountPath, want.mountPath)
		}
	}
	if m, _ := mountOf(drv, "kubelet-dir"); m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Error("the kubelet folder is not mounted with Bidirectional propagation: kubelet and the pods would not see the driver's mounts")
	}

	side := container(t, node, "healer-sidecar")
	if side.Image != "healer-sidecar:v0.1.0" {
		t.Errorf("healer sidecar image %q", side.Image)
	}
	for _, want := range []string{"--driver-endpoint=unix:///csi/csi-addons.sock", "--listen=:9072", "--tls-cert-dir=/var/run/healer-sidecar/tls", "--tls-server-name=healer-sidecar"} {
		if !slices.Contains(side.Args, want) {
			t.Errorf("healer sidecar args %q lack %s", side.Args, want)
		}
	}
	if m, ok := mountOf(side, "socket-dir"); !ok || m.MountPath != "/csi" {
		t.Error("the healer sidecar does not see the driver's CSI-Addons socket in /csi")
	}
	if m, ok := mountOf(side, "kubelet-dir"); !ok || m.MountPath != "/var/lib/kubelet" || !m.ReadOnly ||
		m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
		t.Errorf("the healer sidecar mounts kubelet's folder as %+v, want /var/lib/kubelet read-only with HostToContainer propagation", m)
	}
	// The pod's own key, asked a certificate for, in memory: no node plugin holds another node's key.
	if v := volumeNamed(t, node, "healer-sidecar-tls"); v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("healer sidecar TLS volume %+v, want an in-memory emptyDir", v.VolumeSource)
	}
	for _, c := range node.Containers {
		if c.Name == "csi-addons" {
			t.Error("the csi-addons sidecar is rendered although csiAddons.enabled is false")
		}
	}
	if slices.ContainsFunc(side.Args, func(a string) bool { return strings.HasPrefix(a, "--csiaddonsnode-name") }) {
		t.Errorf("healer sidecar args %q name a csi-addons sidecar's object, but none runs", side.Args)
	}
}

// TestRefdriverChartValues checks that the values reach the objects: images, leader election,
// the csi-addons sidecar, a sidecar without TLS, names and folders.
func TestRefdriverChartValues(t *testing.T) {
	objs := refdriverTemplate(t, "rd", "storage",
		"images.refdriver.repository=registry.example/healer-refdriver",
		"images.refdriver.digest=sha256:0123456789012345678901234567890123456789012345678901234567890123",
		"images.refdriver.pullPolicy=Never",
		"images.healerSidecar.tag=v9.9.9",
		"images.csiProvisioner.repository=registry.example/csi-provisioner",
		"images.csiAttacher.tag=v4.99.0",
		"controller.leaderElection.enabled=true",
		"csiAddons.enabled=true",
		"healerSidecar.tls.enabled=false",
		"storageClass.name=fast-fuse",
		"storageClass.isDefault=true",
		"stateDir=/srv/refdriver",
		"kubeletDir=/data/kubelet",
		"node.serviceAccountName=plugin-sa",
	)
	var dep appsv1.Deployment
	convert(t, find(t, objs, "Deployment", "rd-healer-refdriver-controller"), &dep)
	ctl := dep.Spec.Template.Spec
	drv := container(t, ctl, "refdriver")
	if drv.Image != "registry.example/healer-refdriver@sha256:0123456789012345678901234567890123456789012345678901234567890123" || drv.ImagePullPolicy != corev1.PullNever {
		t.Errorf("refdriver image %q (%s), want the digest and Never", drv.Image, drv.ImagePullPolicy)
	}
	if got := container(t, ctl, "csi-provisioner").Image; got != "registry.example/csi-provisioner:v6.4.0" {
		t.Errorf("provisioner image %q", got)
	}
	if got := container(t, ctl, "csi-attacher").Image; got != "csi-attacher:v4.99.0" {
		t.Errorf("attacher image %q", got)
	}
	for _, name := range []string{"csi-provisioner", "csi-attacher"} {
		args := container(t, ctl, name).Args
		if !slices.Contains(args, "--leader-election=true") || !slices.Contains(args, "--leader-election-namespace=storage") {
			t.Errorf("%s args %q: want leader election in the release's namespace", name, args)
		}
	}
	var role rbacv1.Role
	convert(t, find(t, objs, "Role", "rd-healer-refdriver-leader-election"), &role)
	if len(role.Rules) != 1 || !slices.Contains(role.Rules[0].Resources, "leases") {
		t.Errorf("leader election Role rules %+v, want leases", role.Rules)
	}
	if v := volumeNamed(t, ctl, "state-dir"); v.HostPath == nil || v.HostPath.Path != "/srv/refdriver" {
		t.Errorf("controller state folder %+v, want /srv/refdriver", v.VolumeSource)
	}

	var ds appsv1.DaemonSet
	convert(t, find(t, objs, "DaemonSet", "rd-healer-refdriver-node"), &ds)
	node := ds.Spec.Template.Spec
	if node.ServiceAccountName != "plugin-sa" {
		t.Errorf("node plugin ServiceAccount %q", node.ServiceAccountName)
	}
	find(t, objs, "ServiceAccount", "plugin-sa")
	if got := container(t, node, "healer-sidecar").Image; got != "healer-sidecar:v9.9.9" {
		t.Errorf("healer sidecar image %q", got)
	}
	side := container(t, node, "healer-sidecar")
	if !slices.Contains(side.Args, "--insecure") || slices.ContainsFunc(side.Args, func(a string) bool { return strings.HasPrefix(a, "--tls-") }) {
		t.Errorf("healer sidecar args %q: want --insecure and no TLS files", side.Args)
	}
	for _, v := range node.Volumes {
		if v.Name == "healer-sidecar-tls" {
			t.Error("the TLS Secret is mounted although healerSidecar.tls.enabled is false")
		}
	}
	if want := "--csiaddonsnode-name=$(NODE_NAME)-storage-daemonset-rd-healer-refdriver-node"; !slices.Contains(side.Args, want) {
		t.Errorf("healer sidecar args %q: want %s, the csi-addons sidecar's object", side.Args, want)
	}
	addons := container(t, node, "csi-addons")
	if !slices.Contains(addons.Args, "--csi-addons-address=/csi/csi-addons.sock") || !slices.Contains(addons.Args, "--stagingpath=/data/kubelet/plugins/kubernetes.io/csi/") {
		t.Errorf("csi-addons args %q", addons.Args)
	}
	nodeDriver := container(t, node, "refdriver")
	if !slices.Contains(nodeDriver.Args, "--kubelet-csi-endpoint=/data/kubelet/plugins/healer.example.com/csi.sock") {
		t.Errorf("node plugin driver args %q: the CSI socket as kubelet sees it does not follow kubeletDir", nodeDriver.Args)
	}
	if v := volumeNamed(t, node, "registration-dir"); v.HostPath == nil || v.HostPath.Path != "/data/kubelet/plugins_registry" {
		t.Errorf("registration folder %+v", v.VolumeSource)
	}
	var sc storagev1.StorageClass
	convert(t, find(t, objs, "StorageClass", "fast-fuse"), &sc)
	if sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" {
		t.Errorf("StorageClass annotations %v: not the default class", sc.Annotations)
	}
}

// TestRefdriverChartStockMode: the node plugin can run as a driver that serves no Healer
// service, with rclone as its mounter and the start-up clean-up, as the tests of drivers without
// the protocol need; the controller plugin is the same either way.
func TestRefdriverChartStockMode(t *testing.T) {
	defaults := refdriverTemplate(t, "rd", "storage")
	stock := refdriverTemplate(t, "rd", "storage", "node.mode=stock", "node.mounter=rclone",
		"node.unmountDeadTargetsOnStart=true", "images.refdriver.repository=healer-refdriver-rclone")
	nodeDriver := func(objs []*unstructured.Unstructured) corev1.Container {
		var ds appsv1.DaemonSet
		convert(t, find(t, objs, "DaemonSet", "rd-healer-refdriver-node"), &ds)
		return container(t, ds.Spec.Template.Spec, "refdriver")
	}
	controllerDriver := func(objs []*unstructured.Unstructured) corev1.Container {
		var dep appsv1.Deployment
		convert(t, find(t, objs, "Deployment", "rd-healer-refdriver-controller"), &dep)
		return container(t, dep.Spec.Template.Spec, "refdriver")
	}
	d := nodeDriver(defaults)
	for _, want := range []string{"--mode=real", "--mounter=refdriver", "--capabilities=probe,heal,list"} {
		if !slices.Contains(d.Args, want) {
			t.Errorf("default node plugin args %q: no %s", d.Args, want)
		}
	}
	if slices.Contains(d.Args, "--unmount-dead-targets-on-start") {
		t.Errorf("default node plugin args %q: the start-up clean-up is on", d.Args)
	}
	s := nodeDriver(stock)
	for _, want := range []string{"--mode=stock", "--mounter=rclone", "--unmount-dead-targets-on-start"} {
		if !slices.Contains(s.Args, want) {
			t.Errorf("stock node plugin args %q: no %s", s.Args, want)
		}
	}
	if slices.ContainsFunc(s.Args, func(a string) bool { return strings.HasPrefix(a, "--capabilities") }) {
		t.Errorf("stock node plugin args %q: a stock driver takes no --capabilities", s.Args)
	}
	if s.Image != "healer-refdriver-rclone:v0.1.0" {
		t.Errorf("stock node plugin image %q, want healer-refdriver-rclone:v0.1.0", s.Image)
	}
	if a, b := controllerDriver(defaults).Args, controllerDriver(stock).Args; !slices.Equal(a, b) {
		t.Errorf("the controller plugin's args changed with the node plugin's mode: %q, then %q", a, b)
	}
}

// TestRefdriverChartRequiredValues checks that the chart refuses, naming the value, what
// cannot work.
func TestRefdriverChartRequiredValues(t *testing.T) {
	helm := tool(t, "helm")
	for name, tc := range map[string]struct {
		set  []string
		want string
	}{
		"an image without a tag":          {[]string{"images.csiAttacher.tag="}, "csi-attacher needs a tag or a digest"},
		"an image without a repository":   {[]string{"images.refdriver.repository="}, "images.<name>.repository"},
		"no node ServiceAccount":          {[]string{"node.serviceAccountName="}, "node.serviceAccountName is required"},
		"TLS without its key pair":        {[]string{"healerSidecar.tls.request=false", "healerSidecar.tls.hostPath="}, "healerSidecar.tls.hostPath or healerSidecar.tls.secretName is required"},
		"TLS without a server name":       {[]string{"healerSidecar.tls.serverName="}, "healerSidecar.tls.serverName is required"},
		"no controller ServiceAccount":    {[]string{"controller.serviceAccountName="}, "controller.serviceAccountName is required"},
		"an unknown mode":                 {[]string{"node.mode=simulated"}, `at '/node/mode': value must be one of 'real', 'stock'`},
		"an unknown mounter":              {[]string{"node.mounter=sshfs"}, `at '/node/mounter': value must be one of 'refdriver', 'rclone'`},
		"the clean-up of a Healer driver": {[]string{"node.unmountDeadTargetsOnStart=true"}, "set node.mode=stock too"},
		"a supervisor for a stock driver": {[]string{"supervisor.enabled=true", "node.mode=stock"}, "the mount supervisor is for node.mode=real"},
		"a supervisor of rclone":          {[]string{"supervisor.enabled=true", "node.mounter=rclone"}, "runs the refdriver mounter only, not node.mounter=rclone"},
		"a supervisor without a bound":    {[]string{"supervisor.maxMounts=0"}, `at '/supervisor/maxMounts'`},
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"template", "rd", refdriverChart, "--kube-version", kubeVersion}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			_, err := runErr(repoRoot(t), helm, args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template %v: %v, want an error with %q", tc.set, err, tc.want)
			}
		})
	}
	out := run(t, repoRoot(t), helm, "lint", "--strict", refdriverChart)
	if !strings.Contains(string(out), "0 chart(s) failed") {
		t.Errorf("helm lint: %s", out)
	}
}

// TestRefdriverChartFitsVolumeHealerChart checks that the volume-healer chart, given the sidecar
// values the reference driver's chart names, grants the node plugin's ServiceAccount what the
// healer sidecar needs, opens its port to the controller, and that the sidecar accepts the
// controller's identity and token audience.
func TestRefdriverChartFitsVolumeHealerChart(t *testing.T) {
	rd := refdriverTemplate(t, "healer-refdriver", refdriverNamespace)
	vh := healerForRefdriver(t)

	var ds appsv1.DaemonSet
	convert(t, find(t, rd, "DaemonSet", "healer-refdriver-node"), &ds)
	podLabels := labels.Set(ds.Spec.Template.Labels)

	var np networkingv1.NetworkPolicy
	convert(t, find(t, vh, "NetworkPolicy", "volume-healer-sidecar"), &np)
	if np.Namespace != refdriverNamespace {
		t.Errorf("NetworkPolicy in %q, want %s", np.Namespace, refdriverNamespace)
	}
	if sel := labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels); !sel.Matches(podLabels) {
		t.Errorf("the volume-healer chart's NetworkPolicy selects %v; the node plugin pods have %v", sel, podLabels)
	}

	var binding rbacv1.RoleBinding
	convert(t, find(t, vh, "RoleBinding", "volume-healer-sidecar"), &binding)
	if binding.Namespace != refdriverNamespace || len(binding.Subjects) != 1 ||
		binding.Subjects[0].Name != ds.Spec.Template.Spec.ServiceAccountName || binding.Subjects[0].Namespace != refdriverNamespace {
		t.Errorf("the sidecar RoleBinding binds %+v in %s; the node plugin runs as %s/%s",
			binding.Subjects, binding.Namespace, refdriverNamespace, ds.Spec.Template.Spec.ServiceAccountName)
	}

	side := container(t, ds.Spec.Template.Spec, "healer-sidecar")
	var sa corev1.ServiceAccount
	for _, o := range ofKind(vh, "ServiceAccount") {
		convert(t, o, &sa)
	}
	identity := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	if !slices.ContainsFunc(side.Args, func(a string) bool {
		v, ok := strings.CutPrefix(a, "--allowed-identities=")
		return ok && slices.Contains(strings.Split(v, ","), identity)
	}) {
		t.Errorf("the healer sidecar's args %q do not allow the volume-healer controller %s", side.Args, identity)
	}
	cfg := controllerConfig(t, vh)
	if !strings.Contains(cfg, "audience: volume-healer-sidecar") || !slices.Contains(side.Args, "--token-audience=volume-healer-sidecar") {
		t.Errorf("the sidecar's token audience does not match the controller's configuration:\nargs %q\n%s", side.Args, cfg)
	}
}

// TestRefdriverChartServerSideDryRun sends the reference driver's chart (defaults and every
// option) to a real kube-apiserver as server-side dry runs, applies the RBAC of both charts for
// real, and asks the API server what each ServiceAccount may do.
func TestRefdriverChartServerSideDryRun(t *testing.T) {
	tool(t, "helm") // skipped in -short mode before a control plane starts
	c := startCluster(t)
	c.installCRDs(t)

	renders := map[string][]*unstructured.Unstructured{
		"default values": refdriverTemplate(t, "healer-refdriver", refdriverNamespace),
		"every option": refdriverTemplate(t, "rd", "storage",
			"images.refdriver.digest=sha256:0123456789012345678901234567890123456789012345678901234567890123",
			"controller.leaderElection.enabled=true", "csiAddons.enabled=true", "healerSidecar.tls.enabled=false",
			"storageClass.name=fast-fuse", "storageClass.isDefault=true", "storageClass.parameters.tier=gold",
			`storageClass.annotations.healer\.csiaddons\.openshift\.io/schedule=*/10 * * * *`,
			"node.nodeSelector.disk=local", "controller.nodeSelector.disk=local",
			"node.resources.refdriver.requests.cpu=50m", "controller.resources.csiAttacher.requests.memory=32Mi",
			"csiAddons.extraArgs[0]=--enable-auth=false", "healerSidecar.extraArgs[0]=--v=4",
			"imagePullSecrets[0].name=pull"),
	}
	for name, objs := range renders {
		t.Run(name, func(t *testing.T) {
			if len(objs) < 9 {
				t.Fatalf("only %d objects rendered", len(objs))
			}
			c.apply(t, objs, true)
		})
	}

	// For real: the RBAC of both charts, then who may do what.
	var rbac []*unstructured.Unstructured
	for _, o := range append(refdriverTemplate(t, "healer-refdriver", refdriverNamespace), healerForRefdriver(t)...) {
		if o.GroupVersionKind().Group == "rbac.authorization.k8s.io" || o.GetKind() == "ServiceAccount" {
			rbac = append(rbac, o)
		}
	}
	c.apply(t, rbac, false)
	ra := func(verb, group, resource, namespace string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Namespace: namespace}
	}
	const (
		controllerSA = refdriverNamespace + "/healer-refdriver-controller"
		nodeSA       = refdriverNamespace + "/healer-refdriver-node"
	)
	tests := map[string]struct {
		serviceAccount string
		attrs          authorizationv1.ResourceAttributes
		allowed        bool
	}{
		"provisioner creates PersistentVolumes":       {controllerSA, ra("create", "", "persistentvolumes", ""), true},
		"provisioner deletes PersistentVolumes":       {controllerSA, ra("delete", "", "persistentvolumes", ""), true},
		"provisioner updates claims":                  {controllerSA, ra("update", "", "persistentvolumeclaims", "shop"), true},
		"provisioner reads StorageClasses":            {controllerSA, ra("watch", "storage.k8s.io", "storageclasses", ""), true},
		"provisioner records Events":                  {controllerSA, ra("create", "", "events", "shop"), true},
		"attacher patches VolumeAttachments":          {controllerSA, ra("patch", "storage.k8s.io", "volumeattachments", ""), true},
		"attacher reads CSINodes":                     {controllerSA, ra("get", "storage.k8s.io", "csinodes", ""), true},
		"controller plugin reads no Secrets":          {controllerSA, ra("get", "", "secrets", refdriverNamespace), false},
		"controller plugin deletes no claims":         {controllerSA, ra("delete", "", "persistentvolumeclaims", "shop"), false},
		"no Leases without leader election":           {controllerSA, ra("update", "coordination.k8s.io", "leases", refdriverNamespace), false},
		"healer sidecar reads VolumeAttachments":      {nodeSA, ra("get", "storage.k8s.io", "volumeattachments", ""), true},
		"healer sidecar watches no VolumeAttachments": {nodeSA, ra("watch", "storage.k8s.io", "volumeattachments", ""), false},
		"healer sidecar lists no PersistentVolumes":   {nodeSA, ra("list", "", "persistentvolumes", ""), false},
		"healer sidecar reviews tokens":               {nodeSA, ra("create", "authentication.k8s.io", "tokenreviews", ""), true},
		"healer sidecar registers its CSIAddonsNode":  {nodeSA, ra("create", "csiaddons.openshift.io", "csiaddonsnodes", refdriverNamespace), true},
		"healer sidecar changes no PersistentVolumes": {nodeSA, ra("patch", "", "persistentvolumes", ""), false},
		"node plugin reads no Secrets":                {nodeSA, ra("get", "", "secrets", refdriverNamespace), false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := c.can(t, tc.serviceAccount, tc.attrs); got != tc.allowed {
				t.Errorf("%s may %s %s/%s in %q: %v, want %v", tc.serviceAccount, tc.attrs.Verb, tc.attrs.Group, tc.attrs.Resource, tc.attrs.Namespace, got, tc.allowed)
			}
		})
	}
	// The attacher reports the outcome in the VolumeAttachment's status.
	status := authorizationv1.ResourceAttributes{Verb: "patch", Group: "storage.k8s.io", Resource: "volumeattachments", Subresource: "status"}
	if !c.can(t, controllerSA, status) {
		t.Error("the attacher may not patch volumeattachments/status")
	}
}

// TestRefdriverChartHostPathCertificates checks the former way, kept as an option: with
// healerSidecar.tls.request false the sidecar serves the node's own certificate from its folder.
func TestRefdriverChartHostPathCertificates(t *testing.T) {
	objs := refdriverTemplate(t, "rd", "storage", "healerSidecar.tls.request=false")
	var ds appsv1.DaemonSet
	convert(t, find(t, objs, "DaemonSet", "rd-healer-refdriver-node"), &ds)
	node := ds.Spec.Template.Spec
	side := container(t, node, "healer-sidecar")
	for _, want := range []string{"--tls-cert-file=/etc/healer-sidecar/tls/tls.crt", "--tls-key-file=/etc/healer-sidecar/tls/tls.key", "--tls-server-name=healer-sidecar"} {
		if !slices.Contains(side.Args, want) {
			t.Errorf("healer sidecar args %q lack %s", side.Args, want)
		}
	}
	if slices.ContainsFunc(side.Args, func(a string) bool { return strings.HasPrefix(a, "--tls-cert-dir") }) {
		t.Errorf("healer sidecar args %q ask for a certificate although healerSidecar.tls.request is false", side.Args)
	}
	if v := volumeNamed(t, node, "healer-sidecar-tls"); v.HostPath == nil || v.HostPath.Path != "/etc/volume-healer/healer-sidecar" {
		t.Errorf("healer sidecar TLS volume %+v, want the node's folder /etc/volume-healer/healer-sidecar", v.VolumeSource)
	}
}

// TestRefdriverChartSupervisor checks the mount supervisor's DaemonSet (supervisor.enabled): what
// it needs to mount for kubelet and the pods, the socket folder it shares with the node plugin,
// the update strategy its handover needs, and the node plugin's --supervisor-socket.
func TestRefdriverChartSupervisor(t *testing.T) {
	nodePlugin := func(objs []*unstructured.Unstructured) corev1.PodSpec {
		var ds appsv1.DaemonSet
		convert(t, find(t, objs, "DaemonSet", "rd-healer-refdriver-node"), &ds)
		return ds.Spec.Template.Spec
	}
	defaults := refdriverTemplate(t, "rd", "storage")
	for _, o := range defaults {
		if o.GetKind() == "DaemonSet" && o.GetName() == "rd-healer-refdriver-supervisor" {
			t.Errorf("the supervisor is rendered with the default values")
		}
	}
	if args := container(t, nodePlugin(defaults), "refdriver").Args; slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--supervisor-socket") }) {
		t.Errorf("default node plugin args %q: --supervisor-socket without the supervisor", args)
	}

	objs := refdriverTemplate(t, "rd", "storage", "supervisor.enabled=true", "supervisor.maxMounts=10", "supervisor.socketDir=/run/sup")
	var ds appsv1.DaemonSet
	convert(t, find(t, objs, "DaemonSet", "rd-healer-refdriver-supervisor"), &ds)
	if u := ds.Spec.UpdateStrategy.RollingUpdate; u == nil || u.MaxSurge == nil || u.MaxSurge.IntValue() != 1 || u.MaxUnavailable == nil || u.MaxUnavailable.IntValue() != 0 {
		t.Errorf("supervisor update strategy %+v; want maxSurge 1, maxUnavailable 0, for the handover", ds.Spec.UpdateStrategy)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Errorf("the supervisor has no hostPID: the node plugin would not find its mounters by their PIDs")
	}
	c := container(t, spec, "supervisor")
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Errorf("the supervisor is not privileged: it mounts")
	}
	for _, want := range []string{"supervisor", "--socket=/supervisor/supervisor.sock", "--max-mounts=10", "--instance=$(POD_NAME)"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("supervisor args %q: no %s", c.Args, want)
		}
	}
	if p := c.ReadinessProbe; p == nil || p.Exec == nil || !slices.Contains(p.Exec.Command, "--ready") {
		t.Errorf("the supervisor's readiness probe is %+v; want the status check with --ready, which an upgrade waits for", p)
	}
	if m, ok := mountOf(c, "kubelet-dir"); !ok || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional || m.MountPath != "/var/lib/kubelet" {
		t.Errorf("the supervisor's kubelet folder mount is %+v; want /var/lib/kubelet, Bidirectional", m)
	}
	if v := volumeNamed(t, spec, "fuse-device"); v.HostPath == nil || v.HostPath.Path != "/dev/fuse" {
		t.Errorf("the supervisor's fuse-device volume is %+v; want /dev/fuse", v)
	}
	if m, ok := mountOf(c, "state-dir"); !ok || m.MountPath != "/var/lib/healer-refdriver" {
		t.Errorf("the supervisor's mount of the driver's state folder is %+v; the mounters serve the backing folders at the node plugin's paths", m)
	}

	plugin := nodePlugin(objs)
	if args := container(t, plugin, "refdriver").Args; !slices.Contains(args, "--supervisor-socket=/supervisor/supervisor.sock") {
		t.Errorf("node plugin args %q: no --supervisor-socket", args)
	}
	pluginSock, supSock := volumeNamed(t, plugin, "supervisor-socket-dir"), volumeNamed(t, spec, "socket-dir")
	if pluginSock.HostPath == nil || supSock.HostPath == nil || pluginSock.HostPath.Path != "/run/sup" || supSock.HostPath.Path != "/run/sup" {
		t.Errorf("socket folders: node plugin %+v, supervisor %+v; want both the hostPath /run/sup", pluginSock.VolumeSource, supSock.VolumeSource)
	}
	if m, ok := mountOf(container(t, plugin, "refdriver"), "supervisor-socket-dir"); !ok || m.MountPath != "/supervisor" {
		t.Errorf("the node plugin mounts the supervisor's socket folder at %+v; want /supervisor", m)
	}
}
