package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Validate checks every value and the rules between them, and returns all problems joined, one
// per line, each naming the key, the value and what is allowed. Load calls it and adds where
// each value came from.
func (c *Config) Validate() error {
	var errs []error
	for _, is := range c.validate() {
		errs = append(errs, is.fieldError(""))
	}
	return errors.Join(errs...)
}

// issue is one broken rule, before Load adds the source of the value.
type issue struct {
	key    string
	value  string
	reason string
	// related names other keys the rule compares against; Load drops the issue when one of them
	// could not be parsed, since the rule would then be judging a default.
	related []string
}

func (is issue) fieldError(source string) *FieldError {
	return &FieldError{Key: is.key, Source: source, Value: is.value, Reason: is.reason, Err: ErrInvalidValue}
}

// checker collects issues in the order of the key table.
type checker struct {
	issues []issue
}

func (v *checker) add(key, value, reason string, related ...string) {
	v.issues = append(v.issues, issue{key: key, value: value, reason: reason, related: related})
}

func (v *checker) positive(key string, d time.Duration) {
	if d <= 0 {
		v.add(key, formatDuration(d), "must be a duration > 0")
	}
}

func (v *checker) notNegative(key string, d time.Duration) {
	if d < 0 {
		v.add(key, formatDuration(d), "must be a duration >= 0")
	}
}

func (v *checker) atLeastOne(key string, n int) {
	if n < 1 {
		v.add(key, strconv.Itoa(n), "must be an integer >= 1")
	}
}

func (v *checker) dnsLabel(key, name string) {
	if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
		v.add(key, strconv.Quote(name), "must be a DNS-1123 label: "+strings.Join(msgs, "; "))
	}
}

func (v *checker) dnsSubdomain(key, name string) {
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		v.add(key, strconv.Quote(name), "must be a DNS-1123 subdomain: "+strings.Join(msgs, "; "))
	}
}

func (v *checker) hostPort(key, addr, alternative string) {
	if err := checkHostPort(addr); err != nil {
		v.add(key, strconv.Quote(addr), "must be host:port with a port from 0 to 65535"+alternative+": "+err.Error())
	}
}

func (c *Config) validate() []issue {
	var v checker

	le := c.LeaderElection
	v.positive("leaderElection.leaseDuration", le.LeaseDuration)
	v.positive("leaderElection.renewDeadline", le.RenewDeadline)
	v.positive("leaderElection.retryPeriod", le.RetryPeriod)
	if le.RenewDeadline > 0 && le.LeaseDuration > 0 && le.RenewDeadline >= le.LeaseDuration {
		v.add("leaderElection.renewDeadline", formatDuration(le.RenewDeadline),
			fmt.Sprintf("must be less than leaderElection.leaseDuration (%s), or another replica takes over while the leader still acts", formatDuration(le.LeaseDuration)),
			"leaderElection.leaseDuration")
	}
	if le.RetryPeriod > 0 && le.RenewDeadline > 0 && le.RetryPeriod >= le.RenewDeadline {
		v.add("leaderElection.retryPeriod", formatDuration(le.RetryPeriod),
			fmt.Sprintf("must be less than leaderElection.renewDeadline (%s), or the leader gets no second try to renew", formatDuration(le.RenewDeadline)),
			"leaderElection.renewDeadline")
	}
	v.positive("leaderElection.callMargin", le.CallMargin)
	// callTime is the least time a call has before another replica could take the Lease over: a
	// call starts at most a retry period after the last renewal, and must end the margin before
	// the Lease's duration from it has passed. Zero: not known, or nothing.
	var callTime time.Duration
	if le.Enabled {
		v.dnsLabel("leaderElection.namespace", le.Namespace)
		v.dnsSubdomain("leaderElection.leaseName", le.LeaseName)
		if le.LeaseDuration > 0 && le.LeaseDuration%time.Second != 0 {
			v.add("leaderElection.leaseDuration", formatDuration(le.LeaseDuration),
				"must be whole seconds, such as 60s, with leader election enabled: the Lease records its duration in seconds, and the other replicas wait that long",
				"leaderElection.enabled")
		}
		if le.LeaseDuration > 0 && le.RetryPeriod > 0 && le.CallMargin > 0 {
			callTime = le.LeaseDuration.Truncate(time.Second) - le.RetryPeriod - le.CallMargin
			if callTime <= 0 {
				v.add("leaderElection.callMargin", formatDuration(le.CallMargin),
					fmt.Sprintf("must be less than leaderElection.leaseDuration (%s) - leaderElection.retryPeriod (%s), or no call to a sidecar has any time",
						formatDuration(le.LeaseDuration), formatDuration(le.RetryPeriod)),
					"leaderElection.enabled", "leaderElection.leaseDuration", "leaderElection.retryPeriod")
			}
		}
	}

	if c.Metrics.BindAddress != "0" {
		v.hostPort("metrics.bindAddress", c.Metrics.BindAddress, `, or "0" to turn metrics off`)
	}
	v.hostPort("health.bindAddress", c.Health.BindAddress, "")

	v.dnsLabel("policy.namespace", c.Policy.Namespace)
	if _, err := labels.Parse(c.Policy.LabelSelector); err != nil {
		v.add("policy.labelSelector", strconv.Quote(c.Policy.LabelSelector),
			"must be a label selector such as app=healer,tier in (a,b): "+err.Error())
	}
	v.positive("policy.evaluationTimeout", c.Policy.EvaluationTimeout)

	if w := c.Webhook; w.Enabled {
		v.hostPort("webhook.bindAddress", w.BindAddress, "")
		if w.CertFile == "" {
			v.add("webhook.certFile", `""`, "must name the PEM serving certificate of the webhook when webhook.enabled is true", "webhook.enabled")
		}
		if w.KeyFile == "" {
			v.add("webhook.keyFile", `""`, "must name the PEM private key of the webhook's certificate when webhook.enabled is true", "webhook.enabled")
		}
	}
	if c.PropagationWebhook.Enabled && !c.Webhook.Enabled {
		v.add("propagationWebhook.enabled", "true",
			"needs webhook.enabled: the propagation webhook is served beside the policy webhook, on webhook.bindAddress with its certificate", "webhook.enabled")
	}

	if c.Schedule.Default != "" {
		if err := checkCron(c.Schedule.Default); err != nil {
			v.add("schedule.default", strconv.Quote(c.Schedule.Default), cronForms+`, or "" for no default sweep: `+err.Error())
		}
	}
	for _, name := range sortedKeys(c.Schedule.StorageClasses) {
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			v.add("schedule.storageClasses", "StorageClass name "+strconv.Quote(name),
				"must be a DNS-1123 subdomain: "+strings.Join(msgs, "; "))
		}
		if spec := c.Schedule.StorageClasses[name]; spec != "" {
			if err := checkCron(spec); err != nil {
				v.add("schedule.storageClasses", fmt.Sprintf("schedule %q of StorageClass %q", spec, name),
					cronForms+`, or "" for no periodic sweep of that class: `+err.Error())
			}
		}
	}
	v.notNegative("schedule.stagger", c.Schedule.Stagger)
	v.notNegative("restart.debounce", c.Restart.Debounce)

	ms := c.ManualSweeps
	v.atLeastOne("manualSweeps.perMinute", ms.PerMinute)
	v.atLeastOne("manualSweeps.perNamespacePerMinute", ms.PerNamespacePerMinute)
	if ms.PerMinute >= 1 && ms.PerNamespacePerMinute > ms.PerMinute {
		v.add("manualSweeps.perNamespacePerMinute", strconv.Itoa(ms.PerNamespacePerMinute),
			fmt.Sprintf("must be <= manualSweeps.perMinute (%d): the cluster's budget is always spent first, so the namespace's could never be reached", ms.PerMinute),
			"manualSweeps.perMinute")
	}

	b := c.Budgets
	v.atLeastOne("budgets.global", b.Global)
	v.atLeastOne("budgets.perDriver", b.PerDriver)
	v.atLeastOne("budgets.perNode", b.PerNode)
	if b.PerDriver >= 1 && b.Global >= 1 && b.PerDriver > b.Global {
		v.add("budgets.perDriver", strconv.Itoa(b.PerDriver),
			fmt.Sprintf("must be <= budgets.global (%d): the global limit is always reached first, so the per-driver limit could never be reached", b.Global),
			"budgets.global")
	}
	if b.PerNode >= 1 && b.PerDriver >= 1 && b.PerNode > b.PerDriver {
		v.add("budgets.perNode", strconv.Itoa(b.PerNode),
			fmt.Sprintf("must be <= budgets.perDriver (%d): the per-driver limit is always reached first, so the per-node limit could never be reached", b.PerDriver),
			"budgets.perDriver")
	}

	r := c.Remediation
	v.atLeastOne("remediation.evictionsPerMinute", r.EvictionsPerMinute)
	v.atLeastOne("remediation.evictionsPerNamespacePerMinute", r.EvictionsPerNamespacePerMinute)
	v.positive("remediation.reprobeAfter", r.ReprobeAfter)
	if r.EvictionsPerMinute >= 1 && r.EvictionsPerNamespacePerMinute > r.EvictionsPerMinute {
		v.add("remediation.evictionsPerNamespacePerMinute", strconv.Itoa(r.EvictionsPerNamespacePerMinute),
			fmt.Sprintf("must be <= remediation.evictionsPerMinute (%d): the cluster's budget is always spent first, so the namespace's could never be reached", r.EvictionsPerMinute),
			"remediation.evictionsPerMinute")
	}

	v.positive("timeouts.probe", c.Timeouts.Probe)
	v.positive("timeouts.heal", c.Timeouts.Heal)
	for _, t := range []struct {
		key     string
		timeout time.Duration
	}{{"timeouts.probe", c.Timeouts.Probe}, {"timeouts.heal", c.Timeouts.Heal}} {
		if callTime > 0 && t.timeout > callTime {
			v.add(t.key, formatDuration(t.timeout), fmt.Sprintf(
				"must be at most %s with leader election enabled: leaderElection.leaseDuration (%s) - leaderElection.retryPeriod (%s) - leaderElection.callMargin (%s), "+
					"the least time the leader is sure to hold the Lease when a call starts, and every call ends by then; lower %s, or raise leaderElection.leaseDuration (docs/operations.md)",
				formatDuration(callTime), formatDuration(le.LeaseDuration), formatDuration(le.RetryPeriod), formatDuration(le.CallMargin), t.key),
				"leaderElection.enabled", "leaderElection.leaseDuration", "leaderElection.retryPeriod", "leaderElection.callMargin")
		}
	}

	v.atLeastOne("stagedList.maxVolumes", c.StagedList.MaxVolumes)
	if c.StagedList.MaxBytes < minStagedListBytes {
		v.add("stagedList.maxBytes", strconv.Itoa(c.StagedList.MaxBytes), fmt.Sprintf(
			"must be an integer >= %d: a smaller bound refuses the list of a node with a few volumes", minStagedListBytes))
	}
	v.positive("stagedList.timeout", c.StagedList.Timeout)

	v.positive("backoff.base", c.Backoff.Base)
	if c.Backoff.Base > 0 && c.Backoff.Max < c.Backoff.Base {
		v.add("backoff.max", formatDuration(c.Backoff.Max),
			fmt.Sprintf("must be a duration >= backoff.base (%s)", formatDuration(c.Backoff.Base)), "backoff.base")
	}

	tls := c.Sidecar.TLS
	if tls.CertFile != "" && tls.KeyFile == "" {
		v.add("sidecar.tls.keyFile", `""`,
			"must be set when sidecar.tls.certFile is set: a client certificate is useless without its private key",
			"sidecar.tls.certFile")
	}
	if tls.KeyFile != "" && tls.CertFile == "" {
		v.add("sidecar.tls.certFile", `""`,
			"must be set when sidecar.tls.keyFile is set: a private key is useless without its client certificate",
			"sidecar.tls.keyFile")
	}
	if tls.Enabled && !tls.InsecureSkipVerify && tls.CAFile == "" {
		v.add("sidecar.tls.caFile", `""`,
			"a CA file is required when sidecar.tls.enabled is true and sidecar.tls.insecureSkipVerify is false: "+
				"name the PEM bundle of the CAs that sign the sidecars' serving certificates",
			"sidecar.tls.enabled", "sidecar.tls.insecureSkipVerify")
	}
	if c.Sidecar.Auth.TokenFile == "" {
		v.add("sidecar.auth.tokenFile", `""`, "must name a file holding a token of the controller's ServiceAccount, for which the controller requests each node's sidecar token")
	}
	if c.Sidecar.Auth.Audience == "" {
		v.add("sidecar.auth.audience", `""`, "must name the base of the sidecars' token audiences, as their --token-audience does (default volume-healer-sidecar)")
	}

	if c.Log.Verbosity < 0 || c.Log.Verbosity > 10 {
		v.add("log.verbosity", strconv.Itoa(c.Log.Verbosity), "must be an integer from 0 to 10")
	}
	return v.issues
}

// minStagedListBytes is the least stagedList.maxBytes: room for about twenty volumes.
const minStagedListBytes = 4096

// cronForms says what a schedule may look like, for error messages.
const cronForms = `must be a cron spec: five fields such as "0 */6 * * *", or a descriptor such as @hourly or @every 1h`

// checkCron parses spec the way the scheduler will and rejects specs that parse but can never
// work; the scheduler owns those rules.
func checkCron(spec string) error {
	_, err := CheckSchedule(spec)
	return err
}

// checkHostPort accepts host:port with a numeric port from 0 to 65535 and any (or no) host.
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}
