package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/probe"
)

// SidecarServerName is the name that the certificate of node's sidecars must carry (a DNS
// subject alternative name) when sidecar.tls.serverName is base: "<node>.<base>". A node name is a
// DNS subdomain, so the name is one too.
func SidecarServerName(node, base string) string { return node + "." + base }

// sidecarClient builds the client of the sidecars from the configuration; guard, when not nil,
// bounds every call (probe.Options.Guard). Each call carries a token of the controller's
// ServiceAccount (the one sidecar.auth.tokenFile belongs to) for the called node alone, requested
// through accounts. With a client certificate it also returns the watcher that reads the
// certificate again when its files change, which must run (Start) for as long as the client.
// pvs, when not nil, gives the PersistentVolumes of the controller's caches, whose facts each
// probe and heal carries (probe.Options.PersistentVolume). signerRoots, when not nil, gives the
// CAs of the controller's own signer of the sidecars' certificates at each handshake (the current
// one and those it replaced whose certificates may still be valid), trusted besides
// sidecar.tls.caFile.
func sidecarClient(cfg *config.Config, accounts typedcorev1.ServiceAccountsGetter, guard func(context.Context) (context.Context, func(), error), pvs func(string) (*corev1.PersistentVolume, bool), signerRoots func() *x509.CertPool) (*probe.Client, *certwatcher.CertWatcher, error) {
	opts := probe.Options{
		ProbeTimeout: cfg.Timeouts.Probe,
		HealTimeout:  cfg.Timeouts.Heal,
		// One sidecar's list of staged volumes fails its own node, past these bounds.
		ListMaxEntries: cfg.StagedList.MaxVolumes,
		ListMaxBytes:   cfg.StagedList.MaxBytes,
		ListTimeout:    cfg.StagedList.Timeout,
		Guard:          guard,
		// The calls carry the PV's facts from the caches: the sidecars read no PV nor
		// VolumeAttachment per volume.
		PersistentVolume: pvs,
	}
	if cfg.Sidecar.Auth.TokenFile != "" {
		opts.Tokens = newNodeTokens(accounts, cfg.Sidecar.Auth.TokenFile, cfg.Sidecar.Auth.Audience, clock.RealClock{})
	}
	var clientCert *certwatcher.CertWatcher
	if cfg.Sidecar.TLS.Enabled {
		tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.Sidecar.TLS.ServerName, InsecureSkipVerify: cfg.Sidecar.TLS.InsecureSkipVerify} // insecureSkipVerify is an explicit, validated setting
		var filePool *x509.CertPool
		if cfg.Sidecar.TLS.CAFile != "" {
			filePool = x509.NewCertPool()
			pem, err := os.ReadFile(cfg.Sidecar.TLS.CAFile)
			if err != nil {
				return nil, nil, fmt.Errorf("sidecar.tls.caFile: %w", err)
			}
			if !filePool.AppendCertsFromPEM(pem) {
				return nil, nil, fmt.Errorf("sidecar.tls.caFile %s: no PEM certificate in it", cfg.Sidecar.TLS.CAFile)
			}
			tlsCfg.RootCAs = filePool
		}
		if signerRoots != nil && !cfg.Sidecar.TLS.InsecureSkipVerify {
			// The signer's CAs change when its Secret is renewed, and a tls.Config's RootCAs
			// cannot: each handshake verifies the chain here, against the CAs of that moment,
			// as crypto/tls would (names, validity, server auth usage).
			tlsCfg.InsecureSkipVerify = true
			tlsCfg.VerifyConnection = func(cs tls.ConnectionState) error {
				return verifySidecar(cs, filePool, signerRoots())
			}
		}
		if cfg.Sidecar.TLS.CertFile != "" {
			var err error
			if clientCert, err = certwatcher.New(cfg.Sidecar.TLS.CertFile, cfg.Sidecar.TLS.KeyFile); err != nil {
				return nil, nil, fmt.Errorf("sidecar.tls.certFile and keyFile: %w", err)
			}
			tlsCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				return clientCert.GetCertificate(nil)
			}
		}
		opts.TLS = tlsCfg
		if name := cfg.Sidecar.TLS.ServerName; name != "" && !cfg.Sidecar.TLS.InsecureSkipVerify {
			// Each node's sidecars prove their node: their certificate names <node>.<serverName>.
			opts.NodeServerName = func(node string) string { return SidecarServerName(node, name) }
		}
	}
	return probe.New(opts), clientCert, nil
}

// verifySidecar verifies a sidecar's certificate chain for the name the client asked for (SNI),
// against the CAs of sidecar.tls.caFile (fromFile, may be nil) and of the signer (signer).
func verifySidecar(cs tls.ConnectionState, fromFile, signer *x509.CertPool) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the sidecar presented no certificate")
	}
	if cs.ServerName == "" {
		// Never the case with sidecar.tls.serverName, which the signer requires: refuse rather
		// than accept a certificate for any name.
		return errors.New("no server name to verify the sidecar's certificate for")
	}
	intermediates := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		intermediates.AddCert(c)
	}
	opts := x509.VerifyOptions{Intermediates: intermediates, DNSName: cs.ServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	opts.Roots = signer
	_, err := cs.PeerCertificates[0].Verify(opts)
	if err != nil && fromFile != nil {
		// A root is one CA: a chain ends in the signer's CAs or in the file's, never in both.
		opts.Roots = fromFile
		if _, ferr := cs.PeerCertificates[0].Verify(opts); ferr == nil {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("the sidecar's certificate for %s: %w", cs.ServerName, err)
	}
	return nil
}
