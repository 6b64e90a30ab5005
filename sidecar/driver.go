package sidecar

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/csi-addons/spec/lib/go/identity"
	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// driverInfo is what the driver said about itself the last time the sidecar connected to it.
// It is never changed after it is built, so it is shared without copying.
type driverInfo struct {
	name          string
	vendorVersion string
	// healerUnimplemented is set when the driver answered GetHealerCapabilities with
	// UNIMPLEMENTED: it serves no Healer service at all.
	healerUnimplemented bool
	capabilities        []*healerv1alpha1.HealerCapability
	attributes          map[string]string
}

// serves reports whether the driver advertises the Healer RPC t.
func (i *driverInfo) serves(t healerv1alpha1.HealerCapability_RPC_Type) bool {
	return !i.healerUnimplemented && healerv1alpha1.HasRPC(i.capabilities, t)
}

// driverClient is the sidecar's connection to the driver's CSI-Addons socket. It caches the
// driver's identity and healer capabilities and loads them again whenever the connection is
// made anew (the driver restarted).
type driverClient struct {
	endpoint string
	timeout  time.Duration
	conn     *grpc.ClientConn
	identity identity.IdentityClient
	healer   healerv1alpha1.HealerClient
	metrics  *Metrics
	// onReconnect runs after a load that follows the loss of a ready connection: the driver
	// restarted (a UNIX socket connection does not drop otherwise, and idleness is off).
	onReconnect func(*driverInfo)
	// loaded is closed once a load has worked: the driver answered GetIdentity and
	// GetHealerCapabilities, and can be asked to probe and heal.
	loaded     chan struct{}
	loadedOnce sync.Once

	loads singleflight.Group
	mu    sync.RWMutex
	info  *driverInfo
	// loadErr is the last load failure, for the error of calls made before any load worked.
	loadErr error
}

func newDriverClient(o *Options, metrics *Metrics) (*driverClient, error) {
	conn, err := grpc.NewClient(o.DriverEndpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxMessageSize), grpc.MaxCallSendMsgSize(o.MaxMessageSize)),
		// An idle channel drops its connection, which would look like a driver restart to watch.
		grpc.WithIdleTimeout(0),
		// A local socket comes back within seconds of a driver restart; the default backoff of up
		// to two minutes would leave the sidecar unavailable long after the driver is back, and
		// its restart marker unwritten. Dialling a UNIX socket that is not there costs next to
		// nothing, so the sidecar tries at least every driverDialRetryMax.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: driverDialRetryMax},
			MinConnectTimeout: 5 * time.Second,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: driver endpoint %s: %w", ErrInvalidOptions, o.DriverEndpoint, err)
	}
	return &driverClient{
		endpoint: o.DriverEndpoint,
		timeout:  o.DriverTimeout,
		conn:     conn,
		identity: identity.NewIdentityClient(conn),
		healer:   healerv1alpha1.NewHealerClient(conn),
		metrics:  metrics,
		loaded:   make(chan struct{}),
	}, nil
}

// driverDialRetryMax is the longest the sidecar waits between two connection attempts to the
// driver's socket: the restart marker follows the driver's readiness (its socket answers) by at
// most this, its identity and capabilities calls and one write. A restarted driver is ready to
// heal as soon as it answers, and the controller sweeps a lone restart as soon as it sees the
// marker, so this wait is most of what the sidecar adds to a restart's outage.
const driverDialRetryMax = 200 * time.Millisecond

// driverRetryMax is the longest the sidecar waits between two tries to ask a driver that
// accepted the connection for its identity and capabilities; each failure is logged.
const driverRetryMax = time.Second

func (d *driverClient) close() error {
	return d.conn.Close()
}

// cached returns the driver's identity and capabilities as last loaded, or nil.
func (d *driverClient) cached() *driverInfo {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.info
}

// current returns the cached identity and capabilities, loading them first if no load has
// worked yet. It fails with ErrNotReady while the driver cannot be asked.
func (d *driverClient) current(ctx context.Context) (*driverInfo, error) {
	if info := d.cached(); info != nil {
		return info, nil
	}
	if err := d.load(ctx); err != nil {
		return nil, fmt.Errorf("%w: the driver at %s has not told its name and capabilities yet: %w", ErrNotReady, d.endpoint, err)
	}
	return d.cached(), nil
}

// load asks the driver for its identity and healer capabilities and caches them. Concurrent
// loads are folded into one.
func (d *driverClient) load(ctx context.Context) error {
	_, err, _ := d.loads.Do("load", func() (any, error) {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.timeout)
		defer cancel()
		info, err := d.ask(lctx)
		d.mu.Lock()
		if err != nil {
			d.loadErr = err
		} else {
			d.info, d.loadErr = info, nil
		}
		d.mu.Unlock()
		if err != nil {
			return nil, err
		}
		d.loadedOnce.Do(func() { close(d.loaded) })
		log := klog.FromContext(ctx)
		log.Info("Driver identity and healer capabilities loaded", "driver", info.name,
			"vendorVersion", info.vendorVersion, "capabilities", capabilityNames(info), "attributes", info.attributes)
		if !info.healerUnimplemented && !healerv1alpha1.HasRPC(info.capabilities, healerv1alpha1.HealerCapability_RPC_PROBE) {
			log.Info("The driver does not advertise PROBE, which the protocol requires; probes will answer UNIMPLEMENTED", "driver", info.name)
		}
		return nil, nil
	})
	return err
}

func (d *driverClient) ask(ctx context.Context) (*driverInfo, error) {
	id, err := d.identity.GetIdentity(ctx, &identity.GetIdentityRequest{})
	if err != nil {
		return nil, fmt.Errorf("CSI-Addons GetIdentity: %w", d.relay(err))
	}
	if id.GetName() == "" {
		return nil, fmt.Errorf("%w: the driver at %s answered GetIdentity with an empty name", ErrDriverIdentity, d.endpoint)
	}
	if v := id.GetManifest()[healerv1alpha1.IdentityManifestKey]; v != healerv1alpha1.Version {
		klog.FromContext(ctx).Info("The driver's identity manifest does not announce this healer protocol version; asking for its capabilities anyway",
			"driver", id.GetName(), "key", healerv1alpha1.IdentityManifestKey, "got", v, "want", healerv1alpha1.Version)
	}
	info := &driverInfo{name: id.GetName(), vendorVersion: id.GetVendorVersion()}
	caps, err := d.healer.GetHealerCapabilities(ctx, &healerv1alpha1.GetHealerCapabilitiesRequest{})
	switch {
	case status.Code(err) == codes.Unimplemented:
		info.healerUnimplemented = true
	case err != nil:
		return nil, fmt.Errorf("GetHealerCapabilities: %w", d.relay(err))
	default:
		info.capabilities = caps.GetCapabilities()
		info.attributes = maps.Clone(caps.GetAttributes())
	}
	return info, nil
}

func capabilityNames(info *driverInfo) []string {
	if info.healerUnimplemented {
		return []string{"(Healer not served)"}
	}
	var names []string
	for _, c := range info.capabilities {
		names = append(names, c.GetRpc().GetType().String())
	}
	slices.Sort(names)
	return names
}

// watch keeps the connection to the driver up and loads the identity and capabilities again
// each time a new connection is ready, which is how a driver restart shows. It returns when
// ctx is done.
func (d *driverClient) watch(ctx context.Context) {
	const firstRetry, maxRetry = 200 * time.Millisecond, driverRetryMax
	log := klog.FromContext(ctx)
	retries := retryBackoff(firstRetry, maxRetry)
	// stale: the ready connection, if any, has not been asked yet. lost: a ready connection
	// went away since the last load.
	stale, lost := true, false
	d.conn.Connect()
	for {
		st := d.conn.GetState()
		switch st {
		case connectivity.Idle:
			// An idle channel connects only when asked; ask, so that a restarted driver is
			// noticed without waiting for the next call.
			d.conn.Connect()
		case connectivity.Ready:
			if !stale {
				break
			}
			if err := d.load(ctx); err != nil {
				retryIn := retries.Step()
				log.Error(err, "Cannot load the driver's identity and capabilities; retrying", "endpoint", d.endpoint, "retryIn", retryIn)
				wctx, cancel := context.WithTimeout(ctx, retryIn)
				d.conn.WaitForStateChange(wctx, st)
				cancel()
				if ctx.Err() != nil {
					return
				}
				continue
			}
			if lost && d.onReconnect != nil {
				d.onReconnect(d.cached())
			}
			stale, lost = false, false
			retries = retryBackoff(firstRetry, maxRetry)
		}
		if !d.conn.WaitForStateChange(ctx, st) {
			return
		}
		if st == connectivity.Ready {
			// Whatever comes next, the connection that was ready is gone; the next ready one may
			// lead to a restarted, possibly upgraded, driver.
			stale, lost = true, true
		}
	}
}

// callContext gives a call to the driver its deadline: the caller's, when the (authenticated)
// caller sent one, longer or shorter than the driver timeout, so that a heal the controller
// allows timeouts.heal for is not cut at --driver-timeout; else the driver timeout. Of the
// caller's deadline it keeps answerMargin back, so that a driver that does not answer in time is
// reported by the sidecar, naming the driver, before the caller's own deadline ends the call
// without saying which hop hung.
func (d *driverClient) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return withAnswerMargin(ctx, d.timeout)
}

// withAnswerMargin bounds the work of a call: by the caller's deadline, less what
// answerMargin keeps back to answer, when the caller sent one; else by fallback.
func withAnswerMargin(ctx context.Context, fallback time.Duration) (context.Context, context.CancelFunc) {
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		return context.WithTimeout(ctx, left-min(left/10, answerMargin))
	}
	return context.WithTimeout(ctx, fallback)
}

// answerMargin is the most of a caller's deadline that callContext keeps back for the answer:
// a tenth of the time left, at most this.
const answerMargin = time.Second

// relay turns an error of a call to the driver into the error the controller gets: the
// driver's own status codes pass unchanged, with the driver's message; the two codes that the
// transport or the sidecar's timeout produce get a message naming the socket.
func (d *driverClient) relay(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	d.metrics.driverError(st.Code())
	switch st.Code() {
	case codes.Unavailable:
		return status.Errorf(codes.Unavailable, "the driver at %s is unavailable: %s", d.endpoint, st.Message())
	case codes.DeadlineExceeded:
		return status.Errorf(codes.DeadlineExceeded,
			"the driver at %s did not answer within the sidecar's timeout (%s) or the caller's deadline: %s", d.endpoint, d.timeout, st.Message())
	case codes.Canceled:
		return status.Errorf(codes.Canceled, "the call was canceled while the driver at %s worked on it", d.endpoint)
	}
	return st.Err()
}
