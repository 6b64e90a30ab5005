// Package deploy tests what deploy/ ships: the kustomize base and sidecar component, the Helm chart,
// the Prometheus rules and the Grafana dashboard. The manifests go to a real kube-apiserver as
// server-side dry runs, the rules through promtool, and a heal that fails in a running controller
// must fire the alert that names its claim. The tools come from hack/tools.sh.
//
// It owns the checks of what deploy/ ships, and nothing else: it has no code outside its tests.
// It reads deploy/ and the product's exported names (metrics, configuration, Event reasons, to
// check that the manifests and rules use them); it starts no product process but through
// test/harness, and it must not import cmd/volume-healer/controller: the controller it alerts on
// runs as its own process. Nothing imports it.
package deploy
