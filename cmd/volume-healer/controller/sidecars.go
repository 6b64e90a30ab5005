package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/probe"
)

// sidecarClient builds the client of the sidecars from the configuration; guard, when not nil,
// bounds every call (probe.Options.Guard).
func sidecarClient(cfg *config.Config, guard func(context.Context) (context.Context, func(), error)) (*probe.Client, error) {
	opts := probe.Options{
		TokenFile:    cfg.Sidecar.Auth.TokenFile,
		ProbeTimeout: cfg.Timeouts.Probe,
		HealTimeout:  cfg.Timeouts.Heal,
		Guard:        guard,
	}
	if cfg.Sidecar.TLS.Enabled {
		tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.Sidecar.TLS.ServerName, InsecureSkipVerify: cfg.Sidecar.TLS.InsecureSkipVerify} // insecureSkipVerify is an explicit, validated setting
		if cfg.Sidecar.TLS.CAFile != "" {
			pem, err := os.ReadFile(cfg.Sidecar.TLS.CAFile)
			if err != nil {
				return nil, fmt.Errorf("sidecar.tls.caFile: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("sidecar.tls.caFile %s: no PEM certificate in it", cfg.Sidecar.TLS.CAFile)
			}
			tlsCfg.RootCAs = pool
		}
		if cfg.Sidecar.TLS.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(cfg.Sidecar.TLS.CertFile, cfg.Sidecar.TLS.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("sidecar.tls.certFile and keyFile: %w", err)
			}
			tlsCfg.Certificates = []tls.Certificate{cert}
		}
		opts.TLS = tlsCfg
	}
	return probe.New(opts), nil
}
