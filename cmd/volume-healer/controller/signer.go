package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/volume-healer/volume-healer/cmd/volume-healer/controller/sidecarsigner"
	"github.com/volume-healer/volume-healer/config"
)

// caTimeout bounds the read (or creation) of the sidecar signer's CA at start.
const caTimeout = 30 * time.Second

// newSidecarSigner reads the CA of the sidecars' certificates from sidecar.tls.signer.caSecret,
// creating it on the first start, and makes the signer, when sidecar.tls.signer.enabled; it
// returns the reloader that reads the Secret again (the CA may be cert-manager's, renewed in
// place), whose Pool the client of the sidecars trusts. Every replica reads the CA and runs the
// reloader; the leader alone runs the signer.
func newSidecarSigner(ctx context.Context, cfg *config.Config, k *kube) (*sidecarsigner.Signer, *sidecarsigner.CAReloader, error) {
	sc := cfg.Sidecar.TLS.Signer
	if !sc.Enabled {
		return nil, nil, nil
	}
	namespace, name, _ := strings.Cut(sc.CASecret, "/")
	requesters, err := config.SignerRequesters(sc.Requesters)
	if err != nil {
		return nil, nil, fmt.Errorf("sidecar.tls.signer.requesters: %w", err)
	}
	caCtx, cancel := context.WithTimeout(ctx, caTimeout)
	defer cancel()
	ca, err := sidecarsigner.LoadOrCreateCA(caCtx, k.clientset.CoreV1().Secrets(namespace), name, time.Now())
	if err != nil {
		return nil, nil, fmt.Errorf("sidecar.tls.signer.caSecret: %w", err)
	}
	reloader, err := sidecarsigner.NewCAReloader(sidecarsigner.ReloaderOptions{
		Secrets:      k.clientset.CoreV1().Secrets(namespace),
		Namespace:    namespace,
		Name:         name,
		Initial:      ca,
		LeafValidity: sc.Validity,
	})
	if err != nil {
		return nil, nil, err
	}
	signer, err := sidecarsigner.New(sidecarsigner.Options{
		Client:     k.clientset,
		CAs:        reloader,
		ServerName: cfg.Sidecar.TLS.ServerName,
		Requesters: requesters,
		Validity:   sc.Validity,
		Recorder:   k.recorder,
	})
	if err != nil {
		return nil, nil, err
	}
	return signer, reloader, nil
}
