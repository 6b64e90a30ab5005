// Package e2e holds the end-to-end fault tests. Every part runs as its own process, as it would in
// a cluster: a real kube-apiserver and etcd, the volume-healer controller (built with the race
// detector), and on each simulated node the reference driver and the healer sidecar, all built
// from this repository once per run; the csi-addons tests add the real csi-addons sidecar
// (kubernetes-csi-addons, built by hack/csi-addons-sidecar.sh) to the node plugin pod, run as a
// container of a Pod object. The tests restart node plugins, run restart and periodic sweeps over
// each other, change and break the policy (and apply broken ones with kubectl through the policy
// webhook), restart the apiserver, kill and freeze sidecars, kill and cut off the leader, restart
// 50 node plugins at once, kill a node plugin whose volumes are real FUSE mounts, and delete and
// restart what the csi-addons sidecar owns; then they check what the reference drivers served,
// read through their control sockets: every healable broken volume healed, never two calls at
// once on one volume, no call on a detaching volume, no budget exceeded.
//
//	KUBEBUILDER_ASSETS="$(hack/control-plane.sh)" go test -race -count=1 -v ./test/e2e/
//
// test/harness provides the suite, the fixture and the processes; this package owns its tests, the
// node plugin made of two processes, the policy ConfigMaps and the invariants every test checks.
// Under -short every test skips itself. docs/testing.md describes each test. The package contains
// no code outside its tests.
//
// It must not import the product's packages beyond their exported API names: every part runs as
// its own process, started through test/harness.
package e2e
