package e2e

import (
	"flag"
	"os"
	"testing"

	"github.com/volume-healer/volume-healer/test/harness"
)

var keepLogs = flag.Bool("keep-logs", false, "keep the run's folder, with the log of every process, after a successful run too")

// TestMain starts the suite every test shares: one control plane, the controller built with the
// race detector (it is the program under test), and the healer sidecar and the reference driver
// built without it (the 100 processes of the rollout test would not fit two cores with it), and
// healerctl, which shows what an operator sees.
func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(harness.Main(m, harness.SuiteOptions{
		Name:     "e2e",
		Build:    harness.BuildOptions{Controller: harness.Race, NodePlugin: true, Healerctl: true},
		Skip:     "end-to-end test: starts kube-apiserver, etcd, the controller, sidecars and drivers; run without -short",
		KeepLogs: *keepLogs,
		Kept:     "the logs of every process under logs/",
	}))
}
