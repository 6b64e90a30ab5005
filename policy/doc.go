// Package policy decides, per volume, whether volume-healer probes, heals or skips it.
//
// Policies are Rego (v1) modules in package volumehealer that define data.volumehealer.decision,
// and optionally data.volumehealer.restart (RestartQuery) and data.volumehealer.propagation
// (PropagationQuery).
// An Engine serves decisions from one compiled, validated Revision at a time and swaps revisions
// atomically; a revision that fails to parse, compile or validate never serves. A ConfigMapSource
// feeds the engine from labelled ConfigMaps and reports rejections on them; its Check judges a change
// to them before it is stored, for the admission webhook (package policy/webhook). Without
// ConfigMaps the built-in default policy (default/default.rego) serves.
//
// Decisions are memoized per revision, keyed by the values of the input fields the policy reads,
// unless the policy reads input as a whole or calls a non-deterministic built-in function.
//
// docs/policy.md documents the input and output schema, the default policy and error reporting.
//
// It decides and never acts: it must not import scheduler, probe or healer (the planner builds
// its Input; the healer acts on its Decision), nor admission (the propagation webhook builds its
// PropagationInput and patches the pod).
package policy
