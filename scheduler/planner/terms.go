package planner

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volume-healer/volume-healer/policy"
)

// policyTerms remembers the policy input parts that every volume of a StorageClass or of a node
// shares, with their Rego form, so that an evaluation converts only what is the volume's own.
// Entries are keyed by the cached object itself: an informer replaces an object on every update,
// so an entry never goes stale, and the maps are emptied when they outgrow maxTermEntries, which
// bounds what replaced objects keep alive.
type policyTerms struct {
	mu          sync.Mutex
	classes     map[*storagev1.StorageClass]classTerm
	nodes       map[*corev1.Node]nodeTerm
	attachments map[attachmentKey]policy.Term
}

// maxTermEntries bounds each map of policyTerms: more than the StorageClasses, and than the nodes
// of the largest clusters Kubernetes supports (5,000).
const maxTermEntries = 16384

type classTerm struct {
	class *policy.StorageClass
	term  policy.Term
}

type nodeTerm struct {
	node *policy.Node
	term policy.Term
}

type attachmentKey struct {
	node                string
	attached, detaching bool
}

func newPolicyTerms() *policyTerms {
	return &policyTerms{
		classes:     map[*storagev1.StorageClass]classTerm{},
		nodes:       map[*corev1.Node]nodeTerm{},
		attachments: map[attachmentKey]policy.Term{},
	}
}

// class returns the input part of a StorageClass, shared: read-only.
func (t *policyTerms) class(sc *storagev1.StorageClass) classTerm {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.classes[sc]; ok {
		return c
	}
	if len(t.classes) >= maxTermEntries {
		clear(t.classes)
	}
	p := &policy.StorageClass{Name: sc.Name, Parameters: sc.Parameters}
	c := classTerm{class: p, term: policy.StorageClassTerm(p)}
	t.classes[sc] = c
	return c
}

// node returns the input part of a Node, shared: read-only.
func (t *policyTerms) node(n *corev1.Node) nodeTerm {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.nodes[n]; ok {
		return c
	}
	if len(t.nodes) >= maxTermEntries {
		clear(t.nodes)
	}
	p := &policy.Node{Name: n.Name, Labels: n.Labels}
	c := nodeTerm{node: p, term: policy.NodeTerm(p)}
	t.nodes[n] = c
	return c
}

// attachment returns the Rego form of a.
func (t *policyTerms) attachment(a *policy.Attachment) policy.Term {
	key := attachmentKey{a.Node, a.Attached, a.Detaching}
	t.mu.Lock()
	defer t.mu.Unlock()
	if term, ok := t.attachments[key]; ok {
		return term
	}
	if len(t.attachments) >= maxTermEntries {
		clear(t.attachments)
	}
	term := policy.AttachmentTerm(a)
	t.attachments[key] = term
	return term
}
