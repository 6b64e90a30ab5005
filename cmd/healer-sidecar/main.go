// Command healer-sidecar runs in a CSI node plugin pod beside the driver. It serves the
// volume-healer NodeHealer service to the controller over TCP with TLS and relays each call to
// the driver's Healer service on its CSI-Addons UNIX socket. See docs/sidecar.md.
//
// It parses flags and hands over to package sidecar; it must not import the controller's packages
// (scheduler, policy, probe, healer) nor test/.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/logging"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
	"github.com/volume-healer/volume-healer/sidecar/restart"
	"github.com/volume-healer/volume-healer/version"
)

func main() {
	// The sidecar stats mounts in children of its own, this program started again (nodeprobe).
	if len(os.Args) > 1 && os.Args[1] == nodeprobe.StatArg {
		os.Exit(nodeprobe.StatMain(os.Args[2:], os.Stdout))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "healer-sidecar:", err)
		os.Exit(1)
	}
}

// run parses the command line, sets up logging before anything logs, and runs the sidecar until
// ctx ends.
func run(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) error {
	cfg, err := parse(args, env)
	if errors.Is(err, pflag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if cfg.showVersion {
		_, err := fmt.Fprintln(stdout, version.Line("healer-sidecar"))
		return err
	}
	if err := cfg.logging.Apply(stdout, stderr); err != nil {
		return err
	}
	defer klog.Flush()
	logger := klog.Background()
	// controller-runtime's parts (the certificate watcher, the client) log through klog too.
	ctrllog.SetLogger(logger)
	logger.Info("Starting", "version", version.Get().String(), "node", cfg.opts.NodeName)
	return sidecar.Run(ctx, cfg.opts, cfg.kubeconfig)
}

// config is what the command line gives: the sidecar's options, and how to reach the API
// server.
type config struct {
	opts        sidecar.Options
	kubeconfig  string
	showVersion bool
	// logging are -v, --vmodule, --logging-format and the other logging flags.
	logging *logging.Options
}

// parse reads the flags; the downward API's environment variables fill what the flags leave
// empty.
func parse(args []string, env func(string) (string, bool)) (*config, error) {
	cfg := &config{logging: logging.NewOptions()}
	o := &cfg.opts
	fs := pflag.NewFlagSet("healer-sidecar", pflag.ContinueOnError)
	fs.BoolVar(&cfg.showVersion, "version", false, "Print the version, the git commit and the Go version of this binary, and exit.")
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "Path of a kubeconfig file; empty uses the pod's ServiceAccount (in-cluster).")
	fs.StringVar(&o.DriverEndpoint, "driver-endpoint", sidecar.DefaultDriverEndpoint, "The driver's CSI-Addons UNIX socket. Not with --csi-endpoint or --driver-name.")
	fs.StringVar(&o.CSIEndpoint, "csi-endpoint", "", "For a driver without a CSI-Addons socket: its CSI UNIX socket (such as unix:///csi/csi.sock), where the sidecar asks its name (GetPluginInfo) and sees it restart; the sidecar probes its volumes itself (tier none).")
	fs.StringVar(&o.DriverName, "driver-name", "", "For a driver without a CSI-Addons socket: its CSI name. With --csi-endpoint, the name the driver must answer; alone, the sidecar uses no socket of the driver and sees no restart of its container alone.")
	fs.StringVar(&o.NodeName, "node-name", "", "The Node this pod runs on. Default: $NODE_NAME.")
	fs.StringVar(&o.Namespace, "namespace", "", "Namespace of the CSIAddonsNode (the pod's namespace). Default: $POD_NAMESPACE.")
	fs.StringVar(&o.PodUID, "pod-uid", "", "UID of this pod, part of the restart marker. Default: $POD_UID.")
	fs.StringVar(&o.PodIP, "pod-ip", "", "IP of this pod, for the advertised endpoint. Default: $POD_IP.")
	fs.StringVar(&o.ListenAddress, "listen", sidecar.DefaultListenAddress, "TCP address to serve NodeHealer on (host:port, :port, [ipv6]:port).")
	fs.StringVar(&o.AdvertiseAddress, "advertise-address", "", "host[:port] the controller dials, written to the CSIAddonsNode. Default: the pod IP and the listening port.")
	fs.DurationVar(&o.CSIAddonsSidecarWait, "csiaddons-sidecar-wait", 0, "With a csi-addons sidecar in the pod: how long a start waits for it to write --csiaddonsnode-name (its createdByPodUID naming --pod-uid) before this sidecar writes its own annotations there, so that the two sidecars' first writes do not conflict. Default: 0, no wait.")
	fs.StringVar(&o.CSIAddonsNodeName, "csiaddonsnode-name", "", "CSIAddonsNode to create or update. Default: the one in --namespace for this driver and node, else <node>-<driver with dots replaced by dashes>.")
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", "", "PEM serving certificate; read again when it changes.")
	fs.StringVar(&o.TLSKeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file.")
	fs.StringVar(&o.TLSCertificateRequestDir, "tls-cert-dir", "", "Ask for the serving certificate with a CertificateSigningRequest (signer "+healerv1alpha1.SidecarSignerName+"), keep its key and certificate in this folder (an emptyDir) and renew it before it expires; needs --tls-server-name, excludes --tls-cert-file and --tls-key-file.")
	fs.DurationVar(&o.TLSCertificateValidity, "tls-cert-validity", 0, "With --tls-cert-dir, the validity asked for (at least 10m); 0 takes the controller's (24h by default).")
	fs.StringVar(&o.TLSServerName, "tls-server-name", "", "Base of the name the controller expects (its sidecar.tls.serverName): the certificate must be valid for <node-name>.<base>, or the sidecar does not start.")
	fs.StringVar(&o.ClientCAFile, "client-ca-file", "", "PEM CA bundle: when set, callers must present a client certificate it signs (the controller's sidecar.tls.certFile).")
	fs.BoolVar(&o.Insecure, "insecure", false, "Serve without TLS. For tests and demos only: tokens travel in clear text.")
	fs.StringVar(&o.TokenAudience, "token-audience", healerv1alpha1.DefaultTokenAudience, "Base of the audience the controller's token must carry: the sidecar accepts only tokens for <base>/node/<--node-name>.")
	fs.StringSliceVar(&o.AllowedIdentities, "allowed-identities", []string{sidecar.DefaultAllowedIdentity}, "User names (from TokenReview) allowed to call, comma separated.")
	fs.DurationVar(&o.AuthCacheTTL, "auth-cache-ttl", sidecar.DefaultAuthCacheTTL, "How long an accepted token is trusted before it is reviewed again.")
	fs.DurationVar(&o.AuthFailureCacheTTL, "auth-failure-cache-ttl", sidecar.DefaultAuthFailureCacheTTL, "How long a rejected token stays rejected before it is reviewed again.")
	fs.IntVar(&o.MaxMessageSize, "max-message-size", sidecar.DefaultMaxMessageSize, "Largest gRPC message, in bytes, accepted or sent, toward the controller and the driver.")
	fs.DurationVar(&o.DriverTimeout, "driver-timeout", sidecar.DefaultDriverTimeout, "Timeout of each call to the driver that comes without a deadline; a call of the controller keeps its deadline.")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", sidecar.DefaultShutdownTimeout, "On SIGTERM, how long calls in flight may still finish.")
	fs.DurationVar(&o.SecretCacheTTL, "secret-cache-ttl", sidecar.DefaultSecretCacheTTL, "How long a node-stage Secret read is used; a rotated Secret reaches the driver within this time.")
	fs.StringVar(&o.KubeletDir, "kubelet-dir", sidecar.DefaultKubeletDir, "kubelet's root folder, the base of staging paths; read-only, the sidecar reads kubelet's volume records there to probe and list the volumes of a driver that does not.")
	fs.DurationVar(&o.StatTimeout, "stat-timeout", 5*time.Second, "When the sidecar probes a volume itself, how long a stat of a mount may take before the mount is reported hung.")
	fs.StringVar(&o.ContainerRuntimeEndpoint, "container-runtime-endpoint", "", "The node's container runtime socket (CRI), such as unix:///run/containerd/containerd.sock: "+
		"lets the sidecar restart in place the containers of a pod that mount a healed volume (RestartContainers). Empty: off. "+
		"The socket gives power over every container of the node: see the threat model in docs/operations.md. Default: $CONTAINER_RUNTIME_ENDPOINT, as crictl reads it.")
	fs.DurationVar(&o.ContainerStopGracePeriod, "container-stop-grace-period", restart.DefaultStopGracePeriod, "The most a container that RestartContainers stops is given between its stop signal and SIGKILL (whole seconds); the controller's deadline may leave it less.")
	fs.StringVar(&o.MetricsAddress, "metrics-address", sidecar.DefaultMetricsAddress, "Address of /metrics, /healthz and /readyz; 0 turns it off.")

	cfg.logging.AddFlags(fs)

	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if (o.CSIEndpoint != "" || o.DriverName != "") && !fs.Changed("driver-endpoint") {
		// The default CSI-Addons socket is for drivers that have one.
		o.DriverEndpoint = ""
	}
	for _, f := range []struct {
		value *string
		env   string
	}{
		{&o.NodeName, "NODE_NAME"},
		{&o.Namespace, "POD_NAMESPACE"},
		{&o.PodUID, "POD_UID"},
		{&o.PodIP, "POD_IP"},
		// deploy/components/container-restart sets it: a patch cannot add a flag to a container
		// whose place among the DaemonSet's containers it does not know.
		{&o.ContainerRuntimeEndpoint, "CONTAINER_RUNTIME_ENDPOINT"},
	} {
		if *f.value == "" {
			*f.value, _ = env(f.env)
		}
	}
	return cfg, nil
}
