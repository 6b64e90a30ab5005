// Package realcluster is the suite that runs volume-healer as a Kubernetes user runs it: on a real
// node (package test/cluster: kubelet, containerd, runc, kube-proxy, the control plane), installed
// with its Helm chart next to the reference driver's chart, with workloads whose pods write and
// read FUSE volumes that kubelet provisioned, attached, staged and published through the real CSI
// calls. The node plugin is then restarted the ways it is in production, and the suite asserts on
// the workloads' own reads and writes.
//
// It needs root, cgroups and /dev/fuse; elsewhere it skips, except in CI (CI=true), where it
// fails. Its first run builds kubelet, containerd and the CSI sidecars (hack/node.sh, cached
// under .cache/node) and the images (hack/images --cluster-images).
//
// It owns the workloads on the node, the ways it breaks the node plugin and the checks of what
// the workloads saw. It reaches the node through test/cluster and test/harness, and of the
// product imports only the names a user reads (api/annotations, the Event reasons of package
// healer and healer/evict), and in its container restart test the wire protocol's client, to
// call the node's sidecar as the controller does; it must not import the controller's stages or
// cmd/: the product runs from its images, installed by Helm. test/demo imports it for its cluster mode.
package realcluster
