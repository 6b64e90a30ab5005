package controller

import (
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// The warnings' distinctive words.
const (
	warnTooOld     = "older than 1.30, the oldest release"
	warnNoBinding  = "the node binding, the ValidatingAdmissionPolicy that lets a node plugin write only its own node's CSIAddonsNodes, is left out by the chart here"
	warnNoPolicies = "serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies"
	warnNoClaim    = "name their pod's node only while a beta feature gate is on"
)

// TestClusterWarnings: the controller warns at start of a cluster older than the oldest supported
// release and of one that cannot hold the node binding (no ValidatingAdmissionPolicies, or tokens
// that need not name their node), saying why, and of nothing on a current cluster.
func TestClusterWarnings(t *testing.T) {
	policies := &metav1.APIResourceList{GroupVersion: admissionRegistrationV1, APIResources: []metav1.APIResource{
		{Name: "validatingwebhookconfigurations"}, {Name: "validatingadmissionpolicies"}, {Name: "validatingadmissionpolicybindings"},
	}}
	webhooksOnly := &metav1.APIResourceList{GroupVersion: admissionRegistrationV1, APIResources: []metav1.APIResource{
		{Name: "validatingwebhookconfigurations"}, {Name: "mutatingwebhookconfigurations"},
	}}
	for name, tc := range map[string]struct {
		version   string
		resources []*metav1.APIResourceList
		reactor   func() error
		want      []string
	}{
		"1.37 with policies":             {version: "v1.37.2", resources: []*metav1.APIResourceList{policies}},
		"1.32 with policies":             {version: "v1.32.13", resources: []*metav1.APIResourceList{policies}},
		"1.30: tokens may lack the node": {version: "v1.30.14", resources: []*metav1.APIResourceList{policies}, want: []string{warnNoBinding + "|" + warnNoClaim}},
		"1.37 with policies turned off":  {version: "v1.37.2", resources: []*metav1.APIResourceList{webhooksOnly}, want: []string{warnNoBinding + "|" + warnNoPolicies}},
		"1.29, a provider's build":       {version: "v1.29.6-eks-1234", resources: []*metav1.APIResourceList{webhooksOnly}, want: []string{warnTooOld, warnNoBinding + "|" + warnNoPolicies}},
		"version unknown":                {version: "unknown", want: []string{`reports version "unknown", which is not a Kubernetes version`}},
	} {
		t.Run(name, func(t *testing.T) {
			d := &fakediscovery.FakeDiscovery{Fake: &k8stesting.Fake{Resources: tc.resources}, FakedServerVersion: &version.Info{GitVersion: tc.version}}
			got := clusterWarnings(d)
			if len(got) != len(tc.want) {
				t.Fatalf("Kubernetes %s: %d warnings, want %d:\n%s", tc.version, len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for i, want := range tc.want {
				for _, part := range strings.Split(want, "|") {
					if !strings.Contains(got[i], part) {
						t.Errorf("Kubernetes %s: warning %d is\n  %s\nwant it to say %q", tc.version, i, got[i], part)
					}
				}
				if !strings.Contains(got[i], tc.version) {
					t.Errorf("warning %q does not name the cluster's version %s", got[i], tc.version)
				}
			}
		})
	}

	t.Run("discovery fails", func(t *testing.T) {
		fake := &k8stesting.Fake{}
		fake.AddReactor("get", "version", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("connection refused")
		})
		got := clusterWarnings(&fakediscovery.FakeDiscovery{Fake: fake})
		if len(got) != 1 || !strings.Contains(got[0], "could not read the API server's version (connection refused)") {
			t.Errorf("warnings %q, want one saying the version could not be read and why", got)
		}
	})
}

// TestClusterWarningsOfTheRealAPIServer reads the warnings from the API server the tests run
// against (make test: 1.37, make test-oldest: the oldest supported release): none at 1.32 and
// later, the missing node binding before.
func TestClusterWarningsOfTheRealAPIServer(t *testing.T) {
	env := controlplane.Start(t)
	minor, err := env.Minor()
	if err != nil {
		t.Fatal(err)
	}
	got := clusterWarnings(env.Clientset.Discovery())
	switch {
	case minor >= 32 && len(got) != 0:
		t.Errorf("Kubernetes 1.%d: warnings %q, want none", minor, got)
	case minor < 32 && (len(got) != 1 || !strings.Contains(got[0], warnNoBinding)):
		t.Errorf("Kubernetes 1.%d: warnings %q, want the one of the missing node binding", minor, got)
	}
}
