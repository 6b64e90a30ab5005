// Package evict restarts the pods that a remedy of a volume needs restarted on a node. After a
// heal, a container whose mount propagation is None keeps its own view of the dead mount: only
// its restart gives it the repaired one (Request.Remedy heal, for a driver that reports
// healerv1alpha1.ReasonStaleMountInPods). A recycle (Remedy recycle) needs every pod that uses the
// volume on the node gone, so that kubelet unstages it and the driver's own NodeStage mounts it
// again for the replacements. The Evictor finds the pods on that node that use the volume's claim
// (pods.go), asks the policy (policy.RestartQuery) for each whether to restart its containers in
// place through the node's healer sidecar (ContainerRestarter), evict it, or leave it alone, and
// evicts through the Eviction API (policy/v1), never by deleting, so that PodDisruptionBudgets
// hold. Evictions have their own per-minute budgets (budget.go), a 429 from the API server (a
// budget would be violated) is tried again with backoff, a container restart that fails is never
// tried again for that pod (the policy is asked again without it), and each restart, eviction,
// blocked eviction or dry-run eviction is reported by Events on the Pod and the claim and by
// metrics (metrics.go). Progress says how far each volume's remedy has come.
//
// Of volume-healer it imports only the policy stage; the healer imports it.
package evict
