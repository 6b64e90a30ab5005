package sidecarsigner

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// The extra keys the API server copies from a pod-bound ServiceAccount token into a request's
// user info, and so into a CertificateSigningRequest's spec.extra.
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

// Event reasons, on the CertificateSigningRequest.
const (
	// ReasonSigned: a sidecar's certificate was signed.
	ReasonSigned = "SidecarCertificateSigned"
	// ReasonDenied: a request was denied; the message says why.
	ReasonDenied = "SidecarCertificateDenied"
)

// DefaultValidity is how long a signed certificate is valid unless the request asks for less.
const DefaultValidity = 24 * time.Hour

// Options configure a Signer.
type Options struct {
	// Client reads and updates the CertificateSigningRequests and reads the requesters' pods.
	// Required.
	Client kubernetes.Interface
	// CA signs, when it never changes. CA or CAs is required.
	CA *CA
	// CAs, when set, gives the CA that signs each certificate (its Current one): the newest of a
	// CA Secret renewed by someone else. It takes the place of CA.
	CAs *CAReloader
	// ServerName is the base of the sidecars' DNS names (the controller's sidecar.tls.serverName):
	// the request of node N must name healerv1alpha1.SidecarDNSName(N, ServerName) alone. Required.
	ServerName string
	// Requesters are the user names allowed to ask, the node plugins' ServiceAccounts
	// ("system:serviceaccount:<namespace>:<name>"). Default: none, every request is denied.
	Requesters []string
	// Validity is how long a certificate is valid; a request's spec.expirationSeconds may only
	// shorten it. Default: DefaultValidity.
	Validity time.Duration
	// Recorder records an Event on each request signed or denied. Default: none.
	Recorder record.EventRecorder
	// Clock dates the certificates. Default: the real clock.
	Clock clock.PassiveClock
}

// Signer approves and signs the sidecars' requests; Start runs it.
type Signer struct {
	opts  Options
	queue workqueue.TypedRateLimitingInterface[string]
	store toolscache.Store
	inf   toolscache.SharedIndexInformer
}

// New checks opts and makes a Signer.
func New(opts Options) (*Signer, error) {
	switch {
	case opts.Client == nil:
		return nil, fmt.Errorf("%w: no client", ErrInvalidOptions)
	case opts.CA == nil && opts.CAs == nil:
		return nil, fmt.Errorf("%w: no CA", ErrInvalidOptions)
	case opts.ServerName == "":
		return nil, fmt.Errorf("%w: the sidecars' server name base (sidecar.tls.serverName) is empty; the names of each node's certificate are built on it", ErrInvalidOptions)
	}
	for _, r := range opts.Requesters {
		if parts := strings.Split(r, ":"); len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" || parts[2] == "" || parts[3] == "" {
			return nil, fmt.Errorf("%w: requester %q is not a ServiceAccount user name, system:serviceaccount:<namespace>:<name>", ErrInvalidOptions, r)
		}
	}
	if opts.Validity == 0 {
		opts.Validity = DefaultValidity
	}
	if opts.Validity < 0 {
		return nil, fmt.Errorf("%w: validity %s is negative", ErrInvalidOptions, opts.Validity)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	csrs := opts.Client.CertificatesV1().CertificateSigningRequests()
	selector := fields.OneTermEqualSelector("spec.signerName", healerv1alpha1.SidecarSignerName).String()
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return csrs.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return csrs.Watch(ctx, o)
		},
	}
	s := &Signer{
		opts:  opts,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "sidecar-csr"}),
		// As the generated informers do: a client without watch-list streams (a fake one) is
		// listed and watched.
		inf: toolscache.NewSharedIndexInformer(toolscache.ToListWatcherWithWatchListSemantics(lw, opts.Client), &certificatesv1.CertificateSigningRequest{}, 0, toolscache.Indexers{}),
	}
	s.store = s.inf.GetStore()
	enqueue := func(obj any) {
		if key, err := toolscache.MetaNamespaceKeyFunc(obj); err == nil {
			s.queue.Add(key)
		}
	}
	if _, err := s.inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// Start watches the requests and handles them until ctx ends.
func (s *Signer) Start(ctx context.Context) error {
	log := klog.FromContext(ctx).WithName("sidecar-signer")
	ctx = klog.NewContext(ctx, log)
	go s.inf.RunWithContext(ctx)
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	if !toolscache.WaitForCacheSync(ctx.Done(), s.inf.HasSynced) {
		return nil
	}
	log.Info("Signing the sidecars' certificate requests", "signerName", healerv1alpha1.SidecarSignerName, "requesters", s.opts.Requesters)
	for {
		key, shutdown := s.queue.Get()
		if shutdown {
			return nil
		}
		if err := s.handle(ctx, key); err != nil {
			log.Error(err, "Handling a sidecar certificate request; will retry", "csr", key)
			s.queue.AddRateLimited(key)
		} else {
			s.queue.Forget(key)
		}
		s.queue.Done(key)
	}
}

// handle approves and signs, or denies, the request key.
func (s *Signer) handle(ctx context.Context, key string) error {
	obj, ok, err := s.store.GetByKey(key)
	if err != nil || !ok {
		return err
	}
	csr := obj.(*certificatesv1.CertificateSigningRequest).DeepCopy()
	if csr.Spec.SignerName != healerv1alpha1.SidecarSignerName || len(csr.Status.Certificate) > 0 ||
		hasCondition(csr, certificatesv1.CertificateDenied) || hasCondition(csr, certificatesv1.CertificateFailed) {
		return nil
	}
	node, tmpl, reason, err := s.review(ctx, csr)
	if err != nil {
		return err
	}
	csrs := s.opts.Client.CertificatesV1().CertificateSigningRequests()
	if reason != "" {
		if hasCondition(csr, certificatesv1.CertificateApproved) {
			// Approved by someone else, but not a request of a node's sidecar: it is not signed.
			csr.Status.Conditions = append(csr.Status.Conditions, s.condition(certificatesv1.CertificateFailed, "NotASidecarRequest", reason))
			_, err = csrs.UpdateStatus(ctx, csr, metav1.UpdateOptions{})
		} else {
			csr.Status.Conditions = append(csr.Status.Conditions, s.condition(certificatesv1.CertificateDenied, "NotASidecarRequest", reason))
			_, err = csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("deny CertificateSigningRequest %s: %w", csr.Name, err)
		}
		klog.FromContext(ctx).Info("Denied a sidecar certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "reason", reason)
		s.event(csr, corev1.EventTypeWarning, ReasonDenied, "Denied: "+reason)
		return nil
	}
	if !hasCondition(csr, certificatesv1.CertificateApproved) {
		csr.Status.Conditions = append(csr.Status.Conditions, s.condition(certificatesv1.CertificateApproved, "SidecarOfNode",
			fmt.Sprintf("requested by %s, a pod of %s on node %s, for that node's names", podOf(csr), csr.Spec.Username, node)))
		if csr, err = csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("approve CertificateSigningRequest %s: %w", csr.Name, err)
		}
	}
	der, err := s.sign(csr, tmpl)
	if err != nil {
		return fmt.Errorf("sign CertificateSigningRequest %s: %w", csr.Name, err)
	}
	csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if _, err := csrs.UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("write the certificate of CertificateSigningRequest %s: %w", csr.Name, err)
	}
	klog.FromContext(ctx).Info("Signed a sidecar certificate", "csr", csr.Name, "node", node, "requester", csr.Spec.Username)
	s.event(csr, corev1.EventTypeNormal, ReasonSigned, "Signed the serving certificate of the sidecar of node "+node)
	return nil
}

// review tells whether csr is a request of node's sidecar for node's names: it returns the node
// and the request, or the reason it is not one. err reports a failure to read the requester's
// pod, to try again.
func (s *Signer) review(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (node string, req *x509.CertificateRequest, reason string, err error) {
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return "", nil, "spec.request is not a PEM CERTIFICATE REQUEST", nil
	}
	req, perr := x509.ParseCertificateRequest(block.Bytes)
	if perr != nil {
		return "", nil, "spec.request cannot be parsed: " + perr.Error(), nil
	}
	if perr := req.CheckSignature(); perr != nil {
		return "", nil, "spec.request is not signed by its key: " + perr.Error(), nil
	}
	node, ok := healerv1alpha1.SidecarNodeFromCommonName(req.Subject.CommonName)
	if !ok {
		return "", nil, fmt.Sprintf("the common name %q does not name a node (%s<node>)", req.Subject.CommonName, healerv1alpha1.SidecarCommonNamePrefix), nil
	}
	want := healerv1alpha1.SidecarDNSName(node, s.opts.ServerName)
	if len(req.DNSNames) != 1 || req.DNSNames[0] != want || len(req.IPAddresses) > 0 || len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return "", nil, fmt.Sprintf("the request for node %s must name %s alone; it names DNS %q, IP %v, e-mail %q, URI %v",
			node, want, req.DNSNames, req.IPAddresses, req.EmailAddresses, req.URIs), nil
	}
	if len(req.Subject.Organization) > 0 || len(req.Subject.OrganizationalUnit) > 0 {
		return "", nil, fmt.Sprintf("the subject %q carries an organization; a sidecar's names its node alone", req.Subject.String()), nil
	}
	if !slices.Contains(csr.Spec.Usages, certificatesv1.UsageServerAuth) {
		return "", nil, "the usages do not include server auth", nil
	}
	for _, u := range csr.Spec.Usages {
		if u != certificatesv1.UsageServerAuth && u != certificatesv1.UsageDigitalSignature && u != certificatesv1.UsageKeyEncipherment {
			return "", nil, fmt.Sprintf("usage %q is not one of a serving certificate (server auth, digital signature, key encipherment)", u), nil
		}
	}
	if len(s.opts.Requesters) == 0 {
		return "", nil, fmt.Sprintf("the requester %q is not allowed to ask: the signer allows no node plugin ServiceAccount (the controller's sidecar.tls.signer.requesters is empty)", csr.Spec.Username), nil
	}
	if !slices.Contains(s.opts.Requesters, csr.Spec.Username) {
		return "", nil, fmt.Sprintf("the requester %q is not a node plugin's ServiceAccount allowed to ask (%s)", csr.Spec.Username, strings.Join(s.opts.Requesters, ", ")), nil
	}
	podName, podUID := one(csr.Spec.Extra[extraPodName]), one(csr.Spec.Extra[extraPodUID])
	if podName == "" || podUID == "" {
		return "", nil, fmt.Sprintf("the requester %q did not ask with a token bound to its pod (no %s and %s in spec.extra)", csr.Spec.Username, extraPodName, extraPodUID), nil
	}
	if claimed := one(csr.Spec.Extra[extraNodeName]); claimed != "" && claimed != node {
		return "", nil, fmt.Sprintf("the requester's token is bound to node %s, and the request names node %s", claimed, node), nil
	}
	namespace := strings.Split(csr.Spec.Username, ":")[2]
	pod, gerr := s.opts.Client.CoreV1().Pods(namespace).Get(ctx, podName, metav1.GetOptions{})
	if apierrors.IsNotFound(gerr) {
		return "", nil, fmt.Sprintf("the requester's pod %s/%s no longer exists", namespace, podName), nil
	}
	if gerr != nil {
		return "", nil, "", fmt.Errorf("read the pod %s/%s of CertificateSigningRequest %s: %w", namespace, podName, csr.Name, gerr)
	}
	switch {
	case string(pod.UID) != podUID:
		return "", nil, fmt.Sprintf("the requester's pod %s/%s was replaced (UID %s, the token's %s)", namespace, podName, pod.UID, podUID), nil
	case pod.Spec.NodeName != node:
		return "", nil, fmt.Sprintf("the requester's pod %s/%s runs on node %q, and the request names node %s", namespace, podName, pod.Spec.NodeName, node), nil
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return "", nil, fmt.Sprintf("the requester's pod %s/%s has ended (%s)", namespace, podName, pod.Status.Phase), nil
	}
	return node, req, "", nil
}

// sign makes the certificate of req.
func (s *Signer) sign(csr *certificatesv1.CertificateSigningRequest, req *x509.CertificateRequest) ([]byte, error) {
	validity := s.opts.Validity
	if e := csr.Spec.ExpirationSeconds; e != nil && time.Duration(*e)*time.Second < validity {
		validity = time.Duration(*e) * time.Second
	}
	now := s.opts.Clock.Now()
	// A little before now, for the clocks of the nodes that are a little behind.
	backdate := min(validity/10, 5*time.Minute)
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	ca := s.opts.CA
	if s.opts.CAs != nil {
		ca = s.opts.CAs.Current()
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	usage := x509.KeyUsageDigitalSignature
	if slices.Contains(csr.Spec.Usages, certificatesv1.UsageKeyEncipherment) {
		usage |= x509.KeyUsageKeyEncipherment
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: req.Subject.CommonName},
		DNSNames:              req.DNSNames,
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              usage,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, req.PublicKey, ca.Key)
}

func (s *Signer) condition(t certificatesv1.RequestConditionType, reason, message string) certificatesv1.CertificateSigningRequestCondition {
	now := metav1.NewTime(s.opts.Clock.Now())
	return certificatesv1.CertificateSigningRequestCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: message,
		LastUpdateTime: now, LastTransitionTime: now}
}

func (s *Signer) event(csr *certificatesv1.CertificateSigningRequest, eventType, reason, message string) {
	if s.opts.Recorder != nil {
		s.opts.Recorder.Event(csr, eventType, reason, message)
	}
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// one returns the single value of an extra, or "" when there is not exactly one.
func one(values certificatesv1.ExtraValue) string {
	if len(values) != 1 {
		return ""
	}
	return values[0]
}

func podOf(csr *certificatesv1.CertificateSigningRequest) string {
	return strings.Split(csr.Spec.Username, ":")[2] + "/" + one(csr.Spec.Extra[extraPodName])
}
