// Package config turns built-in defaults, one YAML file, VOLUME_HEALER_* environment variables and
// command-line flags into one validated Config. It is the only package that reads viper; the rest
// of volume-healer receives the typed struct.
//
// Precedence, lowest first: defaults, the file, the environment, flags. Every key is described
// once in a table (keys.go) that drives flag registration, environment binding, file checking,
// printing and the reference in docs/configuration.md, so they cannot disagree.
//
// It is a leaf: of volume-healer it imports only api/annotations (the policy label) and
// api/healer/v1alpha1 (the default audience of the sidecar token), themselves leaves, so that
// every binary can use it. It must not import the pipeline's stages (scheduler, policy, probe,
// healer) nor cmd/ or test/.
package config

import (
	"time"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// Config is the controller's effective configuration. The zero value is not useful; start from
// Default or Load.
type Config struct {
	// Kubeconfig is the path to a kubeconfig file used to reach the API server. Empty means the
	// in-cluster configuration or $KUBECONFIG. Default "".
	Kubeconfig string
	// LeaderElection controls which replica acts.
	LeaderElection LeaderElection
	// Metrics configures the Prometheus endpoint.
	Metrics Metrics
	// Health configures the liveness and readiness endpoints.
	Health Health
	// Policy says where policies come from and how long one evaluation may take.
	Policy Policy
	// Webhook configures the validating admission webhook of policy ConfigMaps.
	Webhook Webhook
	// PropagationWebhook configures the mutating admission webhook of pods' mount propagation.
	PropagationWebhook PropagationWebhook
	// Schedule configures periodic sweeps.
	Schedule Schedule
	// Restart configures sweeps triggered by a node plugin restart.
	Restart Restart
	// ManualSweeps bounds the sweeps requested through annotations.
	ManualSweeps ManualSweeps
	// Budgets limits the probe and heal calls in flight.
	Budgets Budgets
	// Timeouts bounds each call to a sidecar.
	Timeouts Timeouts
	// StagedList bounds one listing of a node's staged volumes.
	StagedList StagedList
	// Backoff spaces out retries of a volume whose calls fail.
	Backoff Backoff
	// DryRun makes the controller decide and report what it would heal without sending heal
	// calls. Default false.
	DryRun bool
	// Remediation restarts, by eviction, the pods that still see a healed volume's dead mount.
	Remediation Remediation
	// Sidecar configures how the controller connects and authenticates to the sidecars.
	Sidecar Sidecar
	// Log configures logging.
	Log Log
}

// LeaderElection configures the Lease that makes one replica the active one.
type LeaderElection struct {
	// Enabled turns leader election on; with it off every replica acts, so run exactly one.
	// Default true.
	Enabled bool
	// Namespace holds the Lease; a DNS-1123 label. Default "volume-healer".
	Namespace string
	// LeaseName names the Lease; a DNS-1123 subdomain. Default "volume-healer".
	LeaseName string
	// LeaseDuration is how long other replicas wait after the last renewal before taking over;
	// every call of the leader ends CallMargin before that. Must exceed RenewDeadline, and be
	// whole seconds (the Lease records it in seconds). Default 60s.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader keeps trying to renew before it steps down. Must
	// exceed RetryPeriod. Default 40s.
	RenewDeadline time.Duration
	// RetryPeriod is the wait between attempts to acquire or renew the Lease. Default 5s.
	RetryPeriod time.Duration
	// CallMargin is how long before another replica could take the Lease over every call of
	// the leader must have ended. It covers clocks that run at slightly different rates, the
	// network delay of a call's deadline on its way to the sidecar and the driver, and the time
	// they take to stop once it passes. Default 2s.
	CallMargin time.Duration
}

// Metrics configures the Prometheus metrics endpoint.
type Metrics struct {
	// BindAddress is the host:port the endpoint listens on; "0" disables it. Default ":8080".
	BindAddress string
}

// Health configures the liveness and readiness endpoints.
type Health struct {
	// BindAddress is the host:port the endpoints listen on. Default ":8081".
	BindAddress string
}

// Policy says which ConfigMaps hold policies and how long one evaluation may run.
type Policy struct {
	// Namespace is watched for policy ConfigMaps. Default "volume-healer".
	Namespace string
	// LabelSelector picks the policy ConfigMaps in Namespace; when none match, the built-in
	// default policy applies. Default "volume-healer.io/policy=rego", which also selects the
	// ConfigMaps labelled healer.csiaddons.openshift.io/policy=rego for volume-healer 0.1.0.
	LabelSelector string
	// EvaluationTimeout bounds one policy evaluation; a slower evaluation counts as a policy
	// failure. Default 1s.
	EvaluationTimeout time.Duration
}

// Webhook configures the validating admission webhook that refuses a policy ConfigMap the
// controller would reject before it is stored. Every replica serves it over HTTPS; the
// ValidatingWebhookConfiguration that sends it the policy ConfigMaps comes with deploy/.
type Webhook struct {
	// Enabled serves the webhook. Default false.
	Enabled bool
	// BindAddress is the host:port the webhook listens on. Default ":9443".
	BindAddress string
	// CertFile is the PEM serving certificate, read again when it changes. Required when
	// Enabled. Default "".
	CertFile string
	// KeyFile is the PEM private key of CertFile, read again when it changes. Required when
	// Enabled. Default "".
	KeyFile string
}

// PropagationWebhook configures the mutating admission webhook that sets mountPropagation
// HostToContainer on the claim volumes of pods being created, where the policy's propagation rule
// asks for it (docs/policy.md), so that a heal of the node's mount reaches running containers
// without a restart. It is served beside the policy webhook, on webhook.bindAddress with its
// certificate; the MutatingWebhookConfiguration comes with deploy/, off by default.
type PropagationWebhook struct {
	// Enabled serves the webhook; it needs webhook.enabled. Default false.
	Enabled bool
}

// Schedule configures periodic sweeps. Specs use robfig/cron/v3's standard syntax: five fields
// ("0 */6 * * *") or a descriptor ("@hourly", "@every 1h30m"), optionally prefixed by
// "CRON_TZ=<zone> ".
type Schedule struct {
	// Default is the cron spec for StorageClasses without an entry in StorageClasses; empty
	// means no periodic sweep for them. Default "0 */6 * * *" (every six hours).
	Default string
	// StorageClasses maps a StorageClass name to its own cron spec, replacing Default for that
	// class; an empty spec turns periodic sweeps off for it. Default empty.
	StorageClasses map[string]string
	// Stagger is the longest random delay added per node when a schedule fires, so that one
	// schedule does not reach every node in the same second; 0 turns staggering off.
	// Default 5m.
	Stagger time.Duration
}

// Restart configures sweeps triggered by a node plugin restart.
type Restart struct {
	// Debounce is the shortest time between two restart sweeps of one node's driver: a restart
	// is swept at once, and a plugin that restarts several times in a row within the window is
	// swept once more at its end. Default 2s.
	Debounce time.Duration
	// SweepCSIAddonsSidecarRestarts sweeps when only the csi-addons sidecar's lastUpdatedAt
	// changed (same pod, same healer sidecar start): a restart of that container alone, which
	// kills no mounter. Default false.
	SweepCSIAddonsSidecarRestarts bool
}

// Remediation configures the eviction of the pods that still see a volume's dead mount after its
// heal (their mount propagation is None, so the repaired mount cannot reach them). It needs the
// RBAC that deploy/ grants only when remediation is turned on there.
type Remediation struct {
	// Enabled evicts the pods; with it off the controller only tells the operator, by the Event
	// VolumePodsMustRestart on the PVC, to restart them. Default false.
	Enabled bool
	// DryRun logs and records (Event EvictionDryRun) the pods that would be evicted, and evicts
	// none. The controller's own dryRun implies it. Default false.
	DryRun bool
	// EvictionsPerMinute is the most evictions in any minute across the cluster. Default 10.
	EvictionsPerMinute int
	// EvictionsPerNamespacePerMinute is the most evictions in any minute in one namespace; at
	// most EvictionsPerMinute. Default 5.
	EvictionsPerNamespacePerMinute int
	// ReprobeAfter is how long after the last of a volume's pods on its dead mount was evicted
	// the volume is probed again, for the replacement pods to start and the dead-mount report to
	// clear. Default 30s.
	ReprobeAfter time.Duration
}

// ManualSweeps bounds the sweeps requested by annotation: whoever may update a PVC may request
// one of its volume. An object has at most one sweep in flight and one waiting, whatever the
// number of requests; these bound how many start.
type ManualSweeps struct {
	// PerMinute is how many requested sweeps may start in any minute across the cluster.
	// Default 20.
	PerMinute int
	// PerNamespacePerMinute is how many sweeps requested on one namespace's objects may start in
	// any minute; at most PerMinute. Default 5.
	PerNamespacePerMinute int
}

// Budgets limits the probe and heal calls in flight at once. Every limit is at least 1, and
// PerNode <= PerDriver <= Global, since a larger inner limit could never be reached. A single
// volume never has more than one call in flight; that limit is fixed and not configurable.
type Budgets struct {
	// Global limits calls in flight across the whole cluster. Default 64.
	Global int
	// PerDriver limits calls in flight to one CSI driver, across all nodes. Default 32.
	PerDriver int
	// PerNode limits calls in flight to one node. Default 4.
	PerNode int
}

// Timeouts bounds each call to a sidecar. With leader election enabled each is at most
// LeaderElection.LeaseDuration - RetryPeriod - CallMargin: the least time a call has before
// another replica could take the Lease over, which ends every call of the leader.
type Timeouts struct {
	// Probe is the deadline of one probe call. Default 10s.
	Probe time.Duration
	// Heal is the deadline of one heal call. Default 45s.
	Heal time.Duration
}

// StagedList bounds one listing of the volumes a sidecar's driver has staged on its node (drivers
// without VolumeAttachments): a sidecar that sends more, or takes longer, fails that node's
// listing, and the sweep goes on with the other nodes.
type StagedList struct {
	// MaxVolumes is the most volumes one listing may return, all its pages together. Default
	// 10000.
	MaxVolumes int
	// MaxBytes is the most bytes on the wire of all the pages of one listing together. Default
	// 4194304 (4 MiB).
	MaxBytes int
	// Timeout bounds one listing, all its pages together; each page is also bounded by
	// Timeouts.Probe. Default 1m.
	Timeout time.Duration
}

// Backoff spaces out retries of a volume whose probe or heal failed: the delay starts at Base
// and doubles with each consecutive failure, up to Max.
type Backoff struct {
	// Base is the delay after the first failure. Default 5s.
	Base time.Duration
	// Max caps the delay; at least Base. Default 10m.
	Max time.Duration
}

// Sidecar configures connections to the healer sidecars in the node plugin pods.
type Sidecar struct {
	// TLS secures the connection.
	TLS SidecarTLS
	// Auth identifies the controller to the sidecar.
	Auth SidecarAuth
}

// SidecarTLS configures TLS towards the sidecars.
type SidecarTLS struct {
	// Enabled turns TLS on; off means plaintext gRPC. Default true.
	Enabled bool
	// CAFile is a PEM bundle of the CAs that sign the sidecars' serving certificates. Required
	// when Enabled is true and InsecureSkipVerify is false. Default "".
	CAFile string
	// CertFile is a PEM client certificate presented to the sidecars, read again when it or
	// KeyFile changes; set together with KeyFile, or leave both empty to present none. Default "".
	CertFile string
	// KeyFile is the PEM private key of CertFile. Default "".
	KeyFile string
	// ServerName is the base of the names the sidecars' certificates must carry: the sidecar of
	// node N must present a certificate for "N.<ServerName>", so that a sidecar cannot answer
	// for another node. Empty means the host part of each sidecar's address, for every node.
	// Default "".
	ServerName string
	// InsecureSkipVerify accepts any sidecar certificate. For tests only. Default false.
	InsecureSkipVerify bool
	// Signer signs the sidecars' serving certificates that they ask for with a
	// CertificateSigningRequest (their --tls-cert-dir), and trusts the CA it signs them with.
	Signer SidecarSigner
}

// SidecarSigner configures the controller's signer of the sidecars' certificates (signerName
// volume-healer.io/sidecar-serving): it signs a request only when its requester is one of
// Requesters, with a token bound to a pod that runs on the node the request names, and the request
// names that node's sidecar.tls.serverName alone.
type SidecarSigner struct {
	// Enabled turns the signer on. Default false.
	Enabled bool
	// CASecret is "<namespace>/<name>" of the kubernetes.io/tls Secret holding the CA; the
	// controller creates it, with a new CA, when it is missing. Default "".
	CASecret string
	// Requesters are the node plugins' ServiceAccounts allowed to ask, as user names
	// ("system:serviceaccount:<namespace>:<name>") separated by commas. Default "".
	Requesters string
	// Validity is how long a signed certificate is valid; the sidecars renew theirs two thirds
	// into it. Default 24h.
	Validity time.Duration
}

// SidecarAuth configures the credential the controller presents to the sidecars, which check it
// with a TokenReview.
type SidecarAuth struct {
	// TokenFile holds a token of the controller's ServiceAccount. It is never sent to a sidecar:
	// the controller reads whose it is and requests, through the TokenRequest API, a token of that
	// ServiceAccount for each node's sidecars alone. Default
	// "/var/run/secrets/kubernetes.io/serviceaccount/token".
	TokenFile string
	// Audience is the base of the sidecars' token audiences: the token for the sidecars of node N
	// is for healerv1alpha1.NodeTokenAudience(Audience, N) alone. Default
	// healerv1alpha1.DefaultTokenAudience ("volume-healer-sidecar").
	Audience string
}

// Log configures logging.
type Log struct {
	// Verbosity is the klog verbosity, 0 (quiet) to 10 (everything). Default 0.
	Verbosity int
	// Format is the log format, "text" or "json". Default "text".
	Format string
}

// Default returns the built-in defaults. They do not validate on their own: Sidecar.TLS.CAFile
// has no sensible default and must be set (or TLS verification relaxed) by the operator.
func Default() Config {
	return Config{
		LeaderElection: LeaderElection{
			Enabled:       true,
			Namespace:     "volume-healer",
			LeaseName:     "volume-healer",
			LeaseDuration: 60 * time.Second,
			RenewDeadline: 40 * time.Second,
			RetryPeriod:   5 * time.Second,
			CallMargin:    2 * time.Second,
		},
		Metrics: Metrics{BindAddress: ":8080"},
		Health:  Health{BindAddress: ":8081"},
		Policy: Policy{
			Namespace:         "volume-healer",
			LabelSelector:     annotations.PolicySelector,
			EvaluationTimeout: time.Second,
		},
		Webhook: Webhook{BindAddress: ":9443"},
		Schedule: Schedule{
			Default:        "0 */6 * * *",
			StorageClasses: map[string]string{},
			Stagger:        5 * time.Minute,
		},
		Restart:      Restart{Debounce: 2 * time.Second},
		ManualSweeps: ManualSweeps{PerMinute: 20, PerNamespacePerMinute: 5},
		Budgets:      Budgets{Global: 64, PerDriver: 32, PerNode: 4},
		Remediation:  Remediation{EvictionsPerMinute: 10, EvictionsPerNamespacePerMinute: 5, ReprobeAfter: 30 * time.Second},
		Timeouts:     Timeouts{Probe: 10 * time.Second, Heal: 45 * time.Second},
		StagedList:   StagedList{MaxVolumes: 10000, MaxBytes: 4 << 20, Timeout: time.Minute},
		Backoff:      Backoff{Base: 5 * time.Second, Max: 10 * time.Minute},
		Sidecar: Sidecar{
			TLS:  SidecarTLS{Enabled: true, Signer: SidecarSigner{Validity: 24 * time.Hour}},
			Auth: SidecarAuth{TokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token", Audience: healerv1alpha1.DefaultTokenAudience},
		},
		Log: Log{Format: "text"},
	}
}
