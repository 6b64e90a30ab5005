// Package propagation is the mutating admission webhook that sets mountPropagation
// HostToContainer on the mounts of a pod being created, where the policy asks for it, so that a
// heal of a volume's mount on the node reaches the pod's containers without a restart: a
// container whose mount has propagation None keeps its own copy of a dead FUSE mount, one with
// HostToContainer sees the repaired one.
//
// For each pod the API server sends it (pod CREATE only), the Handler gathers the pod's volumes
// that name a PersistentVolumeClaim, looks up their claims, PersistentVolumes, StorageClasses and
// the namespace in the controller's informer caches (Objects), asks the policy
// (policy.PropagationQuery) which volumes to change, and answers with a JSONPatch (Patch) that
// sets HostToContainer on those volumes' mounts whose propagation is unset or None. It never
// changes another propagation (Bidirectional stays, HostToContainer is left as it is), never
// touches a volume the policy did not name, and never refuses a pod: whatever fails (the policy,
// a lookup, a malformed review) lets the pod through unchanged, counted in Metrics and, when the
// review was read, reported as an Event. The policy webhook's server (package policy/webhook)
// serves it on its listener and certificate; the MutatingWebhookConfiguration comes with
// deploy/, off by default; docs/operations.md explains it.
//
// It patches pods at admission and never acts on volumes: it must not import scheduler, probe or
// healer.
package propagation
