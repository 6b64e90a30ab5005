package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestNoNodeSpeaksForAnother runs two nodes' plugins as processes, swept by the controller, and
// then calls node B's sidecar as an attacker would: with the controller's token captured at node
// A it is refused (UNAUTHENTICATED), and with a token good for node B a probe or a heal of node A's
// volume is refused (FAILED_PRECONDITION) without reaching node B's driver, while node B's own
// volume is answered.
func TestNoNodeSpeaksForAnother(t *testing.T) {
	f := newFixture(t, "nospeak")
	class := f.StorageClass("nospeak-rbd-nbd", "rbd-nbd", nil)
	a, b := f.newNode("nospeak-node-a"), f.newNode("nospeak-node-b")
	volsA := f.newVolumes(a, class, "rbd-nbd", "a", 1)
	volsB := f.newVolumes(b, class, "rbd-nbd", "b", 1)
	f.CreateVolumes(append(volsA, volsB...), true)
	a.start()
	b.start()
	c := f.startController("nospeak", budgets{global: 4, perDriver: 4, perNode: 2}.settings())
	f.SweepsFinished([]string{a.name, b.name}, 2*time.Minute)
	c.MustRun()

	// What the controller sent to node A, and what node A's plugin could replay.
	tokenFor := func(node string) string {
		tr, err := f.Clientset.CoreV1().ServiceAccounts(harness.ControllerNamespace).CreateToken(f.Ctx(), harness.ControllerAccount,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
				Audiences: []string{healerv1alpha1.NodeTokenAudience(healerv1alpha1.DefaultTokenAudience, node)},
			}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	endpoint := f.AddonsNode(b.name).Annotations[annotations.Endpoint]
	conn, err := grpc.NewClient("passthrough:///"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sidecarB := healerv1alpha1.NewNodeHealerClient(conn)
	as := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(f.Ctx(), "authorization", "Bearer "+token)
	}
	calls := func() map[string]int64 {
		t.Helper()
		c, err := b.control.Counters(f.Ctx())
		if err != nil {
			t.Fatalf("read the counters of the driver on %s: %v", b.name, err)
		}
		return c.Calls
	}
	probesBefore, healsBefore := calls()["ProbeVolume"], calls()["HealVolume"]

	capturedAtA := as(tokenFor(a.name))
	if _, err := sidecarB.ProbeVolume(capturedAtA, &healerv1alpha1.NodeProbeVolumeRequest{PvName: volsB[0].PV}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("node B's sidecar with the token captured at node A: %v, want UNAUTHENTICATED", err)
	}
	forB := as(tokenFor(b.name))
	if _, err := sidecarB.ProbeVolume(forB, &healerv1alpha1.NodeProbeVolumeRequest{PvName: volsA[0].PV}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("probe of node A's volume at node B's sidecar: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := sidecarB.HealVolume(forB, &healerv1alpha1.NodeHealVolumeRequest{PvName: volsA[0].PV}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("heal of node A's volume at node B's sidecar: %v, want FAILED_PRECONDITION", err)
	}
	if c := calls(); c["ProbeVolume"] != probesBefore || c["HealVolume"] != healsBefore {
		t.Errorf("refused calls reached node B's driver: %d probes, %d heals", c["ProbeVolume"]-probesBefore, c["HealVolume"]-healsBefore)
	}
	if _, err := sidecarB.ProbeVolume(forB, &healerv1alpha1.NodeProbeVolumeRequest{PvName: volsB[0].PV}); err != nil {
		t.Errorf("probe of node B's own volume with node B's token: %v", err)
	}
}

// TestSidecarProvesItsNode runs two nodes' sidecars with TLS, their certificates issued per node
// by the CA the controller trusts: node A's names node-a, and node B's plugin answers with node
// A's certificate, as a node holding another node's key would. The controller, which dials node
// N's sidecar for the name <N>.healer-sidecar, sweeps node A and refuses node B's sidecar at the
// handshake, before any call: node B's driver is never asked to probe. Once node B's sidecar
// serves node B's own certificate, node B is swept.
func TestSidecarProvesItsNode(t *testing.T) {
	f := newFixture(t, "proof")
	class := f.StorageClass("proof-rbd-nbd", "rbd-nbd", nil)
	a, b := f.newNode("proof-node-a"), f.newNode("proof-node-b")
	volsA := f.newVolumes(a, class, "rbd-nbd", "a", 1)
	volsB := f.newVolumes(b, class, "rbd-nbd", "b", 1)
	f.CreateVolumes(append(volsA, volsB...), true)

	ca, err := harness.NewCA("healer sidecar CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	// tlsArgs issues the certificate of node and returns the sidecar flags that serve it.
	tlsArgs := func(node string) []string {
		certPEM, keyPEM, err := ca.Issue(node + ".healer-sidecar")
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile := filepath.Join(dir, node+".crt"), filepath.Join(dir, node+".key")
		if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{"--tls-cert-file", certFile, "--tls-key-file", keyFile}
	}
	a.sidecarArgs = append(tlsArgs(a.name), "--tls-server-name", "healer-sidecar")
	b.sidecarArgs = tlsArgs(a.name)
	a.start()
	b.start()
	c := f.startController("proof", map[string]string{
		"SIDECAR_TLS_ENABLED":     "true",
		"SIDECAR_TLS_CA_FILE":     caFile,
		"SIDECAR_TLS_SERVER_NAME": "healer-sidecar",
	})
	f.SweepsFinished([]string{a.name}, 2*time.Minute)
	if probes := probed(t, f, a); probes == 0 {
		t.Errorf("node A's driver was not probed in its sweep")
	}
	refusal := b.name + ".healer-sidecar"
	err = harness.WaitFor(f.Ctx(), time.Minute, "the controller to refuse node B's sidecar", func() (bool, string) {
		c.MustRun()
		return c.LogContains(refusal), "no refusal naming " + refusal + " in the controller's log yet"
	})
	if err != nil {
		t.Fatal(err)
	}
	if probes := probed(t, f, b); probes != 0 {
		t.Errorf("node B's driver was probed %d times through a sidecar with node A's certificate; want none", probes)
	}

	// Node B's sidecar with node B's own certificate: swept.
	if err := b.stopSidecar(); err != nil {
		t.Fatal(err)
	}
	b.sidecarArgs = append(tlsArgs(b.name), "--tls-server-name", "healer-sidecar")
	b.startSidecar(true)
	f.SweepsFinished([]string{b.name}, 2*time.Minute)
	if probes := probed(t, f, b); probes == 0 {
		t.Errorf("node B's driver was not probed once its sidecar proved node B")
	}
}

// probed returns how many probes the driver of n has served.
func probed(t *testing.T, f *fixture, n *node) int64 {
	t.Helper()
	c, err := n.control.Counters(f.Ctx())
	if err != nil {
		t.Fatalf("read the counters of the driver on %s: %v", n.name, err)
	}
	return c.Calls["ProbeVolume"]
}
