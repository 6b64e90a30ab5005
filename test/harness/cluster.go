package harness

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// ControllerNamespace and ControllerAccount are the controller's ServiceAccount: the identity the
// sidecars allow by default, and the namespace of its leader election Leases.
const (
	ControllerNamespace = "volume-healer"
	ControllerAccount   = "volume-healer"
)

// tokenTTL is how long the controller's token lasts: longer than any run.
const tokenTTL = 24 * time.Hour

// ClusterOptions describe a cluster.
type ClusterOptions struct {
	// Dir holds the kubeconfig file and the controller's token. Required.
	Dir string
	// APIServerArgs are extra kube-apiserver flags, as controlplane.Options takes them.
	APIServerArgs map[string]string
	// EtcdArgs are extra etcd flags, as controlplane.Options takes them.
	EtcdArgs map[string]string
}

// Cluster is a started control plane in which the controller's ServiceAccount exists.
type Cluster struct {
	*controlplane.Env
	// TokenFile holds a token of the controller's ServiceAccount, which the controller, run as a
	// process outside the cluster, presents to the sidecars as its pod would a projected token.
	TokenFile string
}

// StartCluster starts kube-apiserver and etcd, waits until the apiserver is ready, and creates
// the controller's namespace, ServiceAccount and token. The caller must call Stop.
func StartCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	env, err := controlplane.New(controlplane.Options{KubeconfigDir: o.Dir, APIServerArgs: o.APIServerArgs, EtcdArgs: o.EtcdArgs})
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	c := &Cluster{Env: env, TokenFile: filepath.Join(o.Dir, "controller-token")}
	if err := c.init(ctx); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) init(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.Ready(ctx); err != nil {
		return err
	}
	cs := c.Clientset
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ControllerNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := cs.CoreV1().ServiceAccounts(ControllerNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ControllerAccount}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	return controlplane.WriteServiceAccountToken(ctx, cs, ControllerNamespace, ControllerAccount, tokenTTL, c.TokenFile)
}

// ControllerSettings are the settings any controller against the cluster needs, as VOLUME_HEALER_*
// names without the prefix: the kubeconfig, the token it shows the sidecars, and the sidecars
// without TLS (they serve on loopback). A caller adds its own to the map.
func (c *Cluster) ControllerSettings() map[string]string {
	return map[string]string{
		"KUBECONFIG":              c.Kubeconfig,
		"SIDECAR_TLS_ENABLED":     "false",
		"SIDECAR_AUTH_TOKEN_FILE": c.TokenFile,
	}
}
