// Package scale is volume-healer's scale harness. Its test loads a real kube-apiserver with
// PersistentVolumes, claims and VolumeAttachments over many simulated nodes (the reference driver
// behind the real healer sidecar, many per process, on loopback), runs the controller as its own
// process, and measures what docs/scale.md reports: API requests per restart sweep against the
// list-everything approach, restart-to-first-probe latency, a rollout storm, controller memory,
// the CPU time of a periodic sweep's planning and policy decisions, and policy decisions per
// second. Results are written as JSON (schema in docs/scale.md).
//
// The control plane, the controller's build and process and the node plugins come from
// test/harness; this package owns the layouts, the request counting, the measurements and the
// results.
//
// The default run is small (a few hundred volumes) and checks that every figure can be computed;
// the full run is asked for with -args -full or SCALE_FULL=1 and writes bench/results.json.
//
// TestEnvelope measures, in this process and without a control plane, what an apiserver on one
// machine cannot be filled for in time: periodic sweeps at 100,000 and 300,000 volumes (one with
// a policy that reads namespace and labels), the caches of 300,000 volumes in a process of their
// own, and a rollout storm of 5,000 nodes through the dispatcher; with -full it writes
// bench/envelope.json.
//
// It reaches the product through test/harness and the packages it measures; product packages
// must not import it.
package scale
