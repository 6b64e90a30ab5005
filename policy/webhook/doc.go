// Package webhook is the validating admission webhook of policy ConfigMaps: the API server sends
// it each create and update of a ConfigMap that carries the policy label, and it denies the
// change when the controller would reject the policy set with it, with the message the controller
// would write on the ConfigMap (file namespace/configmap/key and line), so that `kubectl apply`
// of a broken policy fails instead of storing it. Every replica serves it, leader or not.
//
// The judgement is policy.ConfigMapSource.Check; this package speaks AdmissionReview v1 over
// HTTPS (Handler, Server), bounds what any caller's reviews cost (Limits: size, reviews in
// flight, time) and counts the reviews (Metrics). The ValidatingWebhookConfiguration
// comes with deploy/; docs/policy.md explains its failurePolicy. The Server also serves, on the
// same listener and certificate, the further admission webhooks it is handed (Options.Handlers:
// the mount propagation webhook), which read their reviews with ReadReview.
//
// It judges policies and never acts: it must not import scheduler, probe or healer.
package webhook
