// Package restart stops, through the node's container runtime (CRI), the running containers of
// one pod that mount one volume's publish target, so that kubelet starts them again and binds the
// node's repaired mount into the new containers: the remedy, short of an eviction, for a container
// whose mount propagation is None and which keeps its own copy of a dead FUSE mount after the
// node's mount was healed.
//
// It proves each container it stops: the runtime lists it as running with the pod UID label that
// kubelet sets, and one of the container's mounts has, as its host path, exactly the publish target
// the caller names. It stops containers and does nothing else: no exec, no create, no removal, no
// sandbox of any pod. Which publish target belongs to which PersistentVolume is the caller's to
// prove (package sidecar resolves the PV, nodeprobe computes kubelet's path).
//
// It is part of the sidecar and imports no other package of volume-healer (the controller's
// least of all) and no Kubernetes API client: it talks to the runtime alone, through the
// generated CRI client of k8s.io/cri-api.
package restart
