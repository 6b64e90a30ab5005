package config

import "strings"

// Warning is a setting that loads and runs but turns a protection off. The controller logs each
// one at start; it is not an error, since tests and demos need these settings.
type Warning struct {
	// Key is the key as spelled in the configuration file, e.g. "sidecar.tls.serverName".
	Key string
	// Message says what the setting turns off and what to set instead.
	Message string
}

// String renders the warning on one line, starting with the key.
func (w Warning) String() string { return "config: " + w.Key + " " + w.Message }

// Warnings lists the settings of c that turn off the binding of each sidecar to its node: the
// check that the sidecar answering for node N holds a certificate for N.<sidecar.tls.serverName>.
// Without it, a sidecar (or anyone holding one sidecar's key) can answer for every node. The most
// fundamental one is reported alone: TLS off, then verification off, then no server name. With
// node binding on, it reports a signer of the sidecars' certificates that allows no requester.
func (c *Config) Warnings() []Warning {
	tls := c.Sidecar.TLS
	switch {
	case !tls.Enabled:
		return []Warning{{Key: "sidecar.tls.enabled", Message: "is false: the controller talks to the sidecars in clear text, " +
			"sends its tokens unencrypted and checks no sidecar's identity, so node binding is off; for tests only, set it to true"}}
	case tls.InsecureSkipVerify:
		return []Warning{{Key: "sidecar.tls.insecureSkipVerify", Message: "is true: the sidecars' certificates are not verified, " +
			"so any server can answer for any node (node binding is off) and receive the controller's tokens; for tests only, " +
			"set it to false and name the CA in sidecar.tls.caFile"}}
	case tls.ServerName == "":
		return []Warning{{Key: "sidecar.tls.serverName", Message: "is empty: node binding is off: a sidecar's certificate is " +
			"checked against the host part of its address, not against its node, so one node's sidecar key can answer for " +
			"another node; set it to the base of the names in the sidecars' certificates (<node>.<serverName>)"}}
	}
	if tls.Signer.Enabled && strings.TrimSpace(tls.Signer.Requesters) == "" {
		return []Warning{{Key: "sidecar.tls.signer.requesters", Message: "is empty: the signer denies every sidecar's certificate " +
			"request, and sidecars that ask for theirs (--tls-cert-dir) do not start; name the node plugins' ServiceAccounts " +
			"(system:serviceaccount:<namespace>:<name>, separated by commas)"}}
	}
	return nil
}
