// Package harness is what every suite that runs volume-healer against a real control plane
// shares: the integration tests (test/integration), the end-to-end tests (test/e2e), the scale
// harness (test/scale) and the demo (test/demo), and the sidecar's own tests against a real
// apiserver. It owns
//
//   - the cluster: a control plane from test/controlplane with the controller's namespace,
//     ServiceAccount and token (StartCluster, Cluster);
//   - the suite of a test package: the cluster, the built programs, the run's folder and its
//     clean-up, started once from TestMain or by the first test that needs it (Main, Suite,
//     Require);
//   - a test's corner of the cluster: namespaces, CSIDriver, StorageClasses, the stage Secret,
//     Nodes, and volumes as test/fixtures shapes them, removed when the test ends (Fixture, Volume);
//   - building the project's programs once per run into one folder of the checkout (Build);
//   - child processes that die with the process that started them (Processes, Process), the
//     controller as one of them, its readiness, metrics and log (StartController, Controller),
//     started by test/harness/fork, which test/kubelet's workloads use too;
//   - a node plugin pod in this process: the reference driver on a UNIX socket behind the real
//     healer sidecar on a loopback port (Plugin, ServeDriver, StartSidecar), and the driver calls
//     it received (DriverCalls);
//   - a program run as a pod's container, which reaches the API server through the ServiceAccount
//     files and environment that rest.InClusterConfig reads (StartContainer, through
//     test/container), and the real csi-addons sidecar built for it (BuildCSIAddonsSidecar,
//     Suite.CSIAddons);
//   - free loopback ports (FreeAddr) and polling (WaitFor, Eventually: test/harness/poll, which
//     unit tests use directly).
//
// What only a test can use takes a TB, which *testing.T satisfies; a program such as the demo
// runs such code under RunScript. Everything else returns errors and may run in any goroutine.
//
// Product packages must never import it (nor anything under test/); the suites do.
package harness
