package controller

import (
	"context"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/informers/internalinterfaces"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler/planner"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
)

// watchTriggers feeds CSIAddonsNode and StorageClass changes from the shared informers to the
// sidecar targets and to the restart and periodic triggers. It returns the handlers'
// registrations, which report when each handler has been given every object of the first list.
func watchTriggers(ctx context.Context, factory informers.SharedInformerFactory, nodes toolscache.SharedIndexInformer, targets *healer.TargetMap,
	history forgetter, sidecars connections, t triggers) ([]toolscache.ResourceEventHandlerRegistration, error) {
	var regs []toolscache.ResourceEventHandlerRegistration
	add := func(informer toolscache.SharedIndexInformer, h toolscache.ResourceEventHandler) error {
		reg, err := informer.AddEventHandler(h)
		if err == nil {
			regs = append(regs, reg)
		}
		return err
	}
	// Whether a CSIAddonsNode's Node is gone is known only once the Node cache has synced: until
	// then, CSIAddonsNodes wait, so that none of a Node deleted before the controller started becomes
	// a target or starts a restart sweep.
	nodeInformer := factory.Core().V1().Nodes().Informer()
	// restarted is true for a new object and for one whose restart marker changed: a sidecar
	// announced a start at its endpoint.
	observeNode := func(obj any, restarted bool) {
		n := csiAddonsNodeFrom(obj)
		if n == nil {
			return
		}
		if !nodeInformer.HasSynced() && !toolscache.WaitForCacheSync(ctx.Done(), nodeInformer.HasSynced) {
			return
		}
		// A sidecar that moved gets a new connection; the old one is closed.
		if stale := targets.Set(n); stale != "" {
			sidecars.Forget(stale)
		}
		if _, kept := targets.Object(types.NamespacedName{Namespace: n.Namespace, Name: n.Name}); !kept {
			// Its Node is gone: no sidecar serves there, and a restart sweep would find none.
			klog.FromContext(ctx).V(2).Info("CSIAddonsNode of a Node that is gone: not a sidecar target", "csiAddonsNode", klog.KObj(n), "node", n.Spec.Driver.NodeID)
			t.restarts.Forget(types.NamespacedName{Namespace: n.Namespace, Name: n.Name})
			history.ForgetNode(n.Spec.Driver.Name, n.Spec.Driver.NodeID)
			t.manual.Observe(ctx, n)
			return
		}
		if target, err := probe.TargetFor(n); restarted && err == nil {
			// The connection to the sidecar that was there may be waiting out gRPC's
			// reconnection backoff: the restart sweep's first calls must reach the new one now.
			sidecars.Redial(target.Endpoint)
		}
		t.restarts.Observe(ctx, n)
		t.manual.Observe(ctx, n)
	}
	if err := add(nodes, toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { observeNode(obj, true) },
		UpdateFunc: func(before, obj any) {
			old, n := csiAddonsNodeFrom(before), csiAddonsNodeFrom(obj)
			observeNode(obj, old == nil || n == nil || old.Annotations[annotations.HealerRestart] != n.Annotations[annotations.HealerRestart])
		},
		DeleteFunc: func(obj any) {
			if n := csiAddonsNodeFrom(obj); n != nil {
				key := types.NamespacedName{Namespace: n.Namespace, Name: n.Name}
				if endpoint := targets.Delete(key); endpoint != "" {
					sidecars.Forget(endpoint)
				}
				t.restarts.Forget(key)
				t.manual.Forget(n)
				history.ForgetNode(n.Spec.Driver.Name, n.Spec.Driver.NodeID)
			}
		},
	}); err != nil {
		return nil, err
	}
	err := add(factory.Storage().V1().StorageClasses().Informer(), toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { setClass(ctx, t, obj) },
		UpdateFunc: func(_, obj any) { setClass(ctx, t, obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if sc, ok := obj.(*storagev1.StorageClass); ok {
				t.periodic.RemoveStorageClass(sc.Name)
				history.ForgetStorageClass(sc.Name)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	// A deleted PV's history goes with it.
	err = add(factory.Core().V1().PersistentVolumes().Informer(), toolscache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if pv := planner.PersistentVolumeFrom(obj); pv != nil {
				history.Forget(pv)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	// PVCs carry manual sweep requests for their volume.
	observeClaim := func(obj any) {
		if pvc := planner.ClaimFrom(obj); pvc != nil {
			t.manual.Observe(ctx, pvc)
		}
	}
	err = add(factory.Core().V1().PersistentVolumeClaims().Informer(), toolscache.ResourceEventHandlerFuncs{
		AddFunc:    observeClaim,
		UpdateFunc: func(_, obj any) { observeClaim(obj) },
		DeleteFunc: func(obj any) {
			if pvc := planner.ClaimFrom(obj); pvc != nil {
				t.manual.Forget(pvc)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	// A deleted Node takes its sidecar targets with it: its CSIAddonsNodes may stay behind, but no
	// sidecar answers there, and sweeps must not keep dialling it.
	nodeLister := factory.Core().V1().Nodes().Lister()
	targets.SetNodeExists(func(name string) bool {
		if !nodeInformer.HasSynced() {
			return true // not known to be gone yet
		}
		_, err := nodeLister.Get(name)
		return !apierrors.IsNotFound(err)
	})
	drop := func(dropped []*csiaddonsv1alpha1.CSIAddonsNode, endpoints []string) {
		for _, ep := range endpoints {
			sidecars.Forget(ep)
		}
		for _, n := range dropped {
			klog.FromContext(ctx).V(2).Info("Sidecar target dropped: its Node is gone", "csiAddonsNode", klog.KObj(n), "driver", n.Spec.Driver.Name, "node", n.Spec.Driver.NodeID)
			t.restarts.Forget(types.NamespacedName{Namespace: n.Namespace, Name: n.Name})
			history.ForgetNode(n.Spec.Driver.Name, n.Spec.Driver.NodeID)
		}
	}
	err = add(nodeInformer, toolscache.ResourceEventHandlerDetailedFuncs{
		// A Node that joins after its CSIAddonsNode was seen (the two caches deliver independently)
		// makes that CSIAddonsNode a target, and its restart marker a sweep.
		AddFunc: func(obj any, isInInitialList bool) {
			node, ok := obj.(*corev1.Node)
			if !ok || isInInitialList {
				return
			}
			for _, o := range nodes.GetStore().List() {
				if n := csiAddonsNodeFrom(o); n != nil && n.Spec.Driver.NodeID == node.Name {
					observeNode(n, false)
				}
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if node, ok := obj.(*corev1.Node); ok {
				drop(targets.DeleteNode(node.Name))
			}
		},
	})
	if err != nil {
		return nil, err
	}
	return regs, nil
}

// forgetter drops what the sweeper remembers of a deleted PV or StorageClass (*healer.Sweeper).
type forgetter interface {
	Forget(pv *corev1.PersistentVolume)
	ForgetStorageClass(name string)
	ForgetNode(driver, node string)
}

// connections closes the connection to a sidecar that moved or went away (*probe.Client).
type connections interface {
	Forget(endpoint string)
	Redial(endpoint string)
}

var (
	_ forgetter   = (*healer.Sweeper)(nil)
	_ connections = (*probe.Client)(nil)
)

// triggers are what turns object changes into sweeps.
type triggers struct {
	restarts *trigger.Restarts
	periodic *trigger.Periodic
	manual   *trigger.Manual
}

func csiAddonsNodeFrom(obj any) *csiaddonsv1alpha1.CSIAddonsNode {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	n, _ := obj.(*csiaddonsv1alpha1.CSIAddonsNode)
	return n
}

func setClass(ctx context.Context, t triggers, obj any) {
	if sc, ok := obj.(*storagev1.StorageClass); ok {
		t.periodic.SetStorageClass(ctx, sc)
		t.manual.Observe(ctx, sc)
	}
}

// csiAddonsNodeInformer makes the shared factory's CSIAddonsNode informer: CSIAddonsNode is a
// custom resource, which client-go's typed clientset does not know, so it lists and watches through
// a controller-runtime client.
func csiAddonsNodeInformer(c client.WithWatch) internalinterfaces.NewInformerFunc {
	return func(_ kubernetes.Interface, resync time.Duration) toolscache.SharedIndexInformer {
		lw := &toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				list := &csiaddonsv1alpha1.CSIAddonsNodeList{}
				err := c.List(ctx, list, &client.ListOptions{Raw: &opts})
				return list, err
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				return c.Watch(ctx, &csiaddonsv1alpha1.CSIAddonsNodeList{}, &client.ListOptions{Raw: &opts})
			},
		}
		// A client that says it cannot stream lists (a fake in tests) gets plain LIST and WATCH.
		return toolscache.NewSharedIndexInformer(toolscache.ToListWatcherWithWatchListSemantics(lw, c),
			&csiaddonsv1alpha1.CSIAddonsNode{}, resync, toolscache.Indexers{})
	}
}
