// Package kubelet stands in for the two parts of a node that a CSI volume passes through on its
// way to a workload: kubelet, which stages and publishes the volume by calling the driver's CSI
// Node service, and the container runtime, which mounts the published volume into a workload's
// mount namespace with the propagation the pod asks for.
//
// Kubelet keeps kubelet's folder layout under a root of its own (New): the root is a shared bind
// mount of itself, as kubelet makes /var/lib/kubelet, so that what a driver mounts below it,
// including a repaired mount stacked on a dead one, reaches workloads whose propagation lets it
// in. StartWorkload runs test/workload in a new mount namespace, set up the way runc sets up a
// container's, and records every write and read it makes on the volume, so that a test or the
// demo can tell when a workload lost its volume and when it got it back.
//
// It computes kubelet's paths itself, from kubelet's source, and must not import the sidecar
// (cmd/healer-sidecar), whose own computation tests compare with this one; nor test/harness, which
// may use it.
package kubelet
