package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
)

func newSweepCommand() *cobra.Command {
	kube := newKubeFlags()
	var storageClass, pvc, driver, node string
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "sweep (--storage-class NAME | --pvc [NAMESPACE/]NAME | --driver NAME --node NAME)",
		Short: "Ask the controller for an immediate sweep of a StorageClass, a PVC's volume, or a driver on a node",
		Long: "sweep sets the " + annotations.SweepRequest + " annotation on the StorageClass, PVC or\n" +
			"CSIAddonsNode; the controller sweeps the volumes it selects once, then copies the request to\n" +
			annotations.SweepHandled + " and records a ManualSweepFinished Event.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if pvc != "" {
				var err error
				if pvc, err = qualifyPVC(kube, pvc); err != nil {
					return err
				}
			}
			c, err := kube.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			obj, err := sweepTarget(ctx, c, storageClass, pvc, driver, node)
			if err != nil {
				return err
			}
			request := time.Now().UTC().Format(time.RFC3339Nano)
			if err := trigger.RequestSweep(ctx, c, obj, request); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sweep %s requested on %s %s\n", request, kindOf(obj), name(obj))
			if !wait {
				return nil
			}
			return waitForSweep(ctx, cmd, c, obj, request, timeout)
		},
	}
	f := cmd.Flags()
	kube.addTo(f)
	f.StringVar(&storageClass, "storage-class", "", "sweep the volumes of this StorageClass")
	f.StringVar(&pvc, "pvc", "", "sweep the volume of this PVC, as NAMESPACE/NAME, or NAME in -n's namespace (default: the context's)")
	f.StringVar(&driver, "driver", "", "with --node: sweep this CSI driver's volumes on the node")
	f.StringVar(&node, "node", "", "with --driver: the node")
	f.BoolVar(&wait, "wait", false, "wait until the controller has finished the sweep and print its outcome")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "with --wait: how long to wait")
	return cmd
}

// qualifyPVC makes a --pvc value NAMESPACE/NAME: a bare NAME is in -n's namespace, or the
// kubeconfig context's; a NAMESPACE/NAME must not contradict -n.
func qualifyPVC(kube *kubeFlags, pvc string) (string, error) {
	if ns, _, ok := strings.Cut(pvc, "/"); ok {
		if kube.namespaceGiven() && ns != *kube.flags.Namespace {
			return "", fmt.Errorf("--pvc %s is in namespace %s, but -n says %s: give one of them", pvc, ns, *kube.flags.Namespace)
		}
		return pvc, nil
	}
	ns, err := kube.namespace()
	if err != nil {
		return "", err
	}
	return ns + "/" + pvc, nil
}

// sweepTarget finds the object that carries the request.
func sweepTarget(ctx context.Context, c client.Client, storageClass, pvc, driver, node string) (client.Object, error) {
	set := 0
	for _, v := range []string{storageClass, pvc, driver + node} {
		if v != "" {
			set++
		}
	}
	if set != 1 || (driver == "") != (node == "") {
		return nil, errors.New("name exactly one of --storage-class, --pvc, or --driver together with --node")
	}
	switch {
	case storageClass != "":
		var sc storagev1.StorageClass
		if err := c.Get(ctx, client.ObjectKey{Name: storageClass}, &sc); err != nil {
			return nil, fmt.Errorf("StorageClass %s: %w", storageClass, err)
		}
		return &sc, nil
	case pvc != "":
		ns, n, ok := strings.Cut(pvc, "/")
		if !ok || ns == "" || n == "" {
			return nil, fmt.Errorf("--pvc %q: want NAMESPACE/NAME", pvc)
		}
		var claim corev1.PersistentVolumeClaim
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: n}, &claim); err != nil {
			return nil, fmt.Errorf("PVC %s: %w", pvc, err)
		}
		if claim.Spec.VolumeName == "" {
			return nil, fmt.Errorf("PVC %s is not bound: no volume to sweep", pvc)
		}
		return &claim, nil
	default:
		var list csiaddonsv1alpha1.CSIAddonsNodeList
		if err := c.List(ctx, &list); err != nil {
			return nil, fmt.Errorf("list CSIAddonsNodes: %w", err)
		}
		for i := range list.Items {
			n := &list.Items[i]
			if n.Spec.Driver.Name == driver && n.Spec.Driver.NodeID == node {
				return n, nil
			}
		}
		return nil, fmt.Errorf("no CSIAddonsNode for driver %s on node %s: is its node plugin running?", driver, node)
	}
}

func waitForSweep(ctx context.Context, cmd *cobra.Command, c client.Client, obj client.Object, request string, timeout time.Duration) error {
	key := client.ObjectKeyFromObject(obj)
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, key, obj); err != nil {
			return false, err
		}
		return trigger.SweepHandled(obj, request), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for sweep %s on %s %s: %w (is the controller running?)", request, kindOf(obj), name(obj), err)
	}
	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(obj.GetNamespace()), client.MatchingFieldsSelector{
		Selector: fields.SelectorFromSet(fields.Set{"involvedObject.name": obj.GetName(), "reason": "ManualSweepFinished"}),
	}); err == nil {
		for _, e := range events.Items {
			if strings.Contains(e.Message, request) {
				fmt.Fprintln(cmd.OutOrStdout(), e.Message)
				return nil
			}
		}
	}
	fmt.Fprintf(cmd.OutOrStdout(), "sweep %s finished\n", request)
	return nil
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *storagev1.StorageClass:
		return "StorageClass"
	case *corev1.PersistentVolumeClaim:
		return "PersistentVolumeClaim"
	default:
		return "CSIAddonsNode"
	}
}

func name(obj client.Object) string {
	if obj.GetNamespace() == "" {
		return obj.GetName()
	}
	return obj.GetNamespace() + "/" + obj.GetName()
}
