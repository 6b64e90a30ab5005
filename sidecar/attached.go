package sidecar

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// nodeSyncWait is how long a call waits for the first read of the sidecar's Node object (one
// LIST of one object, made when the sidecar starts) before it checks the volume's attachment the
// way an older sidecar did, with a GET of its VolumeAttachment. A watch that failed (no list or
// watch on Nodes granted, the API server unreachable) is not waited for.
const nodeSyncWait = 2 * time.Second

// nodeAttachments is the sidecar's view of its own Node's status.volumesAttached, through a watch
// of that one object (a field selector on its name): which volumes the attach/detach controller
// says are attached to the node. It costs the API server one LIST and one WATCH per sidecar start,
// whatever the number of volumes, and keeps of the Node the names alone.
type nodeAttachments struct {
	informer cache.SharedIndexInformer
	nodeName string

	mu sync.Mutex
	// watchErr is the last error of the watch, nil once it has listed.
	watchErr error
}

func newNodeAttachments(client kubernetes.Interface, nodeName string) *nodeAttachments {
	selector := fields.OneTermEqualSelector(metav1.ObjectNameField, nodeName).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return client.CoreV1().Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return client.CoreV1().Nodes().Watch(ctx, o)
		},
	}
	n := &nodeAttachments{nodeName: nodeName}
	n.informer = cache.NewSharedIndexInformerWithOptions(lw, &corev1.Node{}, cache.SharedIndexInformerOptions{})
	_ = n.informer.SetTransform(leanNode)
	_ = n.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		n.mu.Lock()
		n.watchErr = err
		n.mu.Unlock()
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	return n
}

// leanNode keeps of a Node its name and the names of its attached volumes.
func leanNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	lean := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name, ResourceVersion: node.ResourceVersion}}
	if len(node.Status.VolumesAttached) > 0 {
		lean.Status.VolumesAttached = make([]corev1.AttachedVolume, len(node.Status.VolumesAttached))
		for i, v := range node.Status.VolumesAttached {
			lean.Status.VolumesAttached[i] = corev1.AttachedVolume{Name: v.Name}
		}
	}
	return lean, nil
}

// run watches the Node until ctx is done.
func (n *nodeAttachments) run(ctx context.Context) {
	n.informer.RunWithContext(ctx)
}

// attached reports whether the Node lists the volume of driverName with volumeHandle as attached.
// known is false when the Node has not been read (yet): the watch failed, or did not list within
// nodeSyncWait of the call, or the Node does not exist.
func (n *nodeAttachments) attached(ctx context.Context, driverName, volumeHandle string) (attached, known bool) {
	if !n.informer.HasSynced() {
		n.mu.Lock()
		failed := n.watchErr != nil
		n.mu.Unlock()
		if failed {
			return false, false
		}
		wctx, cancel := context.WithTimeout(ctx, nodeSyncWait)
		synced := cache.WaitForCacheSync(wctx.Done(), n.informer.HasSynced)
		cancel()
		if !synced {
			klog.FromContext(ctx).V(2).Info("The sidecar's Node is not read yet; checking the attachment with a GET of the VolumeAttachment", "waited", nodeSyncWait)
			return false, false
		}
	}
	obj, ok, err := n.informer.GetStore().GetByKey(n.nodeName)
	if err != nil || !ok {
		return false, false
	}
	name := healerv1alpha1.AttachedVolumeName(driverName, volumeHandle)
	for _, v := range obj.(*corev1.Node).Status.VolumesAttached {
		if string(v.Name) == name {
			return true, true
		}
	}
	return false, true
}

// String names what the watch reads, for logs.
func (n *nodeAttachments) String() string {
	return fmt.Sprintf("Node %q status.volumesAttached", n.nodeName)
}
