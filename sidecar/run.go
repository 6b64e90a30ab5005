package sidecar

import (
	"context"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/config"
)

// Run is the sidecar binary's body: it sets the Go memory limit from the cgroup, connects to the
// API server (kubeconfig, or the pod's ServiceAccount when empty), builds the sidecar from opts
// with a registry of its own, and serves until ctx ends. With TLSCertificateRequestDir, it first
// asks for the serving certificate (ServingCertificates) and renews it while it serves.
func Run(ctx context.Context, opts Options, kubeconfig string) error {
	if limit, err := config.SetMemoryLimit("/sys/fs/cgroup", os.LookupEnv); err != nil {
		klog.FromContext(ctx).Error(err, "Running without a Go memory limit")
	} else {
		klog.FromContext(ctx).Info("Go memory limit", "bytes", limit.Bytes, "source", limit.Source)
	}
	restCfg, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	restCfg.UserAgent = "volume-healer-sidecar"
	opts.KubeConfig = restCfg
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	opts.Registry = reg
	var certs *ServingCertificates
	if opts.TLSCertificateRequestDir != "" {
		if certs, err = requestedCertificates(restCfg, &opts); err != nil {
			return err
		}
		if err := certs.Ensure(ctx); err != nil {
			return err
		}
	}
	s, err := New(opts)
	if err != nil {
		return err
	}
	if certs == nil {
		return s.Start(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		_ = certs.Run(ctx)
	}()
	err = s.Start(ctx)
	cancel()
	<-renewed
	return err
}

// requestedCertificates checks the options of a certificate obtained by request and points
// TLSCertFile and TLSKeyFile at its files.
func requestedCertificates(restCfg *rest.Config, opts *Options) (*ServingCertificates, error) {
	if opts.Insecure || opts.TLSCertFile != "" || opts.TLSKeyFile != "" {
		return nil, fmt.Errorf("%w: TLSCertificateRequestDir (--tls-cert-dir) asks for the certificate; "+
			"it cannot be given with Insecure (--insecure) or with TLSCertFile and TLSKeyFile (--tls-cert-file, --tls-key-file)", ErrInvalidOptions)
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	certs, err := NewServingCertificates(CertificateRequestOptions{
		Requests:   kube.CertificatesV1().CertificateSigningRequests(),
		NodeName:   opts.NodeName,
		ServerName: opts.TLSServerName,
		Dir:        opts.TLSCertificateRequestDir,
		Validity:   opts.TLSCertificateValidity,
	})
	if err != nil {
		return nil, err
	}
	opts.TLSCertFile, opts.TLSKeyFile = certs.CertFile(), certs.KeyFile()
	return certs, nil
}

// restConfig loads kubeconfig, or the in-cluster configuration when it is empty.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return c, nil
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster configuration (outside a pod, pass --kubeconfig): %w", err)
	}
	return c, nil
}
