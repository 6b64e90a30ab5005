package planner

import (
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volume-healer/volume-healer/policy"
)

// policyTerms remembers the policy input parts that every volume of a StorageClass or of a node
// shares, with their Rego form, so that an evaluation converts only what is the volume's own.
// Entries are keyed by the cached object itself (policy.TermCache).
type policyTerms struct {
	classes     *policy.TermCache[*storagev1.StorageClass, classTerm]
	nodes       *policy.TermCache[*corev1.Node, nodeTerm]
	attachments *policy.TermCache[attachmentKey, policy.Term]
}

// maxTermEntries bounds each cache of policyTerms: more than the StorageClasses, and than the
// nodes of the largest clusters Kubernetes supports (5,000).
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
		classes:     policy.NewTermCache[*storagev1.StorageClass, classTerm](maxTermEntries),
		nodes:       policy.NewTermCache[*corev1.Node, nodeTerm](maxTermEntries),
		attachments: policy.NewTermCache[attachmentKey, policy.Term](maxTermEntries),
	}
}

// class returns the input part of a StorageClass, shared: read-only.
func (t *policyTerms) class(sc *storagev1.StorageClass) classTerm {
	return t.classes.Get(sc, func() classTerm {
		p := &policy.StorageClass{Name: sc.Name, Parameters: sc.Parameters}
		return classTerm{class: p, term: policy.StorageClassTerm(p)}
	})
}

// node returns the input part of a Node, shared: read-only.
func (t *policyTerms) node(n *corev1.Node) nodeTerm {
	return t.nodes.Get(n, func() nodeTerm {
		p := &policy.Node{Name: n.Name, Labels: n.Labels}
		return nodeTerm{node: p, term: policy.NodeTerm(p)}
	})
}

// attachment returns the Rego form of a.
func (t *policyTerms) attachment(a *policy.Attachment) policy.Term {
	return t.attachments.Get(attachmentKey{a.Node, a.Attached, a.Detaching}, func() policy.Term { return policy.AttachmentTerm(a) })
}
