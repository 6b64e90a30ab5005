package controller

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/test/harness"
)

// nodeSidecar answers capabilities for one driver and counts the calls that reached it.
type nodeSidecar struct {
	healerv1alpha1.UnimplementedNodeHealerServer
	calls atomic.Int32
}

func (s *nodeSidecar) GetHealerCapabilities(context.Context, *healerv1alpha1.NodeGetHealerCapabilitiesRequest) (*healerv1alpha1.NodeGetHealerCapabilitiesResponse, error) {
	s.calls.Add(1)
	return &healerv1alpha1.NodeGetHealerCapabilitiesResponse{DriverName: "rbd.csi.ceph.com"}, nil
}

// serveTLS serves a nodeSidecar with the key pair and returns its address.
func serveTLS(t *testing.T, certPEM, keyPEM []byte) (string, *nodeSidecar) {
	t.Helper()
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})))
	s := &nodeSidecar{}
	healerv1alpha1.RegisterNodeHealerServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), s
}

// TestSidecarCertificatesNameTheirNode: with sidecar.tls.serverName set, the controller accepts
// node A's sidecar with a certificate for node-a.<serverName>, and refuses, before any call, a
// sidecar at node B's address that answers with node A's certificate: a node's key cannot speak
// for another node.
func TestSidecarCertificatesNameTheirNode(t *testing.T) {
	ca, err := harness.NewCA("sidecar CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	certA, keyA, err := ca.Issue(SidecarServerName("node-a", "healer-sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	addrA, sidecarA := serveTLS(t, certA, keyA)
	// Node B's address, answered with node A's certificate: a compromised node A that took
	// over node B's address, or node B's plugin holding node A's key.
	addrB, sidecarB := serveTLS(t, certA, keyA)

	cfg := config.Default()
	cfg.Sidecar.Auth.TokenFile = ""
	cfg.Sidecar.TLS.CAFile = caFile
	cfg.Sidecar.TLS.ServerName = "healer-sidecar"
	client, _, err := sidecarClient(&cfg, nil, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()

	if _, err := client.Capabilities(ctx, probe.Target{Driver: "rbd.csi.ceph.com", Node: "node-a", Endpoint: addrA}); err != nil {
		t.Errorf("node A's sidecar with node A's certificate: %v, want its capabilities", err)
	}
	_, err = client.Capabilities(ctx, probe.Target{Driver: "rbd.csi.ceph.com", Node: "node-b", Endpoint: addrB})
	if err == nil || !strings.Contains(err.Error(), "node-b.healer-sidecar") {
		t.Errorf("node B's address answered with node A's certificate: %v, want a refusal naming node-b.healer-sidecar", err)
	}
	if n := sidecarB.calls.Load(); n != 0 {
		t.Errorf("%d calls reached the sidecar with another node's certificate; want none", n)
	}
	if n := sidecarA.calls.Load(); n != 1 {
		t.Errorf("%d calls reached node A's sidecar, want 1", n)
	}
}

// TestSidecarClientTrustsTheSignerAndTheCAFile: during an upgrade from certificates made outside
// the cluster, the controller trusts both the CA of sidecar.tls.caFile and its signer's CA, and
// no other.
func TestSidecarClientTrustsTheSignerAndTheCAFile(t *testing.T) {
	old, err := harness.NewCA("sidecar CA made outside the cluster")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := harness.NewCA("volume-healer sidecar CA")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := harness.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, old.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	serve := func(ca *harness.CA, node string) string {
		cert, key, err := ca.Issue(SidecarServerName(node, "healer-sidecar"))
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := serveTLS(t, cert, key)
		return addr
	}
	cfg := config.Default()
	cfg.Sidecar.Auth.TokenFile = ""
	cfg.Sidecar.TLS.CAFile = caFile
	cfg.Sidecar.TLS.ServerName = "healer-sidecar"
	client, _, err := sidecarClient(&cfg, nil, nil, nil, signer.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	for node, tc := range map[string]struct {
		ca      *harness.CA
		trusted bool
	}{
		"node-old":      {old, true},
		"node-signed":   {signer, true},
		"node-stranger": {stranger, false},
	} {
		_, err := client.Capabilities(ctx, probe.Target{Driver: "rbd.csi.ceph.com", Node: node, Endpoint: serve(tc.ca, node)})
		if (err == nil) != tc.trusted {
			t.Errorf("sidecar of %s: %v; want trusted %v", node, err, tc.trusted)
		}
	}
}
