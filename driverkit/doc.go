// Package driverkit is what a Go CSI driver imports to be healed by volume-healer: it serves the
// Healer service and the CSI-Addons Identity service on the driver's CSI-Addons socket, keeps one
// operation per volume at a time (the driver's own CSI Node calls included), checks a volume's
// staging and publish mounts for the failures userspace mounters leave behind after a node plugin
// restart, and repairs them: a dead mount is detached, the driver's mounter is started again, and
// every publish target gets the new mount stacked on top, so that running workloads whose mount
// propagation lets them receive it (HostToContainer or Bidirectional) see the repaired volume.
//
// A driver supplies a Driver (four methods: look up a staged volume, list them, add its own
// findings, start its mounter again) and calls Register. See docs/driver-authors.md.
//
// A driver that runs without node-driver-registrar registers itself with kubelet through
// RegisterWithKubelet (kubelet's plugin registration API).
//
// The package is linked into CSI drivers: of volume-healer it imports only api/, never the
// controller's, the sidecar's or the reference driver's packages, nor test/, and it links no
// Kubernetes client, policy engine or metrics client. docs/driver-authors.md lists the modules a
// driver needs for it; make lint checks both.
package driverkit
