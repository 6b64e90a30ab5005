// Package probe is the controller's client of the healer sidecars: one pooled gRPC connection per
// sidecar endpoint, TLS, the controller's ServiceAccount token on every call, a timeout on every
// call, and a cache of each (driver, node)'s capabilities.
//
// It knows the wire protocol (api/healer/v1alpha1) and nothing of sweeps or policies: it must not
// import scheduler, policy or healer.
package probe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// Target is one driver's sidecar on one node.
type Target struct {
	// Driver is the CSI driver name.
	Driver string
	// Node is the node name.
	Node string
	// Endpoint is host:port of the sidecar; IPv6 hosts in brackets.
	Endpoint string
}

// TargetFor reads the sidecar's address from a CSIAddonsNode: the healer sidecar's annotation, or a
// host:port spec.driver.endpoint when no annotation is there.
func TargetFor(n *csiaddonsv1alpha1.CSIAddonsNode) (Target, error) {
	t := Target{Driver: n.Spec.Driver.Name, Node: n.Spec.Driver.NodeID, Endpoint: annotations.Value(n.Annotations, annotations.Endpoint)}
	if _, byCSIAddons := n.Annotations[annotations.CSIAddonsPod]; t.Endpoint == "" && byCSIAddons {
		// The object is the csi-addons sidecar's, and its spec.driver.endpoint is that sidecar's
		// address, which serves no NodeHealer and must not get the controller's token: until the
		// healer sidecar registers on the object (as after the csi-addons sidecar recreated it),
		// the node has no target.
		return Target{}, fmt.Errorf("%w: CSIAddonsNode %s/%s was created by the csi-addons sidecar and the healer sidecar has not written its annotation %s on it yet",
			ErrNoEndpoint, n.Namespace, n.Name, annotations.Endpoint)
	}
	if t.Endpoint == "" {
		// An object the healer sidecar created itself carries its address in the spec.
		t.Endpoint = n.Spec.Driver.EndPoint
	}
	if _, port, err := net.SplitHostPort(t.Endpoint); err != nil || port == "" {
		return Target{}, fmt.Errorf("%w: CSIAddonsNode %s/%s: annotation %s is %q and spec.driver.endpoint is %q; want host:port",
			ErrNoEndpoint, n.Namespace, n.Name, annotations.Endpoint, t.Endpoint, n.Spec.Driver.EndPoint)
	}
	return t, nil
}

// Health is one adverse condition of a volume, in the CSI VolumeHealth vocabulary.
type Health struct {
	// Status is DEGRADED, INACCESSIBLE, DATA_LOSS, or a newer value this build does not know.
	Status string `json:"status"`
	// Reason is a short CamelCase reason.
	Reason string `json:"reason"`
	// Message is for people.
	Message string `json:"message,omitempty"`
}

// Result is what a probe or a heal reports about a volume.
type Result struct {
	// VolumeID is the driver's volume handle.
	VolumeID string
	// Health lists adverse conditions; empty means healthy.
	Health []Health
	// Healable says whether the driver can heal this volume at all (probes only; true after a heal).
	Healable bool
	// RecheckAfter is the driver's hint for when to probe again; 0 means none.
	RecheckAfter time.Duration
	// ProbeSource says who probed (probes only): ProbeSourceDriver or ProbeSourceSidecar.
	ProbeSource string
	// Kept says that the driver keeps the volume alive across the restarts its
	// Capabilities.VolumeKeeping names: its mounter runs outside the node plugin (probes only).
	Kept bool
}

// Healthy reports whether the result lists no adverse condition.
func (r *Result) Healthy() bool { return len(r.Health) == 0 }

// Has reports whether the result lists the status s.
func (r *Result) Has(s string) bool {
	for _, h := range r.Health {
		if h.Status == s {
			return true
		}
	}
	return false
}

// HasReason reports whether the result lists an entry with the reason r.
func (r *Result) HasReason(reason string) bool {
	for _, h := range r.Health {
		if h.Reason == reason {
			return true
		}
	}
	return false
}

// OnlyReason reports whether every entry of an unhealthy result has the reason r.
func (r *Result) OnlyReason(reason string) bool {
	for _, h := range r.Health {
		if h.Reason != reason {
			return false
		}
	}
	return len(r.Health) > 0
}

// Capabilities are what a driver's sidecar advertises.
type Capabilities struct {
	// Driver is the driver's name as it reports it.
	Driver string
	// Probe, Heal and ListVolumes say which operations the driver serves.
	Probe, Heal, ListVolumes bool
	// Attributes are the driver's free-form attributes for policies.
	Attributes map[string]string
	// ProbeSource says who probes the driver's volumes on the node: ProbeSourceDriver, or
	// ProbeSourceSidecar when the driver does not and the sidecar probes them itself.
	ProbeSource string
	// ContainerRestart is true when the sidecar can restart a pod's containers in place on its
	// node (RestartContainers): it was given the container runtime's socket and reached it.
	ContainerRestart bool
	// VolumeKeeping says which restarts the driver's kept volumes live through.
	VolumeKeeping VolumeKeeping
}

// VolumeKeeping is a driver's VolumeKeeping capabilities: the restarts its kept volumes live
// through.
type VolumeKeeping struct {
	// PluginRestart: a restart of the node plugin kills no mounter of a kept volume.
	PluginRestart bool
	// MounterRestart: a new mounter takes over the live connection of a kept volume whose
	// mounter died.
	MounterRestart bool
}

// Any reports whether the driver keeps volumes alive across any restart.
func (k VolumeKeeping) Any() bool { return k.PluginRestart || k.MounterRestart }

// volumeKeepingOf reads the VolumeKeeping capabilities out of a capabilities list.
func volumeKeepingOf(caps []*healerv1alpha1.HealerCapability) VolumeKeeping {
	var k VolumeKeeping
	for _, t := range healerv1alpha1.VolumeKeepingOf(caps) {
		switch t {
		case healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART:
			k.PluginRestart = true
		case healerv1alpha1.HealerCapability_VolumeKeeping_MOUNTER_RESTART:
			k.MounterRestart = true
		}
	}
	return k
}

// Who probes a volume: the driver, or the sidecar itself (healerv1alpha1.ProbeSource).
const (
	ProbeSourceDriver  = "driver"
	ProbeSourceSidecar = "sidecar"
)

// probeSource names what a sidecar says of who probes; an older sidecar says nothing, and
// relayed the driver's probe.
func probeSource(s healerv1alpha1.ProbeSource) string {
	if s == healerv1alpha1.ProbeSource_PROBE_SOURCE_SIDECAR {
		return ProbeSourceSidecar
	}
	return ProbeSourceDriver
}

// StagedVolume is a volume the driver has staged on the sidecar's node.
type StagedVolume struct {
	// PV is the PersistentVolume name, empty where the sidecar could not map the volume.
	PV string
	// VolumeID is the driver's volume handle.
	VolumeID string
}

// The bounds of one listing of a node's staged volumes, unless Options say otherwise. A node
// stages a few hundred volumes at most (Kubernetes' default limit of pods per node is 110), and an
// entry takes about 200 bytes on the wire; the configuration's stagedList keys default to these.
const (
	DefaultListMaxEntries = 10000
	DefaultListMaxBytes   = 4 << 20
	DefaultListTimeout    = time.Minute
)

// Options configure a Client.
type Options struct {
	// TLS is the client TLS configuration; nil dials without TLS (tests and demos only). Default nil.
	TLS *tls.Config
	// NodeServerName, when set with TLS, gives the name that the sidecar of a node must prove with
	// its certificate: each node's sidecars are dialled with ServerName NodeServerName(node), so
	// that a sidecar answering at another node's address with its own node's certificate fails
	// the handshake before any call, and before the token for that node is sent. Default nil:
	// TLS.ServerName, or the host of the address, for every node.
	NodeServerName func(node string) string
	// TokenFile holds the ServiceAccount token sent on every call; re-read every TokenRefresh so a
	// rotated projected token is picked up. Empty sends no token. Default "".
	TokenFile string
	// Tokens, when set, gives the token of each call, for the node whose sidecar is called, and
	// TokenFile is not read: the sidecars accept only a token for their own node
	// (healerv1alpha1.NodeTokenAudience). Default nil.
	Tokens TokenSource
	// TokenRefresh is how long a read token is reused. Default 1m.
	TokenRefresh time.Duration
	// ProbeTimeout bounds a probe, a capabilities call and a list call. Default 10s.
	ProbeTimeout time.Duration
	// HealTimeout bounds a heal. Default 2m.
	HealTimeout time.Duration
	// RestartTimeout bounds a restart of a pod's containers in place (RestartContainers): the
	// sidecar stops them through the container runtime, which waits for their grace period.
	// Default 1m.
	RestartTimeout time.Duration
	// ListMaxEntries bounds the volumes one listing of a node's staged volumes may return, across
	// all its pages; a sidecar that sends more fails that node's listing with ErrListTooLarge.
	// Default DefaultListMaxEntries.
	ListMaxEntries int
	// ListMaxBytes bounds the size on the wire of all the pages of one listing together; past it
	// the listing fails with ErrListTooLarge. Default DefaultListMaxBytes.
	ListMaxBytes int
	// ListTimeout bounds one listing of a node's staged volumes, all its pages together; each page
	// is also bounded by ProbeTimeout. Default DefaultListTimeout.
	ListTimeout time.Duration
	// MaxMessageSize bounds responses. Default 4 MiB.
	MaxMessageSize int
	// CapabilityFailureTTL is how long a failed capabilities call of a sidecar is answered from
	// memory: every volume of an unreachable node then fails at once instead of each waiting for
	// its own timeout. Default 5s.
	CapabilityFailureTTL time.Duration
	// Clock tells time for the token cache and the capability failures. Default real.
	Clock clock.PassiveClock
	// Guard, when set, is asked before every call, once the call's timeout is set: it returns
	// the context the call runs under (a child of the one it is given, which may end sooner) and
	// a function to call once the call has returned, or an error that refuses the call
	// (ErrRefused). The controller guards its calls with its leader election Lease (package
	// leader), so that no call outlives the time the controller is known to lead. Default nil:
	// every call runs under the caller's context and its own timeout.
	Guard func(ctx context.Context) (context.Context, func(), error)
	// PersistentVolume, when set, returns a PersistentVolume from the controller's caches by
	// name, without a read from the API server: probes and heals then carry its facts (volume
	// handle, volume context, access modes, volume mode, fsType, mount options, node-stage
	// Secret reference), and the sidecar reads no PV and no VolumeAttachment for them. Default
	// nil: the requests name the PV alone and the sidecar reads it.
	PersistentVolume func(name string) (*corev1.PersistentVolume, bool)
}

func (o *Options) defaults() {
	if o.TokenRefresh <= 0 {
		o.TokenRefresh = time.Minute
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = 10 * time.Second
	}
	if o.HealTimeout <= 0 {
		o.HealTimeout = 2 * time.Minute
	}
	if o.RestartTimeout <= 0 {
		o.RestartTimeout = time.Minute
	}
	if o.ListMaxEntries <= 0 {
		o.ListMaxEntries = DefaultListMaxEntries
	}
	if o.ListMaxBytes <= 0 {
		o.ListMaxBytes = DefaultListMaxBytes
	}
	if o.ListTimeout <= 0 {
		o.ListTimeout = DefaultListTimeout
	}
	if o.MaxMessageSize <= 0 {
		o.MaxMessageSize = 4 << 20
	}
	if o.CapabilityFailureTTL <= 0 {
		o.CapabilityFailureTTL = 5 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// Client calls healer sidecars. It is safe for concurrent use.
type Client struct {
	opts Options

	mu    sync.Mutex
	conns map[connKey]*grpc.ClientConn
	caps  map[capKey]*Capabilities
	// capErrs holds recent failed capabilities calls, until their expiry.
	capErrs map[capKey]capFailure

	tokenMu   sync.Mutex
	token     string
	tokenRead time.Time
}

type capKey struct{ driver, node, endpoint string }

// connKey names a pooled connection: with NodeServerName, one address serves, after a pod IP moved
// to another node, a connection that proves another node, so the node is part of the key.
type connKey struct{ endpoint, node string }

// capFailure is a failed capabilities call remembered until expires.
type capFailure struct {
	err     error
	expires time.Time
}

// New returns a Client with no connection yet; connections are made on first use.
func New(opts Options) *Client {
	opts.defaults()
	return &Client{opts: opts, conns: map[connKey]*grpc.ClientConn{}, caps: map[capKey]*Capabilities{}, capErrs: map[capKey]capFailure{}}
}

// callContext bounds one call to the sidecar of node: by timeout, then by the Guard. end must be
// called once the call has returned. The context names node for the call's token.
func (c *Client) callContext(ctx context.Context, node string, timeout time.Duration) (_ context.Context, end func(), _ error) {
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, nodeKey{}, node), timeout)
	if c.opts.Guard == nil {
		return ctx, cancel, nil
	}
	guarded, done, err := c.opts.Guard(ctx)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return guarded, func() { done(); cancel() }, nil
}

// conn returns the pooled connection to the sidecar of t, creating it on first use.
func (c *Client) conn(t Target) (healerv1alpha1.NodeHealerClient, error) {
	endpoint := t.Endpoint
	key := connKey{endpoint: endpoint}
	if c.opts.TLS != nil && c.opts.NodeServerName != nil {
		key.node = t.Node
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[key]; ok {
		return healerv1alpha1.NewNodeHealerClient(cc), nil
	}
	creds := insecure.NewCredentials()
	if c.opts.TLS != nil {
		cfg := c.opts.TLS
		if key.node != "" {
			cfg = cfg.Clone()
			cfg.ServerName = c.opts.NodeServerName(key.node)
		}
		creds = credentials.NewTLS(cfg)
	}
	cc, err := grpc.NewClient("passthrough:///"+endpoint,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.opts.MaxMessageSize)),
		grpc.WithPerRPCCredentials(tokenCreds{c}),
		grpc.WithKeepaliveParams(clientKeepalive()),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: sidecar %s: %w", ErrUnreachable, endpoint, err)
	}
	c.conns[key] = cc
	return healerv1alpha1.NewNodeHealerClient(cc), nil
}

// clientKeepalive is the keepalive of the connections to the sidecars: pings at the protocol's
// interval, which the sidecars' enforcement policy accepts, also between sweeps, so that a
// connection to a node that vanished is closed and re-dialled instead of holding the next calls
// until their timeouts.
func clientKeepalive() keepalive.ClientParameters {
	return keepalive.ClientParameters{
		Time:                healerv1alpha1.KeepaliveTime,
		Timeout:             healerv1alpha1.KeepaliveTimeout,
		PermitWithoutStream: healerv1alpha1.KeepalivePermitWithoutStream,
	}
}

// Forget closes the connection to endpoint and drops the cached capabilities of every target behind
// it: the sidecar restarted or moved.
func (c *Client) Forget(endpoint string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, cc := range c.conns {
		if k.endpoint == endpoint {
			_ = cc.Close()
			delete(c.conns, k)
		}
	}
	c.dropCapabilitiesLocked(func(k capKey) bool { return k.endpoint == endpoint })
}

// Redial makes the connections to endpoint that wait out a reconnection backoff dial again at
// once, and starts their backoff again from its first step: a sidecar announced a start there
// (its restart marker). gRPC spaces the dials of a connection that keeps failing by up to two
// minutes, and a sidecar down for a while (its node plugin's pod replaced) would otherwise be
// reached only when that wait ends, long after it is back. Calls in flight are left alone.
func (c *Client) Redial(endpoint string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, cc := range c.conns {
		if k.endpoint == endpoint {
			cc.ResetConnectBackoff()
		}
	}
}

// dropCapabilitiesLocked forgets the capabilities, and the remembered failures to read them, of
// the keys that match.
func (c *Client) dropCapabilitiesLocked(match func(capKey) bool) {
	for k := range c.caps {
		if match(k) {
			delete(c.caps, k)
		}
	}
	for k := range c.capErrs {
		if match(k) {
			delete(c.capErrs, k)
		}
	}
}

// Refresh drops the cached capabilities of (driver, node), for example after its node plugin
// restarted; the next call asks the sidecar again.
func (c *Client) Refresh(driver, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropCapabilitiesLocked(func(k capKey) bool { return k.driver == driver && k.node == node })
}

// Close closes every connection.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ep, cc := range c.conns {
		_ = cc.Close()
		delete(c.conns, ep)
	}
}

// Capabilities returns the capabilities of t, from the cache when they were fetched before.
func (c *Client) Capabilities(ctx context.Context, t Target) (*Capabilities, error) {
	key := capKey{t.Driver, t.Node, t.Endpoint}
	now := c.opts.Clock.Now()
	c.mu.Lock()
	cached, failed := c.caps[key], c.capErrs[key]
	c.mu.Unlock()
	if cached != nil {
		return cached, nil
	}
	if failed.err != nil && now.Before(failed.expires) {
		return nil, failed.err
	}
	caps, err := c.fetchCapabilities(ctx, t)
	if err != nil {
		// A call cut short by the caller's own context, or never made, says nothing of the sidecar.
		if ctx.Err() == nil && !errors.Is(err, ErrRefused) {
			c.mu.Lock()
			c.capErrs[key] = capFailure{err: err, expires: c.opts.Clock.Now().Add(c.opts.CapabilityFailureTTL)}
			c.mu.Unlock()
		}
		return nil, err
	}
	c.mu.Lock()
	c.caps[key] = caps
	delete(c.capErrs, key)
	c.mu.Unlock()
	return caps, nil
}

// fetchCapabilities asks the sidecar of t for its driver's capabilities.
func (c *Client) fetchCapabilities(ctx context.Context, t Target) (*Capabilities, error) {
	client, err := c.conn(t)
	if err != nil {
		return nil, err
	}
	ctx, end, err := c.callContext(ctx, t.Node, c.opts.ProbeTimeout)
	if err != nil {
		return nil, fmt.Errorf("capabilities of %s on node %s (%s): %w", t.Driver, t.Node, t.Endpoint, err)
	}
	defer end()
	resp, err := client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
	if err != nil {
		return nil, fmt.Errorf("capabilities of %s on node %s (%s): %w", t.Driver, t.Node, t.Endpoint, Classify(err))
	}
	return capabilitiesOf(resp, t)
}

// capabilitiesOf converts a sidecar's capabilities answer; it must be for the driver t names.
func capabilitiesOf(resp *healerv1alpha1.NodeGetHealerCapabilitiesResponse, t Target) (*Capabilities, error) {
	if resp.GetDriverName() != t.Driver {
		return nil, fmt.Errorf("%w: sidecar %s on node %s serves driver %q, the CSIAddonsNode names %q",
			ErrMalformed, t.Endpoint, t.Node, resp.GetDriverName(), t.Driver)
	}
	return &Capabilities{
		Driver:           resp.GetDriverName(),
		Probe:            healerv1alpha1.HasRPC(resp.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_PROBE),
		Heal:             healerv1alpha1.HasRPC(resp.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_HEAL),
		ListVolumes:      healerv1alpha1.HasRPC(resp.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES),
		Attributes:       resp.GetAttributes(),
		ProbeSource:      probeSource(resp.GetProbeSource()),
		ContainerRestart: resp.GetContainerRestart(),
		VolumeKeeping:    volumeKeepingOf(resp.GetCapabilities()),
	}, nil
}

// Probe asks the sidecar of t how the volume of PersistentVolume pv is.
func (c *Client) Probe(ctx context.Context, t Target, pv string) (*Result, error) {
	client, err := c.conn(t)
	if err != nil {
		return nil, err
	}
	ctx, end, err := c.callContext(ctx, t.Node, c.opts.ProbeTimeout)
	if err != nil {
		return nil, fmt.Errorf("probe of %s on node %s: %w", pv, t.Node, err)
	}
	defer end()
	resp, err := client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: pv, Volume: c.volumeFacts(pv)})
	if err != nil {
		return nil, fmt.Errorf("probe of %s on node %s: %w", pv, t.Node, Classify(err))
	}
	r, err := probeResult(resp)
	if err != nil {
		return nil, fmt.Errorf("probe of %s on node %s: %w", pv, t.Node, err)
	}
	return r, nil
}

// probeResult converts a sidecar's probe answer, rejecting what breaks the protocol.
func probeResult(resp *healerv1alpha1.NodeProbeVolumeResponse) (*Result, error) {
	r, err := convertResult(resp.GetVolumeId(), resp.GetHealthStatuses(), resp.GetRecheckAfter(), resp.GetHealable())
	if r != nil {
		r.ProbeSource = probeSource(resp.GetProbeSource())
		r.Kept = resp.GetKept()
	}
	return r, err
}

// healResult converts a sidecar's heal answer, rejecting what breaks the protocol. A volume the
// driver just healed is healable.
func healResult(resp *healerv1alpha1.NodeHealVolumeResponse) (*Result, error) {
	return convertResult(resp.GetVolumeId(), resp.GetHealthStatuses(), resp.GetRecheckAfter(), true)
}

func convertResult(volumeID string, entries []*csi.VolumeHealth_VolumeHealthEntry, recheck *durationpb.Duration, healable bool) (*Result, error) {
	health, err := convertHealth(entries)
	if err != nil {
		return nil, err
	}
	after, err := recheckAfter(recheck)
	if err != nil {
		return nil, err
	}
	return &Result{VolumeID: volumeID, Health: health, Healable: healable, RecheckAfter: after}, nil
}

// recheckAfter converts the driver's "check again after" hint; none is zero. When set it must be a
// valid, positive duration (docs/protocol.md), as the sidecar also checks.
func recheckAfter(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, fmt.Errorf("%w: recheck_after: %v", ErrMalformed, err)
	}
	if v := d.AsDuration(); v > 0 {
		return v, nil
	}
	return 0, fmt.Errorf("%w: recheck_after is %s; when set it must be positive", ErrMalformed, d.AsDuration())
}

// Heal asks the sidecar of t to heal the volume of PersistentVolume pv, and returns its health
// after the heal.
func (c *Client) Heal(ctx context.Context, t Target, pv string) (*Result, error) {
	client, err := c.conn(t)
	if err != nil {
		return nil, err
	}
	ctx, end, err := c.callContext(ctx, t.Node, c.opts.HealTimeout)
	if err != nil {
		return nil, fmt.Errorf("heal of %s on node %s: %w", pv, t.Node, err)
	}
	defer end()
	resp, err := client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: pv, Volume: c.volumeFacts(pv)})
	if err != nil {
		return nil, fmt.Errorf("heal of %s on node %s: %w", pv, t.Node, Classify(err))
	}
	r, err := healResult(resp)
	if err != nil {
		return nil, fmt.Errorf("heal of %s on node %s: %w", pv, t.Node, err)
	}
	return r, nil
}

// RestartContainers asks the sidecar of t to restart in place the containers of the pod with UID
// podUID that mount the publish target of PersistentVolume pv on its node, and returns the names of
// the containers it stopped (kubelet starts them again). ErrUnsupported (UNIMPLEMENTED) means the
// sidecar has no access to the container runtime and ErrNotStaged (FAILED_PRECONDITION) that no
// running container of the pod mounts the volume there: neither is worth another try.
func (c *Client) RestartContainers(ctx context.Context, t Target, pv, podUID string) ([]string, error) {
	client, err := c.conn(t)
	if err != nil {
		return nil, err
	}
	ctx, end, err := c.callContext(ctx, t.Node, c.opts.RestartTimeout)
	if err != nil {
		return nil, fmt.Errorf("restart of the containers of pod %s on volume %s on node %s: %w", podUID, pv, t.Node, err)
	}
	defer end()
	resp, err := client.RestartContainers(ctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: podUID})
	if err != nil {
		return nil, fmt.Errorf("restart of the containers of pod %s on volume %s on node %s: %w", podUID, pv, t.Node, Classify(err))
	}
	names := resp.GetContainers()
	if len(names) == 0 {
		return nil, fmt.Errorf("restart of the containers of pod %s on volume %s on node %s: %w: the answer names no container it stopped (containers is REQUIRED)",
			podUID, pv, t.Node, ErrMalformed)
	}
	for _, n := range names {
		if n == "" {
			return nil, fmt.Errorf("restart of the containers of pod %s on volume %s on node %s: %w: the answer names a container with an empty name",
				podUID, pv, t.Node, ErrMalformed)
		}
	}
	return names, nil
}

// ListStaged lists the volumes the driver of t has staged on its node, following next tokens.
// The whole listing is bounded by Options.ListMaxEntries, ListMaxBytes and ListTimeout, so that
// one sidecar cannot fill the controller's memory or hold up a sweep of every node: past a bound
// the listing fails, with ErrListTooLarge or ErrTimeout, and the caller knows only that this
// node's volumes are unknown.
func (c *Client) ListStaged(ctx context.Context, t Target) ([]StagedVolume, error) {
	client, err := c.conn(t)
	if err != nil {
		return nil, err
	}
	listDeadline := time.Now().Add(c.opts.ListTimeout)
	ctx, cancel := context.WithDeadline(ctx, listDeadline)
	defer cancel()
	var out []StagedVolume
	token := ""
	size := 0
	for {
		callCtx, end, err := c.callContext(ctx, t.Node, c.opts.ProbeTimeout)
		if err != nil {
			return nil, fmt.Errorf("list of %s on node %s: %w", t.Driver, t.Node, err)
		}
		resp, err := client.ListStagedVolumes(callCtx, &healerv1alpha1.NodeListStagedVolumesRequest{StartingToken: token})
		end()
		if err != nil {
			err = Classify(err)
			// gRPC may report the deadline a moment before the context does.
			if errors.Is(err, ErrTimeout) && !time.Now().Before(listDeadline) {
				err = fmt.Errorf("%w: the whole listing took longer than %s (stagedList.timeout) after %d volumes: %w", ErrTimeout, c.opts.ListTimeout, len(out), err)
			}
			return nil, fmt.Errorf("list of %s on node %s: %w", t.Driver, t.Node, err)
		}
		if size += proto.Size(resp); size > c.opts.ListMaxBytes {
			return nil, fmt.Errorf("%w: list of %s on node %s: more than %d bytes (stagedList.maxBytes) after %d volumes",
				ErrListTooLarge, t.Driver, t.Node, c.opts.ListMaxBytes, len(out))
		}
		if len(out)+len(resp.GetEntries()) > c.opts.ListMaxEntries {
			return nil, fmt.Errorf("%w: list of %s on node %s: more than %d volumes (stagedList.maxVolumes)",
				ErrListTooLarge, t.Driver, t.Node, c.opts.ListMaxEntries)
		}
		for _, e := range resp.GetEntries() {
			out = append(out, StagedVolume{PV: e.GetPvName(), VolumeID: e.GetVolumeId()})
		}
		if resp.GetNextToken() == "" {
			return out, nil
		}
		if resp.GetNextToken() == token {
			return nil, fmt.Errorf("%w: list of %s on node %s: next token %q repeats", ErrMalformed, t.Driver, t.Node, token)
		}
		token = resp.GetNextToken()
	}
}

// convertHealth turns the wire's health entries into ours. Unknown status values are kept (the CSI
// spec asks to surface them, not to act on them); an entry without a reason breaks the protocol.
func convertHealth(entries []*csi.VolumeHealth_VolumeHealthEntry) ([]Health, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	out := make([]Health, 0, len(entries))
	for i, e := range entries {
		if e.GetReason() == "" {
			return nil, fmt.Errorf("%w: health entry %d (%s) has no reason", ErrMalformed, i, e.GetStatus())
		}
		name := e.GetStatus().String()
		if _, known := csi.VolumeHealthErrorType_name[int32(e.GetStatus())]; !known {
			name = "UNKNOWN_" + strconv.Itoa(int(e.GetStatus()))
		}
		out = append(out, Health{Status: name, Reason: e.GetReason(), Message: e.GetMessage()})
	}
	return out, nil
}

// TokenSource gives the controller's token for the sidecars of one node.
type TokenSource interface {
	// Token returns a token that the sidecars of node accept, and that no other node's accepts.
	Token(ctx context.Context, node string) (string, error)
}

// nodeKey is the context key of the node a call goes to.
type nodeKey struct{}

// tokenCreds attaches the ServiceAccount token to every call.
type tokenCreds struct{ c *Client }

func (t tokenCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	var tok string
	var err error
	if t.c.opts.Tokens != nil {
		node, _ := ctx.Value(nodeKey{}).(string)
		tok, err = t.c.opts.Tokens.Token(ctx, node)
	} else {
		tok, err = t.c.currentToken()
	}
	if err != nil || tok == "" {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

// RequireTransportSecurity is false so that tests and demos can run without TLS; with TLS off the
// token crosses the wire in clear, which the configuration's validation warns about.
func (t tokenCreds) RequireTransportSecurity() bool { return false }

func (c *Client) currentToken() (string, error) {
	if c.opts.TokenFile == "" {
		return "", nil
	}
	c.tokenMu.Lock()
	defer c.tokenMu.Unlock()
	now := c.opts.Clock.Now()
	if c.token != "" && now.Sub(c.tokenRead) < c.opts.TokenRefresh {
		return c.token, nil
	}
	data, err := os.ReadFile(c.opts.TokenFile)
	if err != nil {
		return "", fmt.Errorf("read ServiceAccount token %s: %w", c.opts.TokenFile, err)
	}
	c.token, c.tokenRead = strings.TrimSpace(string(data)), now
	return c.token, nil
}
