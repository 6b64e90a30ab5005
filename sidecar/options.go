package sidecar

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/sidecar/restart"
)

// Defaults of Options, exported so that the command line can show them.
const (
	// DefaultDriverEndpoint is the driver's CSI-Addons socket as the node plugin pod mounts it.
	DefaultDriverEndpoint = "unix:///csi/csi-addons.sock"
	// DefaultListenAddress serves NodeHealer on every address, IPv4 and IPv6, on a port clear of
	// 9070, which csi-addons deployments conventionally give the csi-addons sidecar.
	DefaultListenAddress = ":9072"
	// DefaultMetricsAddress serves /metrics, /healthz and /readyz.
	DefaultMetricsAddress = ":9071"
	// DefaultAllowedIdentity is the controller's ServiceAccount in the default installation.
	DefaultAllowedIdentity = "system:serviceaccount:volume-healer:volume-healer"
	// DefaultKubeletDir is kubelet's root folder, the base of the staging paths.
	DefaultKubeletDir = "/var/lib/kubelet"
	// DefaultMaxMessageSize bounds every gRPC message, in both directions, on both sides.
	DefaultMaxMessageSize = 4 << 20
	// DefaultDriverTimeout bounds each call to the driver that comes without a deadline of its
	// caller.
	DefaultDriverTimeout = 30 * time.Second
	// DefaultAPIQPS and DefaultAPIBurst pace the sidecar's reads of PersistentVolumes,
	// VolumeAttachments and Secrets when KubeConfig sets no pace. Each heal, and each probe
	// without a recent read, reads its VolumeAttachment (and its PV when not cached): a restart
	// of a node plugin with 1,000 volumes makes 1,000 to 2,000 reads, which at 50 a second took
	// 24 s where the calls themselves needed 5. At these values the controller's per-node budget,
	// not the client, sets the pace of a sweep; the controller's global budget bounds the calls
	// in flight over the whole cluster, and with them every sidecar's reads together.
	DefaultAPIQPS = 1000
	// DefaultAPIBurst: see DefaultAPIQPS.
	DefaultAPIBurst = 2000
	// DefaultShutdownTimeout bounds how long calls in flight may run after a stop is requested.
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultAuthCacheTTL is how long an accepted token is trusted without a new TokenReview.
	DefaultAuthCacheTTL = 30 * time.Second
	// DefaultSecretCacheTTL is how long a node-stage Secret read is handed to the driver before it
	// is read again.
	DefaultSecretCacheTTL = time.Minute
	// DefaultAuthFailureCacheTTL is how long a rejected token stays rejected without a new
	// TokenReview.
	DefaultAuthFailureCacheTTL = 10 * time.Second
)

// Options configure a Sidecar. Zero values take the defaults documented on each field.
type Options struct {
	// KubeConfig reaches the API server with the sidecar's own ServiceAccount. Without QPS and
	// Burst, its reads are paced at DefaultAPIQPS and DefaultAPIBurst. Required.
	KubeConfig *rest.Config

	// NodeName is the Kubernetes Node the sidecar runs on (downward API spec.nodeName). It is
	// reported by GetHealerCapabilities and written as spec.driver.nodeID of the CSIAddonsNode,
	// as the csi-addons sidecar does. Required.
	NodeName string

	// Namespace is where the CSIAddonsNode lives: the node plugin pod's namespace (downward API
	// metadata.namespace). Required.
	Namespace string

	// PodUID is the node plugin pod's UID (downward API metadata.uid). It is part of the restart
	// marker so that the marker changes even if two starts read the same clock. Default: none,
	// the marker is the start time alone.
	PodUID string

	// PodIP is the node plugin pod's IP (downward API status.podIP), used for the advertised
	// endpoint when AdvertiseAddress is empty. Default: none.
	PodIP string

	// DriverEndpoint is the driver's CSI-Addons UNIX socket, "unix:///path" or "/path", from
	// which the sidecar learns the driver's name (CSI-Addons Identity) and its Healer service.
	// Default: DefaultDriverEndpoint, unless CSIEndpoint or DriverName is set: the driver then
	// has no CSI-Addons socket, and DriverEndpoint must be empty.
	DriverEndpoint string

	// CSIEndpoint is the driver's CSI UNIX socket, "unix:///path" or "/path" (the one kubelet
	// and node-driver-registrar use, such as unix:///csi/csi.sock), for a driver that has no
	// CSI-Addons socket: the sidecar learns the driver's name from its CSI GetPluginInfo, serves
	// it with its own node-local probe (tier none: no Healer service, no heal), and a new
	// connection to the socket shows a restart of the driver, as for a CSI-Addons socket.
	// Default: none.
	CSIEndpoint string

	// DriverName is the CSI driver's name, for a driver that has no CSI-Addons socket. With
	// CSIEndpoint, the name the driver's GetPluginInfo answers must be this one, or the sidecar
	// does not become ready. Without it, the sidecar serves this driver with no socket of the
	// driver at all: it then cannot see a restart of the driver's container alone (a restart of
	// the pod restarts the sidecar too, which writes its restart marker). Default: none.
	DriverName string

	// ListenAddress is the TCP address NodeHealer is served on, "host:port"; ":port" listens on
	// every IPv4 and IPv6 address, "[::1]:port" on one IPv6 address. Default:
	// DefaultListenAddress.
	ListenAddress string

	// AdvertiseAddress is the "host:port" the controller dials, written to the CSIAddonsNode.
	// A value without a port gets the port of ListenAddress. Default: PodIP and the listening
	// port; when PodIP is empty too, the listening address if it names one host.
	AdvertiseAddress string

	// CSIAddonsNodeName names the CSIAddonsNode to create or update. Default: the CSIAddonsNode
	// in Namespace whose spec.driver names this driver and node, if there is one (the csi-addons
	// sidecar's), else DefaultCSIAddonsNodeName(NodeName, driver name).
	CSIAddonsNodeName string

	// CSIAddonsSidecarWait, when set, is how long a start of the sidecar waits for the csi-addons
	// sidecar of the same pod to write CSIAddonsNodeName (its createdByPodUID annotation naming
	// PodUID) before the sidecar writes its own annotations on it. The csi-addons sidecar writes
	// its object once with a read and an update, and when that update conflicts with another
	// write it tries again only minutes later; waiting for it keeps the two sidecars' first writes
	// apart. Past the wait the sidecar registers anyway and says so. It needs CSIAddonsNodeName
	// and PodUID. Default: 0, no wait (no csi-addons sidecar in the pod).
	CSIAddonsSidecarWait time.Duration

	// TLSCertFile and TLSKeyFile hold the serving certificate and key, PEM encoded. They are read
	// again when they change, so a rotated certificate needs no restart. Required unless
	// Insecure.
	TLSCertFile string
	// TLSKeyFile: see TLSCertFile.
	TLSKeyFile string

	// TLSCertificateRequestDir, when set, makes Run ask for the serving certificate with a
	// CertificateSigningRequest (ServingCertificates), keep the key and certificate in this
	// folder (an emptyDir of the pod), renew them before they expire, and point TLSCertFile and
	// TLSKeyFile at them; TLSServerName is then required, and TLSCertFile, TLSKeyFile and
	// Insecure must be empty. New itself reads files only. Default: none, the operator gives
	// the files.
	TLSCertificateRequestDir string
	// TLSCertificateValidity is the validity asked for with TLSCertificateRequestDir (at least
	// 10 minutes); the controller's signer may give less. Default: the signer's.
	TLSCertificateValidity time.Duration

	// TLSServerName is the base of the name the controller expects in this node's certificate
	// (its sidecar.tls.serverName): the certificate must be valid for "<NodeName>.<TLSServerName>",
	// or the sidecar does not start, and a rotated certificate that is not is passed over. It
	// catches a certificate the controller would refuse before the controller does. Default: none,
	// no check.
	TLSServerName string

	// ClientCAFile, when set, names a PEM bundle of CAs: every connection must then present a
	// client certificate they sign (the controller's sidecar.tls.certFile), or the TLS handshake
	// fails before any call. It is read at start. Default: none, no client certificate is asked
	// for; the token authenticates the caller.
	ClientCAFile string

	// Insecure serves NodeHealer without TLS, for tests and demos only: tokens then cross the
	// network in clear text. Default: false.
	Insecure bool

	// TokenAudience is the base of the audience the controller's token must carry: the sidecar
	// accepts only tokens for healerv1alpha1.NodeTokenAudience(TokenAudience, NodeName), which the
	// controller requests for this node alone, so that a token captured on another node is
	// refused here. The TokenReview asks for that audience. Default:
	// healerv1alpha1.DefaultTokenAudience.
	TokenAudience string

	// AllowedIdentities are the user names (from the TokenReview) allowed to call. Default:
	// [DefaultAllowedIdentity].
	AllowedIdentities []string

	// AuthCacheTTL is how long an accepted token is trusted before it is reviewed again.
	// Default: DefaultAuthCacheTTL.
	AuthCacheTTL time.Duration

	// AuthFailureCacheTTL is how long a rejected token stays rejected before it is reviewed
	// again. Default: DefaultAuthFailureCacheTTL.
	AuthFailureCacheTTL time.Duration

	// AuthCacheSize bounds the number of cached TokenReview results. Default: 1024.
	AuthCacheSize int

	// MaxMessageSize bounds every gRPC message received or sent, from the controller and from
	// the driver, in bytes. Default: DefaultMaxMessageSize (4 MiB).
	MaxMessageSize int

	// DriverTimeout bounds each call to the driver whose caller sent no deadline; a caller's
	// deadline, shorter or longer, is kept. Default: DefaultDriverTimeout.
	DriverTimeout time.Duration

	// ShutdownTimeout bounds how long calls in flight may finish once Start's context is done;
	// then they are cut off. Default: DefaultShutdownTimeout.
	ShutdownTimeout time.Duration

	// KubeletDir is kubelet's root folder, from which staging paths are derived. Default:
	// DefaultKubeletDir.
	KubeletDir string

	// StatTimeout bounds each stat of a mount when the sidecar probes a volume itself (for a
	// driver that does not advertise PROBE): the stat runs in a child process killed at the
	// deadline, and the mount is reported hung. Zero or less: 5s.
	StatTimeout time.Duration

	// StatCommand is the program, and its first arguments, that the sidecar starts to stat a
	// mount; it must run nodeprobe.StatMain with the path as its last argument. Default: this
	// program with nodeprobe.StatArg, which cmd/healer-sidecar handles.
	StatCommand []string

	// ContainerRuntimeEndpoint is the node's container runtime socket (CRI), "unix:///path" or
	// "/path", such as unix:///run/containerd/containerd.sock. When set, the sidecar serves
	// RestartContainers: it stops the running containers of a pod that mount a volume's publish
	// target, for kubelet to start them again with the repaired mount. The socket gives power
	// over every container of the node (docs/operations.md, threat model). Default: none,
	// RestartContainers answers UNIMPLEMENTED and the capabilities say container_restart=false.
	ContainerRuntimeEndpoint string

	// ContainerStopGracePeriod is the most a container that RestartContainers stops is given
	// between its stop signal and SIGKILL; the caller's deadline may leave it less. Whole
	// seconds, at least 1s. Default: restart.DefaultStopGracePeriod.
	ContainerStopGracePeriod time.Duration

	// SecretCacheTTL is how long a node-stage Secret read from the API server is used before it
	// is read again: a rotated Secret reaches the driver within this time. Default:
	// DefaultSecretCacheTTL.
	SecretCacheTTL time.Duration

	// MetricsAddress serves /metrics, /healthz and /readyz over HTTP. "0" turns the server off
	// (the metrics are still recorded in Registry). Default: DefaultMetricsAddress.
	MetricsAddress string

	// Registry receives the sidecar's metrics and is what /metrics serves. Default: a new
	// registry of its own.
	Registry *prometheus.Registry

	// RegisterBackoff is the first wait between two failed CSIAddonsNode registrations; the wait
	// doubles up to RegisterMaxBackoff. Default: 500ms.
	RegisterBackoff time.Duration

	// RegisterMaxBackoff caps the wait between failed registrations. Default: 30s.
	RegisterMaxBackoff time.Duration

	// Clock tells time for caches, backoffs and the restart marker. Default: the real clock.
	Clock clock.WithTicker
}

func (o *Options) setDefaults() error {
	var missing []string
	if o.KubeConfig == nil {
		missing = append(missing, "KubeConfig")
	}
	if o.NodeName == "" {
		missing = append(missing, "NodeName (--node-name or NODE_NAME)")
	}
	if o.Namespace == "" {
		missing = append(missing, "Namespace (--namespace or POD_NAMESPACE)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s required", ErrInvalidOptions, strings.Join(missing, ", "))
	}
	var err error
	switch {
	case o.CSIEndpoint == "" && o.DriverName == "":
		if o.DriverEndpoint == "" {
			o.DriverEndpoint = DefaultDriverEndpoint
		}
		if o.DriverEndpoint, err = unixTarget("driver endpoint (--driver-endpoint)", o.DriverEndpoint, "unix:///csi/csi-addons.sock"); err != nil {
			return err
		}
	case o.DriverEndpoint != "":
		return fmt.Errorf("%w: DriverEndpoint (--driver-endpoint) %q names a CSI-Addons socket, and CSIEndpoint (--csi-endpoint) or DriverName (--driver-name) says the driver has none; give one or the other",
			ErrInvalidOptions, o.DriverEndpoint)
	}
	if o.CSIEndpoint != "" {
		if o.CSIEndpoint, err = unixTarget("CSI endpoint (--csi-endpoint)", o.CSIEndpoint, "unix:///csi/csi.sock"); err != nil {
			return err
		}
	}
	if o.DriverName != "" {
		msgs := validation.IsDNS1123Subdomain(strings.ToLower(o.DriverName))
		if len(o.DriverName) > 63 {
			msgs = append(msgs, "it is longer than 63 characters")
		}
		if len(msgs) > 0 {
			return fmt.Errorf("%w: DriverName (--driver-name) %q is not a CSI driver name (at most 63 characters, a DNS subdomain): %s",
				ErrInvalidOptions, o.DriverName, strings.Join(msgs, "; "))
		}
	}
	if o.ContainerRuntimeEndpoint != "" {
		if o.ContainerRuntimeEndpoint, err = unixTarget("container runtime endpoint (--container-runtime-endpoint)", o.ContainerRuntimeEndpoint, "unix:///run/containerd/containerd.sock"); err != nil {
			return err
		}
	}
	if o.ListenAddress == "" {
		o.ListenAddress = DefaultListenAddress
	}
	if _, _, err := net.SplitHostPort(o.ListenAddress); err != nil {
		return fmt.Errorf("%w: listen address %q: %w (want host:port, :port or [ipv6]:port)", ErrInvalidOptions, o.ListenAddress, err)
	}
	if !o.Insecure && (o.TLSCertFile == "" || o.TLSKeyFile == "") {
		return fmt.Errorf("%w: TLSCertFile and TLSKeyFile (--tls-cert-file, --tls-key-file) are required unless Insecure (--insecure) is set", ErrInvalidOptions)
	}
	if o.Insecure && o.ClientCAFile != "" {
		return fmt.Errorf("%w: Insecure (--insecure) and ClientCAFile (--client-ca-file) were both given; client certificates need TLS", ErrInvalidOptions)
	}
	if o.Insecure && o.TLSServerName != "" {
		return fmt.Errorf("%w: Insecure (--insecure) and TLSServerName (--tls-server-name) were both given; a server name needs TLS", ErrInvalidOptions)
	}
	if o.Insecure && (o.TLSCertFile != "" || o.TLSKeyFile != "") {
		return fmt.Errorf("%w: Insecure (--insecure) and a TLS certificate were both given; choose one", ErrInvalidOptions)
	}
	if o.TokenAudience == "" {
		o.TokenAudience = healerv1alpha1.DefaultTokenAudience
	}
	if len(o.AllowedIdentities) == 0 {
		o.AllowedIdentities = []string{DefaultAllowedIdentity}
	}
	for _, id := range o.AllowedIdentities {
		if strings.TrimSpace(id) == "" {
			return fmt.Errorf("%w: AllowedIdentities (--allowed-identities) holds an empty name", ErrInvalidOptions)
		}
	}
	durations := []struct {
		name  string
		value *time.Duration
		def   time.Duration
	}{
		{"AuthCacheTTL", &o.AuthCacheTTL, DefaultAuthCacheTTL},
		{"AuthFailureCacheTTL", &o.AuthFailureCacheTTL, DefaultAuthFailureCacheTTL},
		{"DriverTimeout (--driver-timeout)", &o.DriverTimeout, DefaultDriverTimeout},
		{"ShutdownTimeout (--shutdown-timeout)", &o.ShutdownTimeout, DefaultShutdownTimeout},
		{"SecretCacheTTL (--secret-cache-ttl)", &o.SecretCacheTTL, DefaultSecretCacheTTL},
		{"ContainerStopGracePeriod (--container-stop-grace-period)", &o.ContainerStopGracePeriod, restart.DefaultStopGracePeriod},
		{"RegisterBackoff", &o.RegisterBackoff, 500 * time.Millisecond},
		{"RegisterMaxBackoff", &o.RegisterMaxBackoff, 30 * time.Second},
	}
	for _, d := range durations {
		if *d.value < 0 {
			return fmt.Errorf("%w: %s must not be negative, got %s", ErrInvalidOptions, d.name, *d.value)
		}
		if *d.value == 0 {
			*d.value = d.def
		}
	}
	switch {
	case o.CSIAddonsSidecarWait < 0:
		return fmt.Errorf("%w: CSIAddonsSidecarWait (--csiaddons-sidecar-wait) must not be negative, got %s", ErrInvalidOptions, o.CSIAddonsSidecarWait)
	case o.CSIAddonsSidecarWait > 0 && (o.CSIAddonsNodeName == "" || o.PodUID == ""):
		return fmt.Errorf("%w: CSIAddonsSidecarWait (--csiaddons-sidecar-wait) needs CSIAddonsNodeName (--csiaddonsnode-name) and PodUID (--pod-uid): it waits for the csi-addons sidecar of this pod to write that object", ErrInvalidOptions)
	}
	if o.ContainerStopGracePeriod < time.Second {
		return fmt.Errorf("%w: ContainerStopGracePeriod (--container-stop-grace-period) must be at least 1s, as the container runtime counts it in whole seconds; got %s", ErrInvalidOptions, o.ContainerStopGracePeriod)
	}
	if o.AuthCacheSize == 0 {
		o.AuthCacheSize = 1024
	}
	if o.AuthCacheSize < 0 {
		return fmt.Errorf("%w: AuthCacheSize must not be negative, got %d", ErrInvalidOptions, o.AuthCacheSize)
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = DefaultMaxMessageSize
	}
	if o.MaxMessageSize < 0 {
		return fmt.Errorf("%w: MaxMessageSize must not be negative, got %d", ErrInvalidOptions, o.MaxMessageSize)
	}
	if o.KubeletDir == "" {
		o.KubeletDir = DefaultKubeletDir
	}
	if !filepath.IsAbs(o.KubeletDir) {
		return fmt.Errorf("%w: KubeletDir (--kubelet-dir) must be an absolute path, got %q", ErrInvalidOptions, o.KubeletDir)
	}
	if o.MetricsAddress == "" {
		o.MetricsAddress = DefaultMetricsAddress
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return nil
}

// unixTarget turns the endpoint of a local socket (what names it, for errors) into a gRPC
// target: "unix:///path", or a bare absolute path, which gets the scheme.
func unixTarget(what, endpoint, example string) (string, error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		if !filepath.IsAbs(endpoint) {
			return "", fmt.Errorf("%w: %s %q must look like %s", ErrInvalidOptions, what, endpoint, example)
		}
		path = endpoint
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%w: %s %q must name an absolute socket path, as in %s", ErrInvalidOptions, what, endpoint, example)
	}
	return "unix://" + path, nil
}

// advertiseAddress is the host:port the controller dials, from the options and the port the
// listener got.
func advertiseAddress(o *Options, listened net.Addr) (string, error) {
	_, port, err := net.SplitHostPort(listened.String())
	if err != nil {
		return "", fmt.Errorf("listening address %s: %w", listened, err)
	}
	if a := o.AdvertiseAddress; a != "" {
		if _, _, err := net.SplitHostPort(a); err == nil {
			return a, nil
		}
		return net.JoinHostPort(strings.Trim(a, "[]"), port), nil
	}
	if o.PodIP != "" {
		return net.JoinHostPort(o.PodIP, port), nil
	}
	host, _, _ := net.SplitHostPort(o.ListenAddress)
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return net.JoinHostPort(host, port), nil
	}
	return "", fmt.Errorf("%w: no address to advertise: set AdvertiseAddress (--advertise-address) or PodIP (POD_IP from the downward API), or listen on one address", ErrInvalidOptions)
}
