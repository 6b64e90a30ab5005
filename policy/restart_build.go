package policy

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// PodScope is what the restart decisions of one volume's pods share: their namespace, the
// volume's StorageClass and the namespace's PodDisruptionBudgets. ReadPodScope reads it once for
// all the pods of a claim.
type PodScope struct {
	// Namespace is the claim's namespace with its labels.
	Namespace Labeled
	// StorageClass is the volume's StorageClass with its labels; nil when the PV names none.
	StorageClass *Labeled
	// Budgets are the namespace's PodDisruptionBudgets.
	Budgets []policyv1.PodDisruptionBudget
}

// ReadPodScope reads the namespace, the StorageClass named storageClass (none when empty; a
// StorageClass that no longer exists has no labels) and the namespace's PodDisruptionBudgets:
// two GETs and one LIST.
func ReadPodScope(ctx context.Context, client kubernetes.Interface, namespace, storageClass string) (PodScope, error) {
	ns, err := client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	if err != nil {
		return PodScope{}, fmt.Errorf("reading Namespace %s: %w", namespace, err)
	}
	scope := PodScope{Namespace: Labeled{Name: namespace, Labels: ns.Labels}}
	if storageClass != "" {
		sc, err := getOptional(client.StorageV1().StorageClasses().Get(ctx, storageClass, metav1.GetOptions{}))
		if err != nil {
			return PodScope{}, fmt.Errorf("reading StorageClass %s: %w", storageClass, err)
		}
		scope.StorageClass = &Labeled{Name: storageClass}
		if sc != nil {
			scope.StorageClass.Labels = sc.Labels
		}
	}
	pdbs, err := client.PolicyV1().PodDisruptionBudgets(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return PodScope{}, fmt.Errorf("listing the PodDisruptionBudgets of namespace %s: %w", namespace, err)
	}
	scope.Budgets = pdbs.Items
	return scope, nil
}

// Input builds the restart input of pod from the volume's input in and the time now, for the
// remedy heal and the finding of in's probe (its first reason); a recycle sets Remedy and Finding
// itself.
func (s PodScope) Input(in Input, pod *corev1.Pod, now time.Time) RestartInput {
	return RestartInput{
		Input:   in,
		Remedy:  RemedyHeal,
		Finding: FindingOf(in.Probe),
		Pod: Pod{
			Namespace:        pod.Namespace,
			Name:             pod.Name,
			OwnerKind:        ownerKind(pod),
			Labels:           pod.Labels,
			DisruptionBudget: s.covered(pod),
			RestartPolicy:    string(pod.Spec.RestartPolicy),
		},
		Namespace:    s.Namespace,
		StorageClass: s.StorageClass,
		Time:         now,
	}
}

// FindingOf is the finding a remedy names: the reason of the probe's first problem, or "" when the
// probe is absent or names none.
func FindingOf(p *ProbeResult) string {
	if p == nil {
		return ""
	}
	for _, h := range p.Health {
		if h.Reason != "" {
			return h.Reason
		}
	}
	return ""
}

// ownerKind is the kind of the pod's controller, empty for a bare pod.
func ownerKind(pod *corev1.Pod) string {
	if ref := metav1.GetControllerOf(pod); ref != nil {
		return ref.Kind
	}
	return ""
}

// covered reports whether a PodDisruptionBudget of the namespace selects the pod. A budget with
// an invalid selector is taken to cover it: the API server would refuse the eviction anyway.
func (s PodScope) covered(pod *corev1.Pod) bool {
	for i := range s.Budgets {
		sel, err := metav1.LabelSelectorAsSelector(s.Budgets[i].Spec.Selector)
		if err != nil {
			return true
		}
		if !sel.Empty() && sel.Matches(labels.Set(pod.Labels)) {
			return true
		}
	}
	return false
}
