package sidecar

import (
	"context"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/config"
)

// Run is the sidecar binary's body: it sets the Go memory limit from the cgroup, connects to the
// API server (kubeconfig, or the pod's ServiceAccount when empty), builds the sidecar from opts
// with a registry of its own, and serves until ctx ends.
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
	s, err := New(opts)
	if err != nil {
		return err
	}
	return s.Start(ctx)
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
