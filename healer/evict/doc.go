// Package evict restarts the pods that still see a volume's dead mount after its heal. A heal
// repairs the mount on the node, but a container whose mount propagation is None keeps its own
// view of the dead mount: only a new pod sees the repaired one. The healer hands the Evictor a
// Request for each volume whose driver reports healerv1alpha1.ReasonStaleMountInPods; the
// Evictor finds the pods on that node that use the volume's claim (pods.go), asks the policy
// (policy.RestartQuery) for each whether to evict it or leave it alone, and evicts through
// the Eviction API (policy/v1), never by deleting, so that PodDisruptionBudgets hold. Evictions
// have their own per-minute budgets (budget.go), a 429 from the API server (a budget would be
// violated) is tried again with backoff, and each eviction, blocked eviction or dry-run
// eviction is reported by Events on the Pod and the claim and by metrics (metrics.go).
//
// Of volume-healer it imports only the policy stage; the healer imports it.
package evict
