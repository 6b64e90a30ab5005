package controller

import (
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/discovery"
)

// The Kubernetes releases the warnings at start compare the cluster with (docs/operations.md,
// "Kubernetes versions").
var (
	// oldestSupported is the oldest release this one is tested against (make test-oldest) and the
	// charts' kubeVersion.
	oldestSupported = utilversion.MajorMinor(1, 30)
	// nodeBindingSince is the first release whose projected ServiceAccount tokens always name their
	// pod's node (the node-name claim, which the node binding's ValidatingAdmissionPolicy reads);
	// 1.30 and 1.31 add it only while a beta feature gate is on.
	nodeBindingSince = utilversion.MajorMinor(1, 32)
)

// admissionRegistrationV1 is the group version of ValidatingAdmissionPolicies.
const admissionRegistrationV1 = "admissionregistration.k8s.io/v1"

// clusterWarnings reads the API server's version and its admissionregistration.k8s.io/v1
// resources, and returns what an operator of this cluster must know: a release older than the
// oldest supported, and a cluster that cannot hold the node binding, where a node plugin can write
// another node's CSIAddonsNode. A failed look-up is itself a warning: the controller starts anyway.
func clusterWarnings(d discovery.DiscoveryInterface) []string {
	info, err := d.ServerVersion()
	if err != nil {
		return []string{fmt.Sprintf("could not read the API server's version (%v): the controller cannot tell whether this cluster is supported and holds the node binding", err)}
	}
	v, err := utilversion.ParseGeneric(info.GitVersion)
	if err != nil {
		return []string{fmt.Sprintf("the API server reports version %q, which is not a Kubernetes version: the controller cannot tell whether this cluster is supported and holds the node binding", info.GitVersion)}
	}
	var warnings []string
	if v.LessThan(oldestSupported) {
		warnings = append(warnings, fmt.Sprintf("the API server is Kubernetes %s, older than %d.%d, the oldest release this volume-healer is tested against; upgrade the cluster (docs/operations.md, \"Kubernetes versions\")",
			info.GitVersion, oldestSupported.Major(), oldestSupported.Minor()))
	}
	var lacks string
	resources, err := d.ServerResourcesForGroupVersion(admissionRegistrationV1)
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return append(warnings, fmt.Sprintf("could not list the API server's %s resources (%v): the controller cannot tell whether this cluster holds the node binding", admissionRegistrationV1, err))
	case err != nil || !slices.ContainsFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Name == "validatingadmissionpolicies" }):
		lacks = "serves no " + admissionRegistrationV1 + " ValidatingAdmissionPolicies"
	case v.LessThan(nodeBindingSince):
		lacks = fmt.Sprintf("issues ServiceAccount tokens that name their pod's node only while a beta feature gate is on (for good from %d.%d)", nodeBindingSince.Major(), nodeBindingSince.Minor())
	}
	if lacks != "" {
		warnings = append(warnings, fmt.Sprintf("the API server (Kubernetes %s) %s: the node binding, the ValidatingAdmissionPolicy that lets a node plugin write only its own node's CSIAddonsNodes, is left out by the chart here (unless sidecar.nodeBinding is always), and without it a node plugin can write another node's CSIAddonsNode. "+
			"This controller still sends a node's calls and token only to a sidecar whose certificate names that node (sidecar.tls, which the signer issues only to a pod on that node), so such a write stops that node's heals but cannot receive them; upgrade to Kubernetes %d.%d (docs/operations.md, \"Kubernetes versions\")",
			info.GitVersion, lacks, nodeBindingSince.Major(), nodeBindingSince.Minor()))
	}
	return warnings
}
