package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

const testCA = "/etc/volume-healer/ca.pem"

// loadRaw writes file (when not empty) to a temporary path named by --config, registers the flags
// on a fresh FlagSet, parses args and loads with env as the environment.
func loadRaw(t *testing.T, file string, env map[string]string, args ...string) (*Config, error) {
	t.Helper()
	fs := pflag.NewFlagSet("volume-healer", pflag.ContinueOnError)
	RegisterFlags(fs)
	if file != "" {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", path}, args...)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parsing %q: %v", args, err)
	}
	return Load(fs, lookup(env))
}

// load is loadRaw with the CA file set through the environment (unless env sets it), since the
// defaults alone require one.
func load(t *testing.T, file string, env map[string]string, args ...string) (*Config, error) {
	t.Helper()
	merged := map[string]string{"VOLUME_HEALER_SIDECAR_TLS_CA_FILE": testCA}
	for k, v := range env {
		merged[k] = v
	}
	return loadRaw(t, file, merged, args...)
}

func lookup(env map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}

// validDefault is Default with the one setting that has no usable default filled in.
func validDefault() Config {
	c := Default()
	c.Sidecar.TLS.CAFile = testCA
	return c
}

func TestLoadDefaults(t *testing.T) {
	cfg, err := load(t, "", nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if want := validDefault(); !reflect.DeepEqual(*cfg, want) {
		t.Errorf("Load with only the CA set:\n got %+v\nwant %+v", *cfg, want)
	}
	// The sidecars' tokens are for the sidecars' audience out of the box (per node, see
	// cmd/volume-healer/controller/tokens.go), as the sidecars' own default expects.
	if got := cfg.Sidecar.Auth.Audience; got != "volume-healer-sidecar" {
		t.Errorf("sidecar.auth.audience defaults to %q, want volume-healer-sidecar", got)
	}

	// Without anything, the missing CA is the one and only complaint.
	_, err = loadRaw(t, "", nil)
	if err == nil {
		t.Fatal("Load with defaults only: want an error about sidecar.tls.caFile, got none")
	}
	want := `config: sidecar.tls.caFile (default): "" is not allowed: a CA file is required when sidecar.tls.enabled is true and sidecar.tls.insecureSkipVerify is false`
	if msg := err.Error(); !strings.HasPrefix(msg, want) || strings.Contains(msg, "\n") {
		t.Errorf("Load with defaults only:\n got %q\nwant one line starting with %q", msg, want)
	}
}

func TestLoadPrecedence(t *testing.T) {
	probe := func(c *Config) any { return c.Timeouts.Probe }
	global := func(c *Config) any { return c.Budgets.Global }
	dryRun := func(c *Config) any { return c.DryRun }
	leader := func(c *Config) any { return c.LeaderElection.Enabled }
	namespace := func(c *Config) any { return c.Policy.Namespace }
	classes := func(c *Config) any { return c.Schedule.StorageClasses }
	schedule := func(c *Config) any { return c.Schedule.Default }

	const (
		probeFile     = "timeouts:\n  probe: 20s\n"
		globalFile    = "budgets:\n  global: 100\n"
		dryRunFile    = "dryRun: true\n"
		leaderFile    = "leaderElection:\n  enabled: false\n"
		namespaceFile = "policy:\n  namespace: from-file\n"
		classesFile   = "schedule:\n  storageClasses:\n    fast: '@hourly'\n    slow.ssd: '0 3 * * *'\n"
	)
	tests := map[string]struct {
		file string
		env  map[string]string
		args []string
		got  func(*Config) any
		want any
	}{
		"duration: default":              {got: probe, want: 10 * time.Second},
		"duration: file over default":    {file: probeFile, got: probe, want: 20 * time.Second},
		"duration: env over file":        {file: probeFile, env: map[string]string{"VOLUME_HEALER_TIMEOUTS_PROBE": "30s"}, got: probe, want: 30 * time.Second},
		"duration: flag over env":        {file: probeFile, env: map[string]string{"VOLUME_HEALER_TIMEOUTS_PROBE": "30s"}, args: []string{"--timeouts-probe=45s"}, got: probe, want: 45 * time.Second},
		"int: default":                   {got: global, want: 64},
		"int: file over default":         {file: globalFile, got: global, want: 100},
		"int: env over file":             {file: globalFile, env: map[string]string{"VOLUME_HEALER_BUDGETS_GLOBAL": "200"}, got: global, want: 200},
		"int: flag over env":             {file: globalFile, env: map[string]string{"VOLUME_HEALER_BUDGETS_GLOBAL": "200"}, args: []string{"--budgets-global", "300"}, got: global, want: 300},
		"bool: default false":            {got: dryRun, want: false},
		"bool: file over default":        {file: dryRunFile, got: dryRun, want: true},
		"bool: env over file":            {file: dryRunFile, env: map[string]string{"VOLUME_HEALER_DRY_RUN": "false"}, got: dryRun, want: false},
		"bool: flag over env":            {file: dryRunFile, env: map[string]string{"VOLUME_HEALER_DRY_RUN": "false"}, args: []string{"--dry-run"}, got: dryRun, want: true},
		"bool: default true":             {got: leader, want: true},
		"bool: file turns off":           {file: leaderFile, got: leader, want: false},
		"bool: env turns back on":        {file: leaderFile, env: map[string]string{"VOLUME_HEALER_LEADER_ELECTION_ENABLED": "1"}, got: leader, want: true},
		"bool: flag turns off again":     {file: leaderFile, env: map[string]string{"VOLUME_HEALER_LEADER_ELECTION_ENABLED": "true"}, args: []string{"--leader-election-enabled=false"}, got: leader, want: false},
		"string: default":                {got: namespace, want: "volume-healer"},
		"string: file over default":      {file: namespaceFile, got: namespace, want: "from-file"},
		"string: env over file":          {file: namespaceFile, env: map[string]string{"VOLUME_HEALER_POLICY_NAMESPACE": "from-env"}, got: namespace, want: "from-env"},
		"string: flag over env":          {file: namespaceFile, env: map[string]string{"VOLUME_HEALER_POLICY_NAMESPACE": "from-env"}, args: []string{"--policy-namespace=from-flag"}, got: namespace, want: "from-flag"},
		"string: file scalar as written": {file: "sidecar:\n  auth:\n    audience: 0x1F\n", got: func(c *Config) any { return c.Sidecar.Auth.Audience }, want: "0x1F"},
		"string: empty env over file":    {file: "schedule:\n  default: '@daily'\n", env: map[string]string{"VOLUME_HEALER_SCHEDULE_DEFAULT": ""}, got: schedule, want: ""},
		"map: default":                   {got: classes, want: map[string]string{}},
		"map: file over default":         {file: classesFile, got: classes, want: map[string]string{"fast": "@hourly", "slow.ssd": "0 3 * * *"}},
		"map: env over file":             {file: classesFile, env: map[string]string{"VOLUME_HEALER_SCHEDULE_STORAGE_CLASSES": "gold=@daily,silver=0 4 * * *"}, got: classes, want: map[string]string{"gold": "@daily", "silver": "0 4 * * *"}},
		"map: flag over env":             {file: classesFile, env: map[string]string{"VOLUME_HEALER_SCHEDULE_STORAGE_CLASSES": "gold=@daily"}, args: []string{"--schedule-storage-classes", "bronze=@weekly"}, got: classes, want: map[string]string{"bronze": "@weekly"}},
		"map: empty env clears file":     {file: classesFile, env: map[string]string{"VOLUME_HEALER_SCHEDULE_STORAGE_CLASSES": ""}, got: classes, want: map[string]string{}},
		"map: env spec with commas":      {env: map[string]string{"VOLUME_HEALER_SCHEDULE_STORAGE_CLASSES": `"fast=0 1,13 * * *",slow=@daily`}, got: classes, want: map[string]string{"fast": "0 1,13 * * *", "slow": "@daily"}},
		"map: repeated flag accumulates": {args: []string{"--schedule-storage-classes=fast=0 1,13 * * *", "--schedule-storage-classes=slow=@daily"}, got: classes, want: map[string]string{"fast": "0 1,13 * * *", "slow": "@daily"}},
		"map: file empty spec kept":      {file: "schedule:\n  storageClasses:\n    archive: ''\n", got: classes, want: map[string]string{"archive": ""}},
		"map: file null is empty":        {file: "schedule:\n  storageClasses:\n", got: classes, want: map[string]string{}},
		"config file named by env":       {env: map[string]string{"VOLUME_HEALER_CONFIG": writeTemp(t, probeFile)}, got: probe, want: 20 * time.Second},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := load(t, tc.file, tc.env, tc.args...)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got := tc.got(cfg); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLoadInvalidValues checks that each rule rejects a bad value with one line naming the key,
// where the value came from, the value and what is allowed.
func TestLoadInvalidValues(t *testing.T) {
	tests := map[string]struct {
		file string
		env  map[string]string
		args []string
		want []string // all on one line of the error
	}{
		"lease duration not positive": {
			args: []string{"--leader-election-lease-duration=0s"},
			want: []string{"leaderElection.leaseDuration (flag --leader-election-lease-duration): 0s is not allowed", "must be a duration > 0"},
		},
		"renew deadline not positive": {
			env:  map[string]string{"VOLUME_HEALER_LEADER_ELECTION_RENEW_DEADLINE": "-1s"},
			want: []string{"leaderElection.renewDeadline (env VOLUME_HEALER_LEADER_ELECTION_RENEW_DEADLINE): -1s is not allowed", "> 0"},
		},
		"retry period not positive": {
			file: "leaderElection:\n  retryPeriod: 0s\n",
			want: []string{"leaderElection.retryPeriod (file ", "line 2): 0s is not allowed", "> 0"},
		},
		"renew deadline not below lease duration": {
			file: "leaderElection:\n  renewDeadline: 1m\n",
			want: []string{"leaderElection.renewDeadline (file ", "line 2): 1m is not allowed", "must be less than leaderElection.leaseDuration (1m)"},
		},
		"retry period not below renew deadline": {
			args: []string{"--leader-election-retry-period=45s"},
			want: []string{"leaderElection.retryPeriod (flag --leader-election-retry-period): 45s is not allowed", "must be less than leaderElection.renewDeadline (40s)"},
		},
		"lease duration not whole seconds": {
			env:  map[string]string{"VOLUME_HEALER_LEADER_ELECTION_LEASE_DURATION": "59500ms"},
			want: []string{"leaderElection.leaseDuration (env VOLUME_HEALER_LEADER_ELECTION_LEASE_DURATION): 59.5s is not allowed", "must be whole seconds, such as 60s"},
		},
		"call margin not positive": {
			args: []string{"--leader-election-call-margin=0s"},
			want: []string{"leaderElection.callMargin (flag --leader-election-call-margin): 0s is not allowed", "must be a duration > 0"},
		},
		"call margin leaves no time for a call": {
			file: "leaderElection:\n  callMargin: 55s\n",
			want: []string{"leaderElection.callMargin (file ", "line 2): 55s is not allowed", "must be less than leaderElection.leaseDuration (1m) - leaderElection.retryPeriod (5s)"},
		},
		"heal longer than the lease leaves": {
			file: "timeouts:\n  heal: 2m\n",
			want: []string{"timeouts.heal (file ", "line 2): 2m is not allowed", "must be at most 53s with leader election enabled",
				"leaderElection.leaseDuration (1m) - leaderElection.retryPeriod (5s) - leaderElection.callMargin (2s)", "lower timeouts.heal, or raise leaderElection.leaseDuration"},
		},
		"probe longer than a short lease leaves": {
			env: map[string]string{"VOLUME_HEALER_LEADER_ELECTION_LEASE_DURATION": "12s", "VOLUME_HEALER_LEADER_ELECTION_RENEW_DEADLINE": "8s",
				"VOLUME_HEALER_LEADER_ELECTION_RETRY_PERIOD": "2s", "VOLUME_HEALER_TIMEOUTS_HEAL": "8s"},
			want: []string{"timeouts.probe (default): 10s is not allowed", "must be at most 8s with leader election enabled"},
		},
		"lease namespace not a DNS label": {
			env:  map[string]string{"VOLUME_HEALER_LEADER_ELECTION_NAMESPACE": "Volume_Healer"},
			want: []string{"leaderElection.namespace (env VOLUME_HEALER_LEADER_ELECTION_NAMESPACE): \"Volume_Healer\" is not allowed", "must be a DNS-1123 label"},
		},
		"lease name not a DNS subdomain": {
			args: []string{"--leader-election-lease-name="},
			want: []string{`leaderElection.leaseName (flag --leader-election-lease-name): "" is not allowed`, "must be a DNS-1123 subdomain"},
		},
		"metrics address without port": {
			file: "metrics:\n  bindAddress: localhost\n",
			want: []string{`metrics.bindAddress (file `, `line 2): "localhost" is not allowed`, `must be host:port with a port from 0 to 65535, or "0" to turn metrics off`},
		},
		"metrics port out of range": {
			args: []string{"--metrics-bind-address=:65536"},
			want: []string{`metrics.bindAddress (flag --metrics-bind-address): ":65536" is not allowed`, "port from 0 to 65535"},
		},
		"health address cannot be turned off": {
			env:  map[string]string{"VOLUME_HEALER_HEALTH_BIND_ADDRESS": "0"},
			want: []string{`health.bindAddress (env VOLUME_HEALER_HEALTH_BIND_ADDRESS): "0" is not allowed`, "must be host:port with a port from 0 to 65535"},
		},
		"policy namespace not a DNS label": {
			file: "policy:\n  namespace: 'not valid'\n",
			want: []string{`policy.namespace (file `, `"not valid" is not allowed`, "DNS-1123 label"},
		},
		"policy label selector unparsable": {
			args: []string{"--policy-label-selector=tier in (a"},
			want: []string{`policy.labelSelector (flag --policy-label-selector): "tier in (a" is not allowed`, "must be a label selector"},
		},
		"policy evaluation timeout not positive": {
			env:  map[string]string{"VOLUME_HEALER_POLICY_EVALUATION_TIMEOUT": "0"},
			want: []string{"policy.evaluationTimeout (env VOLUME_HEALER_POLICY_EVALUATION_TIMEOUT): 0s is not allowed", "> 0"},
		},
		"webhook without certificate": {
			env:  map[string]string{"VOLUME_HEALER_WEBHOOK_ENABLED": "true", "VOLUME_HEALER_WEBHOOK_KEY_FILE": "/etc/webhook/tls.key"},
			want: []string{`webhook.certFile (default): "" is not allowed`, "must name the PEM serving certificate of the webhook when webhook.enabled is true"},
		},
		"webhook without key": {
			file: "webhook:\n  enabled: true\n  certFile: /etc/webhook/tls.crt\n",
			want: []string{`webhook.keyFile (default): "" is not allowed`, "must name the PEM private key"},
		},
		"webhook address without port": {
			args: []string{"--webhook-enabled", "--webhook-bind-address=9443", "--webhook-cert-file=c", "--webhook-key-file=k"},
			want: []string{`webhook.bindAddress (flag --webhook-bind-address): "9443" is not allowed`, "must be host:port"},
		},
		"propagation webhook without the policy webhook": {
			env:  map[string]string{"VOLUME_HEALER_PROPAGATION_WEBHOOK_ENABLED": "true"},
			want: []string{"propagationWebhook.enabled (env VOLUME_HEALER_PROPAGATION_WEBHOOK_ENABLED): true is not allowed", "needs webhook.enabled"},
		},
		"default schedule not cron": {
			file: "schedule:\n  default: every day\n",
			want: []string{`schedule.default (file `, `"every day" is not allowed`, "must be a cron spec", "expected exactly 5 fields"},
		},
		"default schedule never fires": {
			args: []string{"--schedule-default=0 0 31 2 *"},
			want: []string{`schedule.default (flag --schedule-default): "0 0 31 2 *" is not allowed`, "never occurs"},
		},
		"default schedule with bare time zone": {
			env:  map[string]string{"VOLUME_HEALER_SCHEDULE_DEFAULT": "CRON_TZ=UTC"},
			want: []string{`schedule.default (env VOLUME_HEALER_SCHEDULE_DEFAULT): "CRON_TZ=UTC" is not allowed`, "time zone prefix must be followed by a space"},
		},
		"default schedule every zero": {
			file: "schedule:\n  default: '@every 0s'\n",
			want: []string{`schedule.default (file `, `"@every 0s" is not allowed`, "at least 1s"},
		},
		"storage class name not a DNS subdomain": {
			file: "schedule:\n  storageClasses:\n    Fast_SSD: '@hourly'\n",
			want: []string{"schedule.storageClasses (file ", `StorageClass name "Fast_SSD" is not allowed`, "must be a DNS-1123 subdomain"},
		},
		"storage class schedule not cron": {
			env:  map[string]string{"VOLUME_HEALER_SCHEDULE_STORAGE_CLASSES": "fast=@sometimes"},
			want: []string{`schedule.storageClasses (env VOLUME_HEALER_SCHEDULE_STORAGE_CLASSES): schedule "@sometimes" of StorageClass "fast" is not allowed`, "must be a cron spec"},
		},
		"storage class pairs malformed": {
			env:  map[string]string{"VOLUME_HEALER_SCHEDULE_STORAGE_CLASSES": "fast"},
			want: []string{`schedule.storageClasses (env VOLUME_HEALER_SCHEDULE_STORAGE_CLASSES): "fast" is not allowed`, "must be name=spec pairs"},
		},
		"stagger negative": {
			args: []string{"--schedule-stagger=-1m"},
			want: []string{"schedule.stagger (flag --schedule-stagger): -1m is not allowed", "must be a duration >= 0"},
		},
		"restart debounce negative": {
			file: "restart:\n  debounce: -2s\n",
			want: []string{"restart.debounce (file ", "-2s is not allowed", ">= 0"},
		},
		"global budget zero": {
			file: "budgets:\n  global: 0\n",
			want: []string{"budgets.global (file ", "line 2): 0 is not allowed", "must be an integer >= 1"},
		},
		"per-driver budget zero": {
			args: []string{"--budgets-per-driver=0"},
			want: []string{"budgets.perDriver (flag --budgets-per-driver): 0 is not allowed", "must be an integer >= 1"},
		},
		"per-node budget negative": {
			env:  map[string]string{"VOLUME_HEALER_BUDGETS_PER_NODE": "-1"},
			want: []string{"budgets.perNode (env VOLUME_HEALER_BUDGETS_PER_NODE): -1 is not allowed: must be an integer >= 1"},
		},
		"per-node budget above per-driver": {
			file: "budgets:\n  perNode: 40\n",
			want: []string{"budgets.perNode (file ", "40 is not allowed", "must be <= budgets.perDriver (32)", "per-node limit could never be reached"},
		},
		"per-driver budget above global": {
			args: []string{"--budgets-per-driver=65"},
			want: []string{"budgets.perDriver (flag --budgets-per-driver): 65 is not allowed", "must be <= budgets.global (64)", "per-driver limit could never be reached"},
		},
		"eviction budget zero": {
			env:  map[string]string{"VOLUME_HEALER_REMEDIATION_EVICTIONS_PER_MINUTE": "0"},
			want: []string{"remediation.evictionsPerMinute (env VOLUME_HEALER_REMEDIATION_EVICTIONS_PER_MINUTE): 0 is not allowed: must be an integer >= 1"},
		},
		"namespace eviction budget above the cluster's": {
			file: "remediation:\n  evictionsPerNamespacePerMinute: 11\n",
			want: []string{"remediation.evictionsPerNamespacePerMinute (file ", "11 is not allowed", "must be <= remediation.evictionsPerMinute (10)", "could never be reached"},
		},
		"reprobe wait after evictions not positive": {
			file: "remediation:\n  reprobeAfter: 0s\n",
			want: []string{"remediation.reprobeAfter (file ", "0s is not allowed", "> 0"},
		},
		"probe timeout not positive": {
			args: []string{"--timeouts-probe=0s"},
			want: []string{"timeouts.probe (flag --timeouts-probe): 0s is not allowed", "> 0"},
		},
		"heal timeout not positive": {
			env:  map[string]string{"VOLUME_HEALER_TIMEOUTS_HEAL": "-1s"},
			want: []string{"timeouts.heal (env VOLUME_HEALER_TIMEOUTS_HEAL): -1s is not allowed", "> 0"},
		},
		"staged list without room for a volume": {
			file: "stagedList:\n  maxVolumes: 0\n",
			want: []string{"stagedList.maxVolumes (file ", "0 is not allowed", "must be an integer >= 1"},
		},
		"staged list bytes below one page of a volume": {
			args: []string{"--staged-list-max-bytes=100"},
			want: []string{"stagedList.maxBytes (flag --staged-list-max-bytes): 100 is not allowed", "must be an integer >= 4096"},
		},
		"staged list timeout not positive": {
			env:  map[string]string{"VOLUME_HEALER_STAGED_LIST_TIMEOUT": "0s"},
			want: []string{"stagedList.timeout (env VOLUME_HEALER_STAGED_LIST_TIMEOUT): 0s is not allowed", "> 0"},
		},
		"manual sweeps without a budget": {
			file: "manualSweeps:\n  perMinute: 0\n",
			want: []string{"manualSweeps.perMinute (file ", "0 is not allowed", "must be an integer >= 1"},
		},
		"manual sweeps of a namespace above the cluster's": {
			args: []string{"--manual-sweeps-per-namespace-per-minute=21"},
			want: []string{"manualSweeps.perNamespacePerMinute (flag --manual-sweeps-per-namespace-per-minute): 21 is not allowed", "must be <= manualSweeps.perMinute (20)"},
		},
		"backoff base not positive": {
			file: "backoff:\n  base: 0s\n",
			want: []string{"backoff.base (file ", "0s is not allowed", "> 0"},
		},
		"backoff max below base": {
			args: []string{"--backoff-max=1s"},
			want: []string{"backoff.max (flag --backoff-max): 1s is not allowed", "must be a duration >= backoff.base (5s)"},
		},
		"certificate without key": {
			args: []string{"--sidecar-tls-cert-file=/tls/tls.crt"},
			want: []string{`sidecar.tls.keyFile (default): "" is not allowed`, "must be set when sidecar.tls.certFile is set"},
		},
		"key without certificate": {
			env:  map[string]string{"VOLUME_HEALER_SIDECAR_TLS_KEY_FILE": "/tls/tls.key"},
			want: []string{`sidecar.tls.certFile (default): "" is not allowed`, "must be set when sidecar.tls.keyFile is set"},
		},
		"CA missing while verifying": {
			env:  map[string]string{"VOLUME_HEALER_SIDECAR_TLS_CA_FILE": ""},
			want: []string{`sidecar.tls.caFile (env VOLUME_HEALER_SIDECAR_TLS_CA_FILE): "" is not allowed`, "a CA file is required when sidecar.tls.enabled is true and sidecar.tls.insecureSkipVerify is false"},
		},
		"token file empty": {
			file: "sidecar:\n  auth:\n    tokenFile: ''\n",
			want: []string{`sidecar.auth.tokenFile (file `, `line 3): "" is not allowed`, "must name a file holding a token of the controller's ServiceAccount"},
		},
		"token audience empty": {
			env:  map[string]string{"VOLUME_HEALER_SIDECAR_AUTH_AUDIENCE": ""},
			want: []string{`sidecar.auth.audience (env VOLUME_HEALER_SIDECAR_AUTH_AUDIENCE): "" is not allowed`, "must name the base of the sidecars' token audiences"},
		},
		"verbosity above 10": {
			args: []string{"--log-verbosity=11"},
			want: []string{"log.verbosity (flag --log-verbosity): 11 is not allowed", "must be an integer from 0 to 10"},
		},
		"verbosity negative": {
			env:  map[string]string{"VOLUME_HEALER_LOG_VERBOSITY": "-1"},
			want: []string{"log.verbosity (env VOLUME_HEALER_LOG_VERBOSITY): -1 is not allowed", "from 0 to 10"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := load(t, tc.file, tc.env, tc.args...)
			if err == nil {
				t.Fatalf("Load succeeded with %+v, want an error containing %q", cfg, tc.want)
			}
			if !errors.Is(err, ErrInvalidValue) {
				t.Errorf("error does not wrap ErrInvalidValue: %v", err)
			}
			assertLine(t, err, tc.want...)
		})
	}
}

// assertLine fails unless one line of err contains every part.
func assertLine(t *testing.T, err error, parts ...string) {
	t.Helper()
	for _, line := range strings.Split(err.Error(), "\n") {
		ok := strings.HasPrefix(line, "config: ")
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return
		}
	}
	t.Errorf("no line of the error contains all of %q; error:\n%v", parts, err)
}

func TestLoadAcceptsEdgeValues(t *testing.T) {
	tests := map[string]struct {
		file string
		env  map[string]string
		args []string
	}{
		"metrics turned off":                  {args: []string{"--metrics-bind-address=0"}},
		"metrics address as a YAML number":    {file: "metrics:\n  bindAddress: 0\n"},
		"no default schedule":                 {file: "schedule:\n  default: ''\n"},
		"schedule descriptors and time zone":  {file: "schedule:\n  default: 'CRON_TZ=UTC 0 3 * * *'\n  storageClasses:\n    a: '@hourly'\n    b: '@every 90m'\n"},
		"zero stagger and debounce":           {file: "schedule:\n  stagger: 0\nrestart:\n  debounce: 0s\n"},
		"equal budgets":                       {args: []string{"--budgets-global=8", "--budgets-per-driver=8", "--budgets-per-node=8"}},
		"invalid lease names while disabled":  {file: "leaderElection:\n  enabled: false\n  namespace: NOT_VALID\n  leaseName: ''\n"},
		"TLS off needs no CA":                 {env: map[string]string{"VOLUME_HEALER_SIDECAR_TLS_CA_FILE": "", "VOLUME_HEALER_SIDECAR_TLS_ENABLED": "false"}},
		"no verification needs no CA":         {env: map[string]string{"VOLUME_HEALER_SIDECAR_TLS_CA_FILE": ""}, args: []string{"--sidecar-tls-insecure-skip-verify"}},
		"client certificate with key":         {file: "sidecar:\n  tls:\n    certFile: /tls/tls.crt\n    keyFile: /tls/tls.key\n"},
		"empty sections from commented files": {file: "budgets:\nsidecar:\n  tls:\n# nothing here\n"},
		"comments only":                       {file: "# all defaults\n"},
		"verbosity 10":                        {env: map[string]string{"VOLUME_HEALER_LOG_VERBOSITY": "10"}},
		"anchors and aliases":                 {file: "timeouts:\n  probe: &t 30s\n  heal: *t\n"},
		"timeouts that fill the lease":        {file: "leaderElection:\n  leaseDuration: 15s\n  renewDeadline: 10s\n  retryPeriod: 2s\n  callMargin: 1s\ntimeouts:\n  probe: 12s\n  heal: 12s\n"},
		"long heals without leader election":  {file: "leaderElection:\n  enabled: false\n  leaseDuration: 1500ms\n  renewDeadline: 1s\n  retryPeriod: 500ms\ntimeouts:\n  heal: 10m\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := load(t, tc.file, tc.env, tc.args...); err != nil {
				t.Errorf("Load: %v", err)
			}
		})
	}
}

func TestLoadFileErrors(t *testing.T) {
	tests := map[string]struct {
		file    string
		wantErr error
		want    []string
	}{
		"misspelt key": {
			file:    "budgets:\n  perNod: 3\n",
			wantErr: ErrUnknownKey,
			want:    []string{"budgets.perNod (file ", "config.yaml, line 2): unknown key; did you mean budgets.perNode?"},
		},
		"unknown section": {
			file:    "metric:\n  bindAddress: ':9090'\n",
			wantErr: ErrUnknownKey,
			want:    []string{"metric (file ", "line 1): unknown key; did you mean metrics?"},
		},
		"key in the wrong case": {
			file:    "dryrun: true\n",
			wantErr: ErrUnknownKey,
			want:    []string{"dryrun (file ", "unknown key; did you mean dryRun?"},
		},
		"unrelated key": {
			file:    "replicas: 3\n",
			wantErr: ErrUnknownKey,
			want:    []string{"replicas (file ", "unknown key; see docs/configuration.md"},
		},
		"dotted key at top level": {
			file:    "budgets.perNode: 2\n",
			wantErr: ErrUnknownKey,
			want:    []string{"budgets.perNode (file ", "unknown key; write it as nested keys"},
		},
		"section given a value": {
			file:    "budgets: 5\n",
			wantErr: ErrInvalidValue,
			want:    []string{"budgets (file ", "line 1): 5 is not allowed: must be a mapping with the keys global, perDriver, perNode"},
		},
		"duration of the wrong type": {
			file:    "timeouts:\n  probe: banana\n",
			wantErr: ErrInvalidValue,
			want:    []string{"timeouts.probe (file ", "line 2): \"banana\" is not allowed: must be a duration with a unit"},
		},
		"duration without unit": {
			file:    "timeouts:\n  heal: 30\n",
			wantErr: ErrInvalidValue,
			want:    []string{"timeouts.heal (file ", "30 is not allowed: must be a duration with a unit"},
		},
		"integer of the wrong type": {
			file:    "budgets:\n  global: 1.5\n",
			wantErr: ErrInvalidValue,
			want:    []string{"budgets.global (file ", "1.5 is not allowed: must be an integer"},
		},
		"bool of the wrong type": {
			file:    "dryRun: 'yes please'\n",
			wantErr: ErrInvalidValue,
			want:    []string{"dryRun (file ", `"yes please" is not allowed: must be true or false`},
		},
		"string given a list": {
			file:    "kubeconfig: [a, b]\n",
			wantErr: ErrInvalidValue,
			want:    []string{"kubeconfig (file ", "a list is not allowed: must be a string"},
		},
		"map given a string": {
			file:    "schedule:\n  storageClasses: fast=@daily\n",
			wantErr: ErrInvalidValue,
			want:    []string{"schedule.storageClasses (file ", `"fast=@daily" is not allowed: must be a mapping of StorageClass name to cron spec`},
		},
		"map entry not a string": {
			file:    "schedule:\n  storageClasses:\n    fast: 5\n",
			wantErr: ErrInvalidValue,
			want:    []string{"schedule.storageClasses (file ", `5 for StorageClass "fast" is not allowed: must be a cron spec string`},
		},
		"key without a value": {
			file:    "sidecar:\n  tls:\n    caFile:\n",
			wantErr: ErrInvalidValue,
			want:    []string{"sidecar.tls.caFile (file ", "line 3): null is not allowed: must be a string; write \"\" for an empty string"},
		},
		"integer without a value": {
			file:    "budgets:\n  perNode:\n",
			wantErr: ErrInvalidValue,
			want:    []string{"budgets.perNode (file ", "line 2): null is not allowed: must be an integer; write a value or remove the key"},
		},
		"two documents": {
			file:    "dryRun: true\n---\ndryRun: false\n",
			wantErr: ErrConfigFile,
			want:    []string{"line 2: the file must hold one YAML document"},
		},
		"malformed YAML": {
			file:    "budgets:\n  global: [1, 2\n",
			wantErr: ErrConfigFile,
			want:    []string{"config: cannot read config file ", "(named by flag --config): not valid YAML: yaml: line"},
		},
		"repeated key": {
			file:    "dryRun: true\ndryRun: false\n",
			wantErr: ErrConfigFile,
			want:    []string{"not valid YAML", `"dryRun" already defined`},
		},
		"not a mapping": {
			file:    "- budgets\n",
			wantErr: ErrConfigFile,
			want:    []string{"line 1: the file must be a mapping of keys"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := load(t, tc.file, nil)
			if err == nil {
				t.Fatalf("Load succeeded, want an error containing %q", tc.want)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("error does not wrap %v: %v", tc.wantErr, err)
			}
			assertLine(t, err, tc.want...)
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent.yaml")
	tests := map[string]struct {
		env  map[string]string
		args []string
		want string
	}{
		"named by flag": {args: []string{"--config=" + missing}, want: "(named by flag --config)"},
		"named by env":  {env: map[string]string{"VOLUME_HEALER_CONFIG": missing}, want: "(named by env VOLUME_HEALER_CONFIG)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := load(t, "", tc.env, tc.args...)
			if !errors.Is(err, ErrConfigFile) || !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("want an error wrapping ErrConfigFile and os.ErrNotExist, got %v", err)
			}
			assertLine(t, err, missing, tc.want)
		})
	}
}

// TestLoadReportsAllErrors checks that every problem is reported at once, one per line, and
// that a value that could not be parsed does not also trip the rules comparing it with others.
func TestLoadReportsAllErrors(t *testing.T) {
	_, err := load(t,
		"budgets:\n  perNod: 2\n  global: lots\ntimeouts:\n  probe: 0s\n",
		map[string]string{"VOLUME_HEALER_LOG_VERBOSITY": "12"},
		"--budgets-per-driver=100", "--backoff-max=1s")
	if err == nil {
		t.Fatal("Load succeeded, want errors")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		"config: budgets.perNod ",
		"config: budgets.global ",
		"config: timeouts.probe ",
		"config: backoff.max ",
		"config: log.verbosity ",
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%v", len(lines), len(want), err)
	}
	for i, prefix := range want {
		if !strings.HasPrefix(lines[i], prefix) {
			t.Errorf("line %d = %q, want prefix %q", i+1, lines[i], prefix)
		}
	}
}

func TestLoadErrorMessageFormat(t *testing.T) {
	_, err := load(t, "", map[string]string{"VOLUME_HEALER_BUDGETS_PER_NODE": "-1"})
	want := "config: budgets.perNode (env VOLUME_HEALER_BUDGETS_PER_NODE): -1 is not allowed: must be an integer >= 1"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Key != "budgets.perNode" || fe.Value != "-1" || fe.Source != "env VOLUME_HEALER_BUDGETS_PER_NODE" {
		t.Errorf("FieldError = %+v, want key, value and source filled in", fe)
	}
}

func TestValidate(t *testing.T) {
	tests := map[string]struct {
		edit func(*Config)
		want string // empty for no error
	}{
		"valid defaults": {edit: func(*Config) {}},
		"per-node above per-driver": {
			edit: func(c *Config) { c.Budgets.PerNode = 33 },
			want: "config: budgets.perNode: 33 is not allowed: must be <= budgets.perDriver (32)",
		},
		"nil storage class map": {edit: func(c *Config) { c.Schedule.StorageClasses = nil }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := validDefault()
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Errorf("Validate = %v, want prefix %q", err, tc.want)
			}
		})
	}
}

func TestYAMLRoundTrip(t *testing.T) {
	custom := Config{
		Kubeconfig: "/home/op/.kube/config",
		LeaderElection: LeaderElection{
			Enabled: false, Namespace: "ops", LeaseName: "healer.lease",
			LeaseDuration: time.Minute, RenewDeadline: 45 * time.Second, RetryPeriod: 1500 * time.Millisecond, CallMargin: 750 * time.Millisecond,
		},
		Metrics: Metrics{BindAddress: "0"},
		Health:  Health{BindAddress: "[::1]:9443"},
		Policy: Policy{
			Namespace: "policies", LabelSelector: "tier in (gold, silver),!legacy",
			EvaluationTimeout: 250 * time.Millisecond,
		},
		Schedule: Schedule{
			Default: "",
			StorageClasses: map[string]string{
				"ceph-rbd.fast": "0 1,13 * * *",
				"cephfs":        "@every 1h30m",
				"archive":       "",
				"tz":            "CRON_TZ=UTC 30 2 * * 1-5",
			},
			Stagger: 0,
		},
		Restart:      Restart{Debounce: 0},
		ManualSweeps: ManualSweeps{PerMinute: 9, PerNamespacePerMinute: 2},
		Budgets:      Budgets{Global: 1000, PerDriver: 100, PerNode: 1},
		Timeouts:     Timeouts{Probe: 3 * time.Second, Heal: time.Hour + time.Nanosecond},
		StagedList:   StagedList{MaxVolumes: 7, MaxBytes: 5000, Timeout: 90 * time.Second},
		Backoff:      Backoff{Base: time.Second, Max: time.Second},
		DryRun:       true,
		Remediation:  Remediation{Enabled: true, DryRun: true, EvictionsPerMinute: 100, EvictionsPerNamespacePerMinute: 100, ReprobeAfter: 90 * time.Second},
		Sidecar: Sidecar{
			TLS: SidecarTLS{Enabled: true, CAFile: "true", CertFile: "# not a comment", KeyFile: "key: value",
				ServerName: "sidecar.volume-healer.svc", InsecureSkipVerify: true},
			Auth: SidecarAuth{TokenFile: "/tokens/healer", Audience: "yes"},
		},
		Log: Log{Verbosity: 10},
	}
	tests := map[string]Config{
		"defaults with CA":  validDefault(),
		"every key changed": custom,
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			if err := want.Validate(); err != nil {
				t.Fatalf("test config is invalid: %v", err)
			}
			out, err := want.YAML()
			if err != nil {
				t.Fatalf("YAML: %v", err)
			}
			got, err := loadRaw(t, string(out), nil)
			if err != nil {
				t.Fatalf("Load of the printed YAML: %v\n%s", err, out)
			}
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("round trip changed the config:\n got %+v\nwant %+v\nYAML:\n%s", *got, want, out)
			}
		})
	}

	// The output uses the file's camelCase keys and writes durations as people do.
	out, err := custom.YAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"leaderElection:\n  enabled: false\n", "  leaseDuration: 1m\n", "  bindAddress: \"0\"\n", "    insecureSkipVerify: true\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("YAML output lacks %q:\n%s", want, out)
		}
	}
}

// TestEveryFieldHasOneKey guards the key table: every leaf field of Config is reachable through
// exactly one key, so a new field cannot be forgotten in flags, environment or docs.
func TestEveryFieldHasOneKey(t *testing.T) {
	var c Config
	seen := map[any]string{}
	for _, s := range settings {
		p := s.field(&c)
		if other, dup := seen[reflect.ValueOf(p).Pointer()]; dup {
			t.Errorf("keys %s and %s point at the same field", other, s.path)
		}
		seen[reflect.ValueOf(p).Pointer()] = s.path
	}
	if n := countLeaves(reflect.TypeOf(c)); n != len(settings) {
		t.Errorf("Config has %d leaf fields but the key table has %d keys", n, len(settings))
	}
}

func countLeaves(t reflect.Type) int {
	if t.Kind() != reflect.Struct {
		return 1
	}
	n := 0
	for i := 0; i < t.NumField(); i++ {
		n += countLeaves(t.Field(i).Type)
	}
	return n
}

func TestNames(t *testing.T) {
	tests := map[string]struct{ flag, env string }{
		"leaderElection.leaseDuration": {"leader-election-lease-duration", "VOLUME_HEALER_LEADER_ELECTION_LEASE_DURATION"},
		"budgets.perNode":              {"budgets-per-node", "VOLUME_HEALER_BUDGETS_PER_NODE"},
		"sidecar.tls.caFile":           {"sidecar-tls-ca-file", "VOLUME_HEALER_SIDECAR_TLS_CA_FILE"},
		"schedule.storageClasses":      {"schedule-storage-classes", "VOLUME_HEALER_SCHEDULE_STORAGE_CLASSES"},
		"dryRun":                       {"dry-run", "VOLUME_HEALER_DRY_RUN"},
		"kubeconfig":                   {"kubeconfig", "VOLUME_HEALER_KUBECONFIG"},
	}
	for path, want := range tests {
		t.Run(path, func(t *testing.T) {
			s, ok := lookupSetting(path)
			if !ok {
				t.Fatalf("no key %s", path)
			}
			if got := s.flagName(); got != want.flag {
				t.Errorf("flag = %q, want %q", got, want.flag)
			}
			if got := s.envName(); got != want.env {
				t.Errorf("env = %q, want %q", got, want.env)
			}
		})
	}

	flags, envs := map[string]string{configFlag: "config"}, map[string]string{configEnv: "config"}
	for _, s := range settings {
		if other, dup := flags[s.flagName()]; dup {
			t.Errorf("keys %s and %s share the flag --%s", other, s.path, s.flagName())
		}
		if other, dup := envs[s.envName()]; dup {
			t.Errorf("keys %s and %s share the variable %s", other, s.path, s.envName())
		}
		flags[s.flagName()], envs[s.envName()] = s.path, s.path
	}
}

// TestFlagHelp checks that --help describes every flag and states its default once, and that
// the stated default is the real one.
func TestFlagHelp(t *testing.T) {
	fs := pflag.NewFlagSet("volume-healer", pflag.ContinueOnError)
	RegisterFlags(fs)
	usage := fs.FlagUsages()
	lines := map[string]string{}
	for _, line := range strings.Split(usage, "\n") {
		fields := strings.Fields(line)
		if len(fields) > 0 {
			name := strings.TrimPrefix(fields[0], "--")
			name, _, _ = strings.Cut(name, "[")
			lines[name] = line
		}
	}
	defaults := Default()
	check := func(name string, field any) {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("flag --%s is not registered", name)
			return
		}
		if strings.TrimSpace(f.Usage) == "" {
			t.Errorf("flag --%s has no help", name)
		}
		line := lines[name]
		if n := strings.Count(line, "(default "); n != 1 {
			t.Errorf("help of --%s states a default %d times: %q", name, n, line)
			return
		}
		stated := line[strings.LastIndex(line, "(default ")+len("(default ") : len(line)-1]
		if !statesDefault(t, stated, field) {
			t.Errorf("help of --%s states default %s, want %v", name, stated, reflect.ValueOf(field).Elem())
		}
	}
	check(configFlag, new(string))
	for _, s := range settings {
		check(s.flagName(), s.field(&defaults))
	}
	count := 0
	fs.VisitAll(func(*pflag.Flag) { count++ })
	if count != len(settings)+1 {
		t.Errorf("RegisterFlags added %d flags, want %d", count, len(settings)+1)
	}
}

// statesDefault reports whether the default as printed in --help parses back to the field value.
func statesDefault(t *testing.T, stated string, field any) bool {
	t.Helper()
	switch p := field.(type) {
	case *string:
		s, err := strconv.Unquote(stated)
		return err == nil && s == *p
	case *bool:
		b, err := strconv.ParseBool(stated)
		return err == nil && b == *p
	case *int:
		n, err := strconv.Atoi(stated)
		return err == nil && n == *p
	case *time.Duration:
		d, err := time.ParseDuration(stated)
		return err == nil && d == *p
	case *map[string]string:
		return stated == "[]" && len(*p) == 0
	}
	t.Fatalf("unsupported field type %T", field)
	return false
}

func TestFormatDuration(t *testing.T) {
	tests := map[string]struct {
		in   time.Duration
		want string
	}{
		"zero":            {0, "0s"},
		"milliseconds":    {100 * time.Millisecond, "100ms"},
		"whole minutes":   {2 * time.Minute, "2m"},
		"whole hours":     {6 * time.Hour, "6h"},
		"hours, minutes":  {90 * time.Minute, "1h30m"},
		"minutes, secs":   {90 * time.Second, "1m30s"},
		"negative":        {-5 * time.Second, "-5s"},
		"hour and a nano": {time.Hour + time.Nanosecond, "1h0m0.000000001s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := formatDuration(tc.in)
			if got != tc.want {
				t.Errorf("formatDuration(%v) = %q, want %q", tc.in, got, tc.want)
			}
			if back, err := time.ParseDuration(got); err != nil || back != tc.in {
				t.Errorf("%q parses back to %v, %v; want %v", got, back, err, tc.in)
			}
		})
	}
}

// FuzzLoad feeds arbitrary file content to Load. Load must not panic, and a configuration it
// accepts must pass Validate and survive a round trip through YAML.
func FuzzLoad(f *testing.F) {
	seeds := []string{
		"sidecar:\n  tls:\n    caFile: /ca.pem\n",
		"sidecar:\n  tls:\n    enabled: false\nbudgets:\n  global: 10\n  perDriver: 10\n  perNode: 10\nschedule:\n  storageClasses:\n    fast: '@every 1h'\n",
		"sidecar: {tls: {caFile: x}}\nmetrics: {bindAddress: 0}\nschedule: {default: 'CRON_TZ=UTC 0 3 * * *'}\n",
		"budgets:\n  perNod: 3\n",
		"timeouts: {probe: banana}\n",
		"schedule:\n  default: 'TZ=Europe/Berlin'\n",
		"schedule:\n  storageClasses:\n    Fast: '0 0 31 2 *'\n",
		"budgets: &b {global: 1}\nbackoff: *b\n",
		"[1, 2",
		"",
		"~",
		"? [a]\n: b\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(nil, lookup(map[string]string{"VOLUME_HEALER_CONFIG": path}))
		if err != nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Load accepted a config that fails Validate: %v\ninput:\n%s", err, data)
		}
		out, err := cfg.YAML()
		if err != nil {
			t.Fatalf("YAML of an accepted config: %v", err)
		}
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		again, err := Load(nil, lookup(map[string]string{"VOLUME_HEALER_CONFIG": path}))
		if err != nil {
			t.Fatalf("Load of the printed YAML: %v\nprinted:\n%s", err, out)
		}
		if !reflect.DeepEqual(again, cfg) {
			t.Fatalf("round trip changed the config:\n got %+v\nwant %+v", again, cfg)
		}
	})
}
