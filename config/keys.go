package config

import (
	"strings"
	"time"
	"unicode"
)

const (
	// envPrefix starts every environment variable volume-healer reads.
	envPrefix = "VOLUME_HEALER_"
	// configFlag names the flag that points at the configuration file.
	configFlag = "config"
	// configEnv names the environment variable that points at the configuration file.
	configEnv = envPrefix + "CONFIG"
)

// setting describes one configuration key. The table below is the only list of keys: flags,
// environment variables, the file schema, YAML output and the reference documentation are all
// derived from it.
type setting struct {
	// path is the key as written in the file: dot-separated, camelCase.
	path string
	// field returns a pointer to the Config field holding the value; its type (*string, *bool,
	// *int, *time.Duration or *map[string]string) decides how the value is parsed.
	field func(*Config) any
	// help says what the key means, for --help and the reference documentation.
	help string
	// allowed says which values pass validation, in words, for the reference documentation.
	allowed string
}

// settings lists every key in the order used for --help, YAML output and the documentation.
var settings = []setting{
	{
		path:    "kubeconfig",
		field:   func(c *Config) any { return &c.Kubeconfig },
		help:    "Path to a kubeconfig file for reaching the API server; empty uses the in-cluster configuration or $KUBECONFIG.",
		allowed: "a path, or empty",
	},
	{
		path:    "leaderElection.enabled",
		field:   func(c *Config) any { return &c.LeaderElection.Enabled },
		help:    "Elect a leader so that only one replica acts; with it off, run exactly one replica.",
		allowed: "true or false",
	},
	{
		path:    "leaderElection.namespace",
		field:   func(c *Config) any { return &c.LeaderElection.Namespace },
		help:    "Namespace of the leader election Lease.",
		allowed: "a DNS-1123 label (checked when leader election is enabled)",
	},
	{
		path:    "leaderElection.leaseName",
		field:   func(c *Config) any { return &c.LeaderElection.LeaseName },
		help:    "Name of the leader election Lease.",
		allowed: "a DNS-1123 subdomain (checked when leader election is enabled)",
	},
	{
		path:    "leaderElection.leaseDuration",
		field:   func(c *Config) any { return &c.LeaderElection.LeaseDuration },
		help:    "How long other replicas wait after the leader's last renewal before taking over; every call of the leader to a sidecar ends leaderElection.callMargin before then.",
		allowed: "a duration > 0 and > leaderElection.renewDeadline; whole seconds when leader election is enabled",
	},
	{
		path:    "leaderElection.renewDeadline",
		field:   func(c *Config) any { return &c.LeaderElection.RenewDeadline },
		help:    "How long the leader keeps trying to renew the Lease before it steps down.",
		allowed: "a duration > 0, < leaderElection.leaseDuration and > leaderElection.retryPeriod",
	},
	{
		path:    "leaderElection.retryPeriod",
		field:   func(c *Config) any { return &c.LeaderElection.RetryPeriod },
		help:    "Wait between attempts to acquire or renew the Lease.",
		allowed: "a duration > 0 and < leaderElection.renewDeadline",
	},
	{
		path:    "leaderElection.callMargin",
		field:   func(c *Config) any { return &c.LeaderElection.CallMargin },
		help:    "How long before another replica could take the Lease over every call of the leader must have ended: covers clocks running at slightly different rates, the network delay of a call's deadline to the sidecar and driver, and the time they take to stop.",
		allowed: "a duration > 0 and < leaderElection.leaseDuration - leaderElection.retryPeriod",
	},
	{
		path:    "metrics.bindAddress",
		field:   func(c *Config) any { return &c.Metrics.BindAddress },
		help:    `Address the Prometheus metrics endpoint listens on; "0" disables it.`,
		allowed: `host:port with a port from 0 to 65535, or "0"`,
	},
	{
		path:    "health.bindAddress",
		field:   func(c *Config) any { return &c.Health.BindAddress },
		help:    "Address the liveness and readiness endpoints listen on.",
		allowed: "host:port with a port from 0 to 65535",
	},
	{
		path:    "policy.namespace",
		field:   func(c *Config) any { return &c.Policy.Namespace },
		help:    "Namespace watched for policy ConfigMaps.",
		allowed: "a DNS-1123 label",
	},
	{
		path:    "policy.labelSelector",
		field:   func(c *Config) any { return &c.Policy.LabelSelector },
		help:    "Label selector picking the policy ConfigMaps; when none match, the built-in default policy applies.",
		allowed: "a Kubernetes label selector",
	},
	{
		path:    "policy.evaluationTimeout",
		field:   func(c *Config) any { return &c.Policy.EvaluationTimeout },
		help:    "Longest time one policy evaluation may take; a slower one counts as a policy failure.",
		allowed: "a duration > 0",
	},
	{
		path:    "webhook.enabled",
		field:   func(c *Config) any { return &c.Webhook.Enabled },
		help:    "Serve the validating admission webhook that refuses a policy ConfigMap the controller would reject before it is stored; every replica serves it, and deploy/ registers it.",
		allowed: "true or false",
	},
	{
		path:    "webhook.bindAddress",
		field:   func(c *Config) any { return &c.Webhook.BindAddress },
		help:    "Address the webhook's HTTPS endpoint listens on.",
		allowed: "host:port with a port from 0 to 65535 (checked when webhook.enabled is true)",
	},
	{
		path:    "webhook.certFile",
		field:   func(c *Config) any { return &c.Webhook.CertFile },
		help:    "PEM serving certificate of the webhook, for the name the API server calls it by; read again when it changes.",
		allowed: "a path; required when webhook.enabled is true",
	},
	{
		path:    "webhook.keyFile",
		field:   func(c *Config) any { return &c.Webhook.KeyFile },
		help:    "PEM private key of webhook.certFile; read again when it changes.",
		allowed: "a path; required when webhook.enabled is true",
	},
	{
		path:  "propagationWebhook.enabled",
		field: func(c *Config) any { return &c.PropagationWebhook.Enabled },
		help: "Serve the mutating admission webhook that sets mountPropagation HostToContainer on the claim volumes of pods being created where the policy's propagation rule asks for it, " +
			"beside the policy webhook on webhook.bindAddress; it never refuses a pod. deploy/ registers it only when turned on.",
		allowed: "true or false; true needs webhook.enabled",
	},
	{
		path:    "schedule.default",
		field:   func(c *Config) any { return &c.Schedule.Default },
		help:    "Cron schedule of periodic sweeps for StorageClasses without their own; empty means no periodic sweep for them.",
		allowed: `a cron spec ("0 */6 * * *", "@hourly", "@every 1h"), or empty`,
	},
	{
		path:    "schedule.storageClasses",
		field:   func(c *Config) any { return &c.Schedule.StorageClasses },
		help:    "Cron schedules of individual StorageClasses, replacing schedule.default for them; an empty schedule turns periodic sweeps off for that class. In the file a mapping of name to spec; in the environment and on the command line name=spec pairs separated by commas.",
		allowed: "StorageClass names that are DNS-1123 subdomains, each with a cron spec or empty",
	},
	{
		path:    "schedule.stagger",
		field:   func(c *Config) any { return &c.Schedule.Stagger },
		help:    "Longest random delay added per node when a schedule fires, so that nodes are not all swept in the same second; 0 turns staggering off.",
		allowed: "a duration >= 0",
	},
	{
		path:    "restart.debounce",
		field:   func(c *Config) any { return &c.Restart.Debounce },
		help:    "The shortest time between two restart sweeps of one node's driver: a restart is swept at once, and the restarts that follow within this window (a crash-looping plugin) are folded into one sweep at its end, made only when the marker changed again.",
		allowed: "a duration >= 0",
	},
	{
		path:    "restart.sweepCSIAddonsSidecarRestarts",
		field:   func(c *Config) any { return &c.Restart.SweepCSIAddonsSidecarRestarts },
		help:    "Also sweep when only the csi-addons sidecar container restarted (its lastUpdatedAt changed, the pod and the healer sidecar did not): it kills no mounter, and a driver restart is seen by the healer sidecar already.",
		allowed: "true or false",
	},
	{
		path:    "manualSweeps.perMinute",
		field:   func(c *Config) any { return &c.ManualSweeps.PerMinute },
		help:    "Most sweeps requested by annotation (docs/triggers.md) that start in any minute across the cluster; the others wait. Whoever may update a PVC may request one; an object has at most one requested sweep in flight and one waiting.",
		allowed: "an integer >= 1",
	},
	{
		path:    "manualSweeps.perNamespacePerMinute",
		field:   func(c *Config) any { return &c.ManualSweeps.PerNamespacePerMinute },
		help:    "Most sweeps requested on the objects of one namespace that start in any minute; cluster-scoped StorageClasses share one budget.",
		allowed: "an integer >= 1 and <= manualSweeps.perMinute",
	},
	{
		path:    "budgets.global",
		field:   func(c *Config) any { return &c.Budgets.Global },
		help:    "Most probe and heal calls in flight across the cluster.",
		allowed: "an integer >= 1",
	},
	{
		path:    "budgets.perDriver",
		field:   func(c *Config) any { return &c.Budgets.PerDriver },
		help:    "Most probe and heal calls in flight to one CSI driver, across all nodes.",
		allowed: "an integer >= 1 and <= budgets.global",
	},
	{
		path:    "budgets.perNode",
		field:   func(c *Config) any { return &c.Budgets.PerNode },
		help:    "Most probe and heal calls in flight to one node. One volume never has more than one call in flight; that limit is fixed.",
		allowed: "an integer >= 1 and <= budgets.perDriver",
	},
	{
		path:    "timeouts.probe",
		field:   func(c *Config) any { return &c.Timeouts.Probe },
		help:    "Deadline of one probe call to a sidecar.",
		allowed: "a duration > 0; with leader election enabled, at most leaderElection.leaseDuration - leaderElection.retryPeriod - leaderElection.callMargin",
	},
	{
		path:    "timeouts.heal",
		field:   func(c *Config) any { return &c.Timeouts.Heal },
		help:    "Deadline of one heal call to a sidecar.",
		allowed: "a duration > 0; with leader election enabled, at most leaderElection.leaseDuration - leaderElection.retryPeriod - leaderElection.callMargin",
	},
	{
		path:    "stagedList.maxVolumes",
		field:   func(c *Config) any { return &c.StagedList.MaxVolumes },
		help:    "Most volumes one listing of a node's staged volumes (drivers without VolumeAttachments) may return, all its pages together; a sidecar that sends more fails that node's listing, and the sweep goes on with the other nodes.",
		allowed: "an integer >= 1",
	},
	{
		path:    "stagedList.maxBytes",
		field:   func(c *Config) any { return &c.StagedList.MaxBytes },
		help:    "Most bytes on the wire of all the pages of one listing of a node's staged volumes; past it that node's listing fails.",
		allowed: "an integer >= 4096",
	},
	{
		path:    "stagedList.timeout",
		field:   func(c *Config) any { return &c.StagedList.Timeout },
		help:    "Deadline of one listing of a node's staged volumes, all its pages together (each page is also bounded by timeouts.probe); past it that node's listing fails.",
		allowed: "a duration > 0",
	},
	{
		path:    "backoff.base",
		field:   func(c *Config) any { return &c.Backoff.Base },
		help:    "Delay before retrying a volume after its first failure; it doubles with each further failure. A restart sweep is not held by the failures of calls made before the node plugin restarted.",
		allowed: "a duration > 0",
	},
	{
		path:    "backoff.max",
		field:   func(c *Config) any { return &c.Backoff.Max },
		help:    "Longest delay between retries of a failing volume.",
		allowed: "a duration >= backoff.base",
	},
	{
		path:    "dryRun",
		field:   func(c *Config) any { return &c.DryRun },
		help:    "Decide and report what would be healed without sending heal calls.",
		allowed: "true or false",
	},
	{
		path:    "remediation.enabled",
		field:   func(c *Config) any { return &c.Remediation.Enabled },
		help:    "Evict, through the Eviction API, the pods that still see a healed volume's dead mount (mount propagation None); off, the PVC's Event VolumePodsMustRestart asks the operator to restart them. Needs the RBAC that deploy/ grants with remediation turned on (docs/operations.md).",
		allowed: "true or false",
	},
	{
		path:    "remediation.dryRun",
		field:   func(c *Config) any { return &c.Remediation.DryRun },
		help:    "Log and record (Event EvictionDryRun on the Pod and the PVC) the pods that would be evicted, and evict none; dryRun implies it.",
		allowed: "true or false",
	},
	{
		path:    "remediation.evictionsPerMinute",
		field:   func(c *Config) any { return &c.Remediation.EvictionsPerMinute },
		help:    "Most evictions in any minute across the cluster; the others wait for the budget.",
		allowed: "an integer >= 1",
	},
	{
		path:    "remediation.evictionsPerNamespacePerMinute",
		field:   func(c *Config) any { return &c.Remediation.EvictionsPerNamespacePerMinute },
		help:    "Most evictions in any minute in one namespace.",
		allowed: "an integer >= 1 and <= remediation.evictionsPerMinute",
	},
	{
		path:    "remediation.reprobeAfter",
		field:   func(c *Config) any { return &c.Remediation.ReprobeAfter },
		help:    "How long after the last of a volume's pods on its dead mount was evicted the volume is probed again, for the replacement pods to start and the dead-mount report (StaleMountInPods, the pods-on-dead-mount gauge) to clear.",
		allowed: "a duration > 0",
	},
	{
		path:    "sidecar.tls.enabled",
		field:   func(c *Config) any { return &c.Sidecar.TLS.Enabled },
		help:    "Use TLS for connections to the sidecars; off means plaintext.",
		allowed: "true or false",
	},
	{
		path:    "sidecar.tls.caFile",
		field:   func(c *Config) any { return &c.Sidecar.TLS.CAFile },
		help:    "PEM bundle of the CAs that sign the sidecars' serving certificates.",
		allowed: "a path; required when sidecar.tls.enabled is true and sidecar.tls.insecureSkipVerify is false",
	},
	{
		path:    "sidecar.tls.certFile",
		field:   func(c *Config) any { return &c.Sidecar.TLS.CertFile },
		help:    "PEM client certificate presented to the sidecars, which require one signed by their --client-ca-file when it is set; read again when it changes; empty presents none.",
		allowed: "a path, set together with sidecar.tls.keyFile, or empty",
	},
	{
		path:    "sidecar.tls.keyFile",
		field:   func(c *Config) any { return &c.Sidecar.TLS.KeyFile },
		help:    "PEM private key of sidecar.tls.certFile; read again when it changes.",
		allowed: "a path, set together with sidecar.tls.certFile, or empty",
	},
	{
		path:    "sidecar.tls.serverName",
		field:   func(c *Config) any { return &c.Sidecar.TLS.ServerName },
		help:    "Base of the names in the sidecars' certificates: the sidecar of node N must present a certificate for N.<serverName>, so that no sidecar answers for another node; empty means the host part of each sidecar's address.",
		allowed: "a host name, or empty",
	},
	{
		path:    "sidecar.tls.insecureSkipVerify",
		field:   func(c *Config) any { return &c.Sidecar.TLS.InsecureSkipVerify },
		help:    "Accept any sidecar certificate without verifying it. For tests only.",
		allowed: "true or false",
	},
	{
		path:    "sidecar.tls.signer.enabled",
		field:   func(c *Config) any { return &c.Sidecar.TLS.Signer.Enabled },
		help:    "Sign the sidecars' serving certificates that they ask for with a CertificateSigningRequest (signerName volume-healer.io/sidecar-serving), and trust the CA they are signed with.",
		allowed: "true or false",
	},
	{
		path:    "sidecar.tls.signer.caSecret",
		field:   func(c *Config) any { return &c.Sidecar.TLS.Signer.CASecret },
		help:    "The kubernetes.io/tls Secret holding the signer's CA; created with a new CA when missing (unless cert-manager issues it), and read again every minute: a renewed CA signs from then on, and the replaced one stays trusted while its certificates may be valid.",
		allowed: "<namespace>/<name>; required when sidecar.tls.signer.enabled is true",
	},
	{
		path:    "sidecar.tls.signer.requesters",
		field:   func(c *Config) any { return &c.Sidecar.TLS.Signer.Requesters },
		help:    "The node plugins' ServiceAccounts allowed to ask for a sidecar certificate; a request is signed only when its token is bound to a pod of one of them on the node the request names.",
		allowed: "system:serviceaccount:<namespace>:<name> user names separated by commas; required when sidecar.tls.signer.enabled is true",
	},
	{
		path:    "sidecar.tls.signer.validity",
		field:   func(c *Config) any { return &c.Sidecar.TLS.Signer.Validity },
		help:    "How long a signed sidecar certificate is valid; the sidecars renew theirs two thirds into it.",
		allowed: "a duration >= 10m",
	},
	{
		path:    "sidecar.auth.tokenFile",
		field:   func(c *Config) any { return &c.Sidecar.Auth.TokenFile },
		help:    "File holding a token of the controller's ServiceAccount. It is never sent: the controller reads whose it is and requests, through the TokenRequest API, a token of that ServiceAccount for each node's sidecars alone, which they check with a TokenReview.",
		allowed: "a path, not empty",
	},
	{
		path:    "sidecar.auth.audience",
		field:   func(c *Config) any { return &c.Sidecar.Auth.Audience },
		help:    "Base of the sidecars' token audiences: the token for the sidecars of node N is for <audience>/node/N alone. The sidecars' --token-audience must match.",
		allowed: "a string, not empty",
	},
	{
		path:    "log.verbosity",
		field:   func(c *Config) any { return &c.Log.Verbosity },
		help:    "Log verbosity (as klog -v): 0 logs the least, 10 the most. The -v flag, when given, wins.",
		allowed: "an integer from 0 to 10",
	},
	{
		path:    "log.format",
		field:   func(c *Config) any { return &c.Log.Format },
		help:    "Log format: text (klog's lines) or json (one JSON object a line, Kubernetes components' format). The --logging-format flag, when given, wins.",
		allowed: "text or json",
	},
}

// flagName is the command-line flag of the key: the whole path in kebab case
// (leaderElection.leaseDuration becomes leader-election-lease-duration).
func (s setting) flagName() string {
	return strings.Join(words(s.path), "-")
}

// envName is the environment variable of the key: the prefix and the whole path in upper snake
// case (leaderElection.leaseDuration becomes VOLUME_HEALER_LEADER_ELECTION_LEASE_DURATION).
func (s setting) envName() string {
	return envPrefix + strings.ToUpper(strings.Join(words(s.path), "_"))
}

// viperKey is the key as viper stores it; viper folds every key to lower case.
func (s setting) viperKey() string {
	return strings.ToLower(s.path)
}

// words splits a dotted camelCase path into lower-case words: "sidecar.tls.caFile" gives
// sidecar, tls, ca, file.
func words(path string) []string {
	var out []string
	for _, segment := range strings.Split(path, ".") {
		start := 0
		runes := []rune(segment)
		for i := 1; i < len(runes); i++ {
			if unicode.IsUpper(runes[i]) && !unicode.IsUpper(runes[i-1]) {
				out = append(out, strings.ToLower(string(runes[start:i])))
				start = i
			}
		}
		out = append(out, strings.ToLower(string(runes[start:])))
	}
	return out
}

// lookupSetting finds the setting of a file path.
func lookupSetting(path string) (setting, bool) {
	for _, s := range settings {
		if s.path == path {
			return s, true
		}
	}
	return setting{}, false
}

// children maps each section of the file (e.g. "sidecar" and "sidecar.tls", and "" for the top
// level) to the names allowed directly under it, in table order.
func children() map[string][]string {
	out := map[string][]string{}
	for _, s := range settings {
		parts := strings.Split(s.path, ".")
		for i := range parts {
			parent := strings.Join(parts[:i], ".")
			out[parent] = appendOnce(out[parent], parts[i])
		}
	}
	return out
}

func appendOnce(list []string, s string) []string {
	for _, have := range list {
		if have == s {
			return list
		}
	}
	return append(list, s)
}

// formatDuration prints a duration the way people write it: 2m rather than Go's 2m0s. The
// result parses back to the same value with time.ParseDuration.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
