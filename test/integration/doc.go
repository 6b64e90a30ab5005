// Package integration holds the controller's integration tests. Each test runs against a real
// kube-apiserver and etcd, runs the volume-healer controller as its own process (built once per
// run from cmd/volume-healer), and simulates nodes: each node is a reference driver serving its
// CSI-Addons socket and a real healer sidecar in front of it, both in the test process, on real
// sockets. The tests assert on what the drivers were asked to do, and on the API objects, Events
// and metrics an operator would look at.
//
// test/harness provides all of that (the suite, the fixture, the controller process, the node
// plugins); this package owns its tests, the apiserver's audit log and what reads it, and the call
// trackers in front of its drivers.
//
//	go test -race ./test/integration/...
//	go test ./test/integration/ -run APIRequests -v -perf-report=/tmp/performance.md
//
// The package contains no code outside its tests.
//
// It reaches the product through test/harness; product packages must not import it.
package integration
