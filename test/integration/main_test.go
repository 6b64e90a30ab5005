package integration

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/volume-healer/volume-healer/test/harness"
)

var (
	perfReport  = flag.String("perf-report", "", "write the figures of TestAPIRequestsPerRestartSweep as Markdown to this file")
	perfVolumes = flag.Int("perf-volumes", 1000, "volumes on the restarted node in TestAPIRequestsPerRestartSweep")
)

// auditPolicy records every request once it has been answered, without bodies: enough to tell
// which client made which request, which apiserver_request_total cannot.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// TestMain starts the suite every test shares: one control plane, whose apiserver writes an audit
// log, and the controller built without the race detector (it runs as its own process, and the
// race detector's cost would slow every sweep the tests time). The sidecars and drivers run in
// the test process.
func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.SuiteOptions{
		Name: "integration",
		APIServerArgs: func(dir string) (map[string]string, error) {
			policyFile := filepath.Join(dir, "audit-policy.yaml")
			if err := os.WriteFile(policyFile, []byte(auditPolicy), 0o600); err != nil {
				return nil, err
			}
			return map[string]string{
				"audit-policy-file": policyFile,
				"audit-log-path":    auditLog(dir),
				"audit-log-format":  "json",
			}, nil
		},
		Skip: "integration test: starts kube-apiserver, etcd and the controller; run without -short",
		Kept: "audit.log, test-process.log with the sidecars' logs, the controllers' logs under logs/",
	}))
}

// auditLog is the apiserver's audit log (JSON lines) in the suite's folder.
func auditLog(dir string) string { return filepath.Join(dir, "audit.log") }
