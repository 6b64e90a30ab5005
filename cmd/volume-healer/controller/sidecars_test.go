package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
// the cluster, the controller trusts both the CA of sidecar.tls.caFile and its signer's CAs, and
// no other; the signer's CAs are read at each new connection, so a renewed CA (and the replaced
// one, while the reloader keeps it) is trusted without a restart, and each certificate must
// still name the node it is dialled for.
func TestSidecarClientTrustsTheSignerAndTheCAFile(t *testing.T) {
	old, err := harness.NewCA("sidecar CA made outside the cluster")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := harness.NewCA("volume-healer sidecar CA")
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := harness.NewCA("volume-healer sidecar CA")
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
	serve := func(ca *harness.CA, certNode string) string {
		cert, key, err := ca.Issue(SidecarServerName(certNode, "healer-sidecar"))
		if err != nil {
			t.Fatal(err)
		}
		addr, _ := serveTLS(t, cert, key)
		return addr
	}
	var mu sync.Mutex
	signerCAs := [][]byte{signer.CertPEM}
	roots := func() *x509.CertPool {
		mu.Lock()
		defer mu.Unlock()
		p := x509.NewCertPool()
		for _, c := range signerCAs {
			p.AppendCertsFromPEM(c)
		}
		return p
	}
	cfg := config.Default()
	cfg.Sidecar.Auth.TokenFile = ""
	cfg.Sidecar.TLS.CAFile = caFile
	cfg.Sidecar.TLS.ServerName = "healer-sidecar"
	client, _, err := sidecarClient(&cfg, nil, nil, nil, roots)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	type sidecarOf struct {
		ca       *harness.CA
		certNode string // the node the certificate names; empty: the node dialled
		trusted  bool
	}
	check := func(when string, cases map[string]sidecarOf) {
		t.Helper()
		for node, tc := range cases {
			certNode := tc.certNode
			if certNode == "" {
				certNode = node
			}
			_, err := client.Capabilities(ctx, probe.Target{Driver: "rbd.csi.ceph.com", Node: node, Endpoint: serve(tc.ca, certNode)})
			if (err == nil) != tc.trusted {
				t.Errorf("%s, sidecar of %s (certificate of %s): %v; want trusted %v", when, node, certNode, err, tc.trusted)
			}
		}
	}
	check("before a renewal", map[string]sidecarOf{
		"node-old":          {old, "", true},
		"node-signed":       {signer, "", true},
		"node-stranger":     {stranger, "", false},
		"node-impostor":     {signer, "node-signed", false},
		"node-old-impostor": {old, "node-old", false},
	})
	// The CA Secret is renewed: the reloader trusts the new CA and the replaced one.
	mu.Lock()
	signerCAs = [][]byte{renewed.CertPEM, signer.CertPEM}
	mu.Unlock()
	check("after a renewal", map[string]sidecarOf{
		"node-renewed":  {renewed, "", true},
		"node-replaced": {signer, "", true},
		"node-old-2":    {old, "", true},
	})
	// The replaced CA's certificates have expired: the reloader trusts the new CA alone.
	mu.Lock()
	signerCAs = [][]byte{renewed.CertPEM}
	mu.Unlock()
	check("once the replaced CA is dropped", map[string]sidecarOf{
		"node-renewed-2":  {renewed, "", true},
		"node-replaced-2": {signer, "", false},
	})
}
