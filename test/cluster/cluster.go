// Package cluster runs a real single-node Kubernetes cluster on this machine, for the real-cluster
// suite and the demo: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy,
// containerd with runc, and kubelet, all as child processes, the pods on a bridge of the node's
// own. hack/control-plane.sh builds kube-apiserver and etcd and hack/node.sh the rest.
//
// It needs root, cgroups and the CNI plugins (hack/node.sh installs them); Unavailable says
// why a machine cannot run it. Stop leaves the machine as Start found it: no process, mount,
// cgroup, network device, iptables chain or changed sysctl of the node's remains, and Leftovers
// checks that.
//
// Every component authenticates with a certificate of its own from the cluster's CA (kubelet as
// system:node:<name>, the Node authorizer and RBAC enabled), as a kubeadm cluster does.
//
// It owns the node: its processes, files, certificates, network and their clean-up. Of
// volume-healer it imports only test/controlplane (kube-apiserver and etcd) and test/harness
// (certificates, processes, builds); it must not import the product's packages, since what runs
// on the node is the project's images and charts, installed as a user installs them. Only suites
// (test/realcluster, test/demo) import it.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/volume-healer/volume-healer/test/harness"
)

// KubeletRootDir is kubelet's root: the one every CSI node plugin's manifests assume.
const KubeletRootDir = "/var/lib/kubelet"

// Options say where the binaries are and how the node is named.
type Options struct {
	// Dir receives the cluster's certificates, etcd's data, containerd's root and every log
	// (logs/<component>.log). Required; removed by Stop except the logs.
	Dir string
	// ControlPlaneBin holds kube-apiserver and etcd (hack/control-plane.sh). Required.
	ControlPlaneBin string
	// NodeBin holds kubelet, kube-controller-manager, kube-scheduler, kube-proxy, containerd, ctr
	// and containerd-shim-runc-v2 (hack/node.sh). Required.
	NodeBin string
	// SandboxImage is the pod sandbox image (hack/images --cluster-images: healer-test-pause).
	// Required.
	SandboxImage Image
	// NodeName is the node's name. Default "vh-node".
	NodeName string
	// Subnet is the node's private IPv4 range; the node takes its first address, pods the rest.
	// Default 10.213.77.0/24.
	Subnet string
	// Logf receives progress lines. Default: none.
	Logf func(format string, args ...any)

	// lock is the machine-wide node lock when the caller took it already (StartFor, which holds
	// it while the images are built and imported too); Start takes it otherwise.
	lock *os.File
}

// Cluster is a started cluster.
type Cluster struct {
	// Kubeconfig is an administrator's kubeconfig (system:masters), for kubectl and helm.
	Kubeconfig string
	// Config and Clientset reach the API server as that administrator.
	Config    *rest.Config
	Clientset kubernetes.Interface
	// NodeIP is the node's address: the API server listens there, pods route through it.
	NodeIP string
	// Server is the API server's URL.
	Server string

	opts    Options
	dirs    nodeDirs
	net     subnet
	procs   *harness.Processes
	running map[string]*harness.Process
	sysctls map[string]string
	// made says what Start made that Stop undoes.
	made    made
	etcdURL string
	// chains are the iptables chains that existed before the start.
	chains []string
	// lock is the machine-wide node lock, held from Start to the end of Stop.
	lock *os.File
}

// lockPath is the file whose flock makes one node at a time run on a machine: test packages run
// in parallel, and two nodes would share kubelet's root and the bridge.
const lockPath = "/run/volume-healer-node.lock"

// takeLock waits, until ctx ends, for the machine-wide node lock.
func takeLock(ctx context.Context) (*os.File, error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			return f, nil
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("another node runs on this machine (%s is locked): %w", lockPath, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// made records the machine-wide things Start created, so that Stop removes those and only those.
type made struct {
	bridge, kubeletRoot, runContainerd, runNetns bool
}

// nodeDirs are the node's folders and sockets.
type nodeDirs struct {
	root, logs, pki, etcd                           string
	containerdRoot, containerdState, containerdSock string
	cniConf, cniState                               string
	kubelet                                         string
}

func newDirs(root string) nodeDirs {
	return nodeDirs{
		root: root, logs: filepath.Join(root, "logs"), pki: filepath.Join(root, "pki"), etcd: filepath.Join(root, "etcd"),
		containerdRoot: filepath.Join(root, "containerd", "root"), containerdState: filepath.Join(root, "containerd", "state"),
		containerdSock: filepath.Join(root, "containerd", "containerd.sock"),
		cniConf:        filepath.Join(root, "cni", "net.d"), cniState: filepath.Join(root, "cni", "state"),
		kubelet: filepath.Join(root, "kubelet"),
	}
}

// Unavailable says why this machine cannot run the node, or "" when it can.
func Unavailable() string {
	m := Check()
	why := m.Lacks
	for _, prog := range m.Installable {
		why = append(why, "no "+prog)
	}
	return strings.Join(why, ", ")
}

// Machine is what this machine lacks to run the node.
type Machine struct {
	// Lacks are what no script of the project can give it: root, a cgroup memory controller.
	Lacks []string
	// Installable are the programs missing that hack/node.sh (make node) installs from Debian's
	// packages when it runs as root: "runc", "ip", "iptables", "CNI bridge plugin".
	Installable []string
}

// Packages returns the Debian packages that hack/node.sh installs for m's Installable programs.
func (m Machine) Packages() []string {
	pkgs := make([]string, 0, len(m.Installable))
	for _, prog := range m.Installable {
		if pkg, ok := debianPackages[prog]; ok {
			pkgs = append(pkgs, pkg)
		}
	}
	return pkgs
}

// debianPackages names the Debian package of each program Check looks for, as hack/node.sh's
// install_packages installs them.
var debianPackages = map[string]string{
	"runc": "runc", "ip": "iproute2", "iptables": "iptables", "CNI bridge plugin": "containernetworking-plugins",
}

// Check says what this machine lacks to run the node.
func Check() Machine {
	var m Machine
	if os.Geteuid() != 0 {
		m.Lacks = append(m.Lacks, "not root")
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
		if _, err2 := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err2 != nil {
			m.Lacks = append(m.Lacks, "no cgroup memory controller")
		}
	}
	for _, bin := range []string{"runc", "ip", "iptables"} {
		if _, err := exec.LookPath(bin); err != nil {
			m.Installable = append(m.Installable, bin)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		m.Installable = append(m.Installable, "CNI bridge plugin")
	}
	return m
}

// occupied says what of a node is already on the machine, which Start (holding the node lock)
// does not take over: a node that was not cleaned up, or a kubelet of the machine's own.
func occupied() string {
	var why []string
	if linkExists(bridgeName) {
		why = append(why, "network device "+bridgeName+" exists")
	}
	if _, err := os.Stat(KubeletRootDir); err == nil {
		why = append(why, KubeletRootDir+" exists (another kubelet, or one not cleaned up)")
	}
	return strings.Join(why, ", ")
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

func (c *Cluster) logPath(component string) string {
	return filepath.Join(c.dirs.logs, component+".log")
}

// Start starts every component and returns once the node is Ready. On failure it stops what it
// started.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Dir == "" || o.ControlPlaneBin == "" || o.NodeBin == "" || o.SandboxImage.Archive == "" {
		return nil, errors.New("cluster: Dir, ControlPlaneBin, NodeBin and SandboxImage are required")
	}
	if o.NodeName == "" {
		o.NodeName = "vh-node"
	}
	if o.Subnet == "" {
		o.Subnet = "10.213.77.0/24"
	}
	s, err := newSubnet(o.Subnet)
	if err != nil {
		return nil, err
	}
	lock := o.lock
	if lock == nil {
		if lock, err = takeLock(ctx); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
	}
	if why := strings.Trim(Unavailable()+", "+occupied(), ", "); why != "" {
		_ = lock.Close()
		return nil, fmt.Errorf("cluster: cannot run a node here: %s", why)
	}
	c = &Cluster{opts: o, lock: lock, dirs: newDirs(o.Dir), net: s, NodeIP: s.nodeIP, procs: harness.NewProcesses(),
		running: map[string]*harness.Process{}, sysctls: saveSysctls(), chains: iptablesChains()}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w (logs in %s)", err, c.dirs.logs)
			if stopErr := c.Stop(); stopErr != nil {
				err = errors.Join(err, fmt.Errorf("and stopping what had started: %w", stopErr))
			}
			c = nil
		}
	}()
	for _, d := range []string{c.dirs.logs, c.dirs.pki, c.dirs.etcd, c.dirs.containerdRoot, c.dirs.containerdState, c.dirs.cniConf, c.dirs.cniState, c.dirs.kubelet} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return c, err
		}
	}
	start := time.Now()
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"network", c.startNetwork},
		{"certificates", c.writeCertificates},
		{"etcd", c.startEtcd},
		{"kube-apiserver", c.startAPIServer},
		{"containerd", c.startContainerd},
		{"kube-controller-manager", c.startControllerManager},
		{"kube-scheduler", c.startScheduler},
		{"kube-proxy", c.startProxy},
		{"kubelet", c.startKubelet},
		{"node Ready", c.waitNodeReady},
		{"the kubernetes Service", c.waitServiceRule},
		{"the default ServiceAccount", c.waitDefaultServiceAccount},
	}
	for _, step := range steps {
		t := time.Now()
		if err := step.run(ctx); err != nil {
			return c, fmt.Errorf("cluster: %s: %w", step.name, err)
		}
		c.logf("cluster: %s up in %s", step.name, time.Since(t).Round(10*time.Millisecond))
	}
	c.logf("cluster: node %s Ready at %s, %s after the start", o.NodeName, c.NodeIP, time.Since(start).Round(100*time.Millisecond))
	return c, nil
}

// start runs a component, its output in logs/<name>.log.
func (c *Cluster) start(name, bin string, args []string, env []string) error {
	p, err := c.procs.Start(name, bin, args, env, c.logPath(name))
	if err != nil {
		return err
	}
	c.running[name] = p
	return nil
}

// exited tells whether the component has died, with the end of its log.
func (c *Cluster) exited(name string) error {
	p := c.running[name]
	if p == nil || p.Running() {
		return nil
	}
	return fmt.Errorf("%s exited (%s): %s", name, p.ExitStatus(), tail(c.logPath(name), 15))
}

func (c *Cluster) startNetwork(context.Context) error {
	if err := createBridge(c.net); err != nil {
		return err
	}
	c.made.bridge = true
	return writeCNIConfig(c.dirs.cniConf, c.dirs.cniState, c.net)
}

// pki holds the paths of the certificates Start writes.
type pki struct {
	ca, apiserverCert, apiserverKey, saKey, saPub string
	kubeconfigs                                   map[string]string
}

func (c *Cluster) pkiPaths() pki {
	d := c.dirs.pki
	return pki{
		ca: filepath.Join(d, "ca.crt"), apiserverCert: filepath.Join(d, "apiserver.crt"), apiserverKey: filepath.Join(d, "apiserver.key"),
		saKey: filepath.Join(d, "sa.key"), saPub: filepath.Join(d, "sa.pub"),
		kubeconfigs: map[string]string{
			"admin": filepath.Join(d, "admin.kubeconfig"), "kubelet": filepath.Join(d, "kubelet.kubeconfig"),
			"kube-controller-manager": filepath.Join(d, "kube-controller-manager.kubeconfig"),
			"kube-scheduler":          filepath.Join(d, "kube-scheduler.kubeconfig"), "kube-proxy": filepath.Join(d, "kube-proxy.kubeconfig"),
		},
	}
}

// apiserverPort is the API server's port on the node's address.
const apiserverPort = 6443

func (c *Cluster) writeCertificates(context.Context) error {
	ca, err := harness.NewCAFor("volume-healer test cluster CA", caValidity)
	if err != nil {
		return err
	}
	p := c.pkiPaths()
	if err := os.WriteFile(p.ca, ca.CertPEM, 0o644); err != nil {
		return err
	}
	d := c.dirs.pki
	if _, _, err := issue(ca, d, "apiserver", harness.Identity{Name: "kube-apiserver", Server: true, Client: true,
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPs:      parseIPs("127.0.0.1", c.NodeIP, kubernetesServiceIP)}); err != nil {
		return err
	}
	if _, _, err := writeServiceAccountKey(d); err != nil {
		return err
	}
	c.Server = fmt.Sprintf("https://%s:%d", c.NodeIP, apiserverPort)
	clients := map[string]harness.Identity{
		"admin":                   {Name: "volume-healer-admin", Groups: []string{"system:masters"}, Client: true},
		"kubelet":                 {Name: "system:node:" + c.opts.NodeName, Groups: []string{"system:nodes"}, Client: true},
		"kube-controller-manager": {Name: "system:kube-controller-manager", Client: true},
		"kube-scheduler":          {Name: "system:kube-scheduler", Client: true},
		"kube-proxy":              {Name: "system:kube-proxy", Groups: []string{"system:node-proxier"}, Client: true},
		// The API server's client certificate for kubelet's API (logs, exec).
		"apiserver-kubelet-client": {Name: "kube-apiserver-kubelet-client", Groups: []string{"system:masters"}, Client: true},
		// kubelet's serving certificate, which the API server checks against the CA.
		"kubelet-serving": {Name: "system:node:" + c.opts.NodeName, Groups: []string{"system:nodes"}, Server: true, Client: true,
			DNSNames: []string{c.opts.NodeName}, IPs: parseIPs(c.NodeIP)},
	}
	for name, id := range clients {
		cert, key, err := issue(ca, d, name, id)
		if err != nil {
			return err
		}
		if kc, ok := p.kubeconfigs[name]; ok {
			if err := kubeconfig(kc, c.Server, p.ca, cert, key); err != nil {
				return err
			}
		}
	}
	c.Kubeconfig = p.kubeconfigs["admin"]
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	c.Config = cfg
	c.Clientset, err = kubernetes.NewForConfig(cfg)
	return err
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	client, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	peer, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	c.etcdURL = "http://" + client
	return c.start("etcd", filepath.Join(c.opts.ControlPlaneBin, "etcd"), []string{
		"--data-dir", c.dirs.etcd, "--listen-client-urls", c.etcdURL, "--advertise-client-urls", c.etcdURL,
		"--listen-peer-urls", "http://" + peer, "--initial-advertise-peer-urls", "http://" + peer,
		"--initial-cluster", "default=http://" + peer, "--unsafe-no-fsync",
	}, nil)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p := c.pkiPaths()
	d := c.dirs.pki
	err := c.start("kube-apiserver", filepath.Join(c.opts.ControlPlaneBin, "kube-apiserver"), []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=" + c.NodeIP, "--advertise-address=" + c.NodeIP, fmt.Sprintf("--secure-port=%d", apiserverPort),
		"--tls-cert-file=" + p.apiserverCert, "--tls-private-key-file=" + p.apiserverKey,
		"--client-ca-file=" + p.ca,
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file=" + p.saPub,
		"--service-account-signing-key-file=" + p.saKey,
		"--service-cluster-ip-range=" + serviceCIDR,
		"--authorization-mode=Node,RBAC", "--allow-privileged=true",
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate=" + filepath.Join(d, "apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + filepath.Join(d, "apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority=" + p.ca,
		// Webhooks (the policy webhook) are called at their endpoints, not through a Service IP.
		"--enable-aggregator-routing=true",
		"--shutdown-watch-termination-grace-period=2s",
		"--profiling=false",
	}, nil)
	if err != nil {
		return err
	}
	return c.waitFor(ctx, "kube-apiserver", 2*time.Minute, func(ctx context.Context) error {
		body, err := c.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return err
		}
		if string(body) != "ok" {
			return fmt.Errorf("readyz: %s", body)
		}
		// The bootstrap RBAC roles the components' identities need.
		_, err = c.Clientset.RbacV1().ClusterRoleBindings().Get(ctx, "system:kube-controller-manager", metav1.GetOptions{})
		return err
	})
}

// waitFor polls check every 250ms until it succeeds, the component dies, or timeout passes.
func (c *Cluster) waitFor(ctx context.Context, component string, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		callCtx, callCancel := context.WithTimeout(ctx, 5*time.Second)
		last = check(callCtx)
		callCancel()
		if last == nil {
			return nil
		}
		if err := c.exited(component); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w; log: %s", component, timeout, last, tail(c.logPath(component), 15))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	runc, err := exec.LookPath("runc")
	if err != nil {
		return err
	}
	cfg := filepath.Join(c.dirs.root, "containerd", "config.toml")
	if err := os.WriteFile(cfg, []byte(containerdConfig(c.dirs, runc, c.opts.SandboxImage.Ref)), 0o644); err != nil {
		return err
	}
	if _, err := os.Stat("/run/containerd"); err != nil {
		c.made.runContainerd = true
	}
	if _, err := os.Stat("/run/netns"); err != nil {
		c.made.runNetns = true
	}
	// The shim is found on PATH.
	env := append(os.Environ(), "PATH="+c.opts.NodeBin+":"+os.Getenv("PATH"))
	if err := c.start("containerd", filepath.Join(c.opts.NodeBin, "containerd"), []string{"--config", cfg}, env); err != nil {
		return err
	}
	if err := c.waitContainerd(ctx); err != nil {
		return err
	}
	return c.ImportImage(ctx, c.opts.SandboxImage)
}

func (c *Cluster) startControllerManager(context.Context) error {
	p := c.pkiPaths()
	return c.start("kube-controller-manager", filepath.Join(c.opts.NodeBin, "kube-controller-manager"), []string{
		"--kubeconfig=" + p.kubeconfigs["kube-controller-manager"],
		"--authentication-kubeconfig=" + p.kubeconfigs["kube-controller-manager"],
		"--authorization-kubeconfig=" + p.kubeconfigs["kube-controller-manager"],
		"--root-ca-file=" + p.ca, "--service-account-private-key-file=" + p.saKey,
		"--use-service-account-credentials=true", "--leader-elect=false",
		"--service-cluster-ip-range=" + serviceCIDR,
		"--bind-address=127.0.0.1", "--secure-port=0",
		"--controllers=*,-bootstrapsigner,-tokencleaner",
	}, nil)
}

func (c *Cluster) startScheduler(context.Context) error {
	kc := c.pkiPaths().kubeconfigs["kube-scheduler"]
	return c.start("kube-scheduler", filepath.Join(c.opts.NodeBin, "kube-scheduler"), []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
	}, nil)
}

func (c *Cluster) startProxy(context.Context) error {
	metrics, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	cfg := filepath.Join(c.dirs.root, "kube-proxy.yaml")
	conf := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
mode: iptables
hostnameOverride: %q
clusterCIDR: %q
bindAddress: 127.0.0.1
metricsBindAddress: %q
healthzBindAddress: ""
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, c.pkiPaths().kubeconfigs["kube-proxy"], c.opts.NodeName, c.net.cidr, metrics)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return err
	}
	return c.start("kube-proxy", filepath.Join(c.opts.NodeBin, "kube-proxy"), []string{"--config=" + cfg}, nil)
}

// waitServiceRule waits until kube-proxy has programmed the kubernetes Service, through which pods
// reach the API server. kube-proxy does so once kubelet has registered the Node.
func (c *Cluster) waitServiceRule(ctx context.Context) error {
	return c.waitFor(ctx, "kube-proxy", time.Minute, func(context.Context) error {
		out, err := exec.Command("iptables-save", "-t", "nat").Output()
		if err != nil {
			return fmt.Errorf("iptables-save: %w", err)
		}
		if !strings.Contains(string(out), "-d "+kubernetesServiceIP+"/32") {
			return fmt.Errorf("no rule for the kubernetes Service (%s) yet", kubernetesServiceIP)
		}
		return nil
	})
}

func (c *Cluster) startKubelet(context.Context) error {
	p := c.pkiPaths()
	if _, err := os.Stat(KubeletRootDir); err != nil {
		c.made.kubeletRoot = true
	}
	cfg := filepath.Join(c.dirs.kubelet, "config.yaml")
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %q
authorization:
  mode: Webhook
address: %q
port: 10250
readOnlyPort: 0
healthzPort: 0
tlsCertFile: %q
tlsPrivateKeyFile: %q
podCIDR: %q
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
  nodefs.inodesFree: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
volumeStatsAggPeriod: 1m
serializeImagePulls: false
protectKernelDefaults: false
`, c.dirs.containerdSock, p.ca, c.NodeIP, filepath.Join(c.dirs.pki, "kubelet-serving.crt"), filepath.Join(c.dirs.pki, "kubelet-serving.key"), c.net.cidr)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return err
	}
	return c.start("kubelet", filepath.Join(c.opts.NodeBin, "kubelet"), []string{
		"--config=" + cfg, "--kubeconfig=" + p.kubeconfigs["kubelet"],
		"--hostname-override=" + c.opts.NodeName, "--node-ip=" + c.NodeIP,
		"--root-dir=" + KubeletRootDir, "--cert-dir=" + filepath.Join(c.dirs.kubelet, "pki"),
		"--v=2",
	}, nil)
}

func (c *Cluster) waitNodeReady(ctx context.Context) error {
	return c.waitFor(ctx, "kubelet", 3*time.Minute, func(ctx context.Context) error {
		n, err := c.Clientset.CoreV1().Nodes().Get(ctx, c.opts.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s not Ready: %s", c.opts.NodeName, cond.Message)
			}
		}
		return fmt.Errorf("node %s has no Ready condition yet", c.opts.NodeName)
	})
}

// waitDefaultServiceAccount waits until kube-controller-manager has made the ServiceAccount
// "default" of the namespace default: until then no pod can be created there.
func (c *Cluster) waitDefaultServiceAccount(ctx context.Context) error {
	return c.waitFor(ctx, "kube-controller-manager", time.Minute, func(ctx context.Context) error {
		_, err := c.Clientset.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// NodeName is the node's name.
func (c *Cluster) NodeName() string { return c.opts.NodeName }

// ContainerdSocket is the path of the node's containerd socket, which kubelet speaks CRI to.
func (c *Cluster) ContainerdSocket() string { return c.dirs.containerdSock }

// Logs is the folder of the components' logs.
func (c *Cluster) Logs() string { return c.dirs.logs }

// tail returns the last n lines of the file at path.
func tail(path string, n int) string { return harness.FileTail(path, n) }
