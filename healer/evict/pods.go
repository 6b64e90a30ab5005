package evict

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/volume-healer/volume-healer/policy"
)

// findPods lists the pods of the claim's namespace on node (one LIST with a spec.nodeName field
// selector: the API server filters, and nothing is cached between calls, so the controller's
// memory does not grow with the cluster's pods; docs/performance.md has the measurements) and
// returns those on node that use the claim and may have mounted the volume before since (the heal)
// and still run on it, as runsOnMount decides with lastEviction. Pods that are terminating or have
// ended are left out: they need no eviction.
func findPods(ctx context.Context, kube kubernetes.Interface, namespace, claim, node string, since, lastEviction time.Time, timeout time.Duration) ([]corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	list, err := kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of namespace %s on node %s: %w", namespace, node, err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		// The field selector already keeps to node; the check stays so that a pod of another
		// node is never restarted, whatever the list returned.
		if p.Spec.NodeName == node && usesClaim(&p, claim) && runsOnMount(&p, since, lastEviction) {
			out = append(out, p)
		}
	}
	return out, nil
}

// usesClaim reports whether the pod mounts the claim.
func usesClaim(p *corev1.Pod, claim string) bool {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
			return true
		}
	}
	return false
}

// receivesRepairs reports whether the mount a heal stacks on the volume's publish target reaches
// every container of the pod that mounts the claim: each mounts it with HostToContainer or
// Bidirectional propagation, so kubelet made the container's copy a slave of the node's mount,
// and no dead copy of the volume's mount can stay in the pod after a heal. A dead copy that a
// heal still finds then lives in some other mount namespace (a container runtime's, while it
// sets up a container: it copies the node's mounts and makes them private), which restarting
// this pod would not change. A pod whose containers do not mount the claim at all is not
// judged here: it reports false.
func receivesRepairs(p *corev1.Pod, claim string) bool {
	mounted := false
	for _, v := range policy.ClaimVolumesOf(&p.Spec) {
		if v.Claim != claim {
			continue
		}
		for _, m := range v.Mounts {
			mounted = true
			if m.Propagation == "" || m.Propagation == string(corev1.MountPropagationNone) {
				return false
			}
		}
	}
	return mounted
}

// runsOnMount reports whether the pod may still hold the mount it got before since: it was
// created before then, is not terminating, and has not ended. A pod created after since (a
// replacement, a new pod) got the repaired mount.
//
// Creation times are whole seconds, so a pod created in since's own second may have come before
// the heal or after it. It counts as on the dead mount (the heal found processes there, and
// leaving a pod on a dead mount leaves it broken, while evicting a pod that has just started
// costs it little) unless lastEviction, when the evictor last evicted a pod of the volume on the
// node, is before that second ended: then the pod may be that pod's replacement, which the
// ReplicaSet or StatefulSet created with the repaired mount.
func runsOnMount(p *corev1.Pod, since, lastEviction time.Time) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	second := since.Truncate(time.Second)
	created := p.CreationTimestamp.Time
	switch {
	case created.Before(second):
		return true
	case created.After(second):
		return false
	default:
		return lastEviction.IsZero() || !lastEviction.Before(second.Add(time.Second))
	}
}
