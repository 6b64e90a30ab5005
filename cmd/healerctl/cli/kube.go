package cli

import (
	"fmt"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kubeFlags are kubectl's own flags for reaching a cluster, from k8s.io/cli-runtime, so that
// healerctl and `kubectl healer` take what users type to kubectl: --kubeconfig (else $KUBECONFIG,
// a list of files merged, else ~/.kube/config), --context, -n/--namespace, --as, --as-group,
// --server, --token, --request-timeout and the rest of kubectl's set.
type kubeFlags struct {
	flags *genericclioptions.ConfigFlags
}

func newKubeFlags() *kubeFlags {
	f := genericclioptions.NewConfigFlags(true)
	// healerctl asks no discovery questions, so kubectl's discovery cache folder means nothing
	// here; without it the flag is not offered.
	f.CacheDir = nil
	return &kubeFlags{flags: f}
}

func (k *kubeFlags) addTo(f *pflag.FlagSet) {
	k.flags.AddFlags(f)
}

// config loads the client configuration.
func (k *kubeFlags) config() (*rest.Config, error) {
	cfg, err := k.flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "healerctl"
	return cfg, nil
}

// namespace is -n, else the namespace of the kubeconfig's context, else "default", as kubectl
// decides it.
func (k *kubeFlags) namespace() (string, error) {
	ns, _, err := k.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("kubeconfig: %w", err)
	}
	return ns, nil
}

// namespaceGiven reports whether -n/--namespace was given on the command line.
func (k *kubeFlags) namespaceGiven() bool {
	return k.flags.Namespace != nil && *k.flags.Namespace != ""
}

// client returns a client that knows the built-in types and CSIAddonsNode.
func (k *kubeFlags) client() (client.Client, error) {
	cfg, err := k.config()
	if err != nil {
		return nil, err
	}
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := csiaddonsv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: s})
}
