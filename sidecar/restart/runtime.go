package restart

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Defaults of Options, exported so that the command line can show them.
const (
	// DefaultStopGracePeriod is the most a stopped container is given between the runtime's stop
	// signal and its SIGKILL.
	DefaultStopGracePeriod = 10 * time.Second
	// DefaultCheckTimeout bounds each Version call that tells whether the runtime answers.
	DefaultCheckTimeout = 5 * time.Second
)

// The waits between two checks of a runtime that did not answer: they double from the first up
// to the last. A runtime that answers is asked again every healthyRecheck, so that the
// capability follows a runtime that went away while no call came.
const (
	firstRecheck   = time.Second
	maxRecheck     = 30 * time.Second
	healthyRecheck = time.Minute
)

// maxMessageSize bounds the runtime's answers. One pod's containers and the status of one
// container without its verbose information take a few kilobytes; a runtime that ignored the
// list's filter and answered with every container of a crowded node fits too.
const maxMessageSize = 16 << 20

// criVersion is the version of the CRI runtime service the sidecar speaks.
const criVersion = "v1"

// Options configure a Runtime. Zero values take the defaults documented on each field.
type Options struct {
	// Endpoint is the runtime's CRI socket as a gRPC target, "unix:///absolute/path", such as
	// unix:///run/containerd/containerd.sock. Required.
	Endpoint string

	// StopGracePeriod is the most a stopped container is given between the runtime's stop signal
	// (SIGTERM, or the image's STOPSIGNAL) and its SIGKILL; a call's deadline may leave it less.
	// It is counted in whole seconds, as CRI counts it. Default: DefaultStopGracePeriod.
	StopGracePeriod time.Duration

	// CheckTimeout bounds each Version call that tells whether the runtime answers. Default:
	// DefaultCheckTimeout.
	CheckTimeout time.Duration

	// OnReachable, when set, is called with true each time the runtime answers after it did not
	// (or for the first time), and with false each time it stops answering.
	OnReachable func(reachable bool)

	// Clock times the waits between checks of a runtime that does not answer. Default: the real
	// clock.
	Clock clock.WithTicker
}

func (o *Options) setDefaults() error {
	path, ok := strings.CutPrefix(o.Endpoint, "unix://")
	if !ok || !filepath.IsAbs(path) {
		return fmt.Errorf("%w: container runtime endpoint %q must look like unix:///run/containerd/containerd.sock", ErrInvalidOptions, o.Endpoint)
	}
	if o.StopGracePeriod < 0 || o.CheckTimeout < 0 {
		return fmt.Errorf("%w: StopGracePeriod (%s) and CheckTimeout (%s) must not be negative", ErrInvalidOptions, o.StopGracePeriod, o.CheckTimeout)
	}
	if o.StopGracePeriod == 0 {
		o.StopGracePeriod = DefaultStopGracePeriod
	}
	if o.StopGracePeriod < time.Second {
		return fmt.Errorf("%w: StopGracePeriod must be at least 1s (CRI counts it in whole seconds), got %s", ErrInvalidOptions, o.StopGracePeriod)
	}
	if o.CheckTimeout == 0 {
		o.CheckTimeout = DefaultCheckTimeout
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return nil
}

// Runtime is the sidecar's connection to the node's container runtime. Create it with New, keep
// its reachability current with Start, and release it with Close.
type Runtime struct {
	opts   Options
	conn   *grpc.ClientConn
	client runtimeapi.RuntimeServiceClient
	// recheck holds one pending request to check the runtime again, after a call found it gone.
	recheck chan struct{}

	mu sync.Mutex
	// reachable: the runtime's last answer, to a Version check or to a call, was no transport
	// failure. why says why not.
	reachable bool
	why       error
	// inFlight holds the publish targets whose containers a Restart is stopping.
	inFlight map[string]struct{}
	// asked closes once the runtime has been asked for the first time and has answered or
	// failed to (askedOnce).
	asked     chan struct{}
	askedOnce sync.Once
}

// New makes the connection to the runtime at opts.Endpoint. It does not wait for the runtime:
// Start checks it.
func New(opts Options) (*Runtime, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(opts.Endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageSize)),
		// A local socket comes back within seconds of a runtime restart; gRPC's default backoff of
		// up to two minutes would answer UNAVAILABLE long after it is back.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: container runtime endpoint %s: %w", ErrInvalidOptions, opts.Endpoint, err)
	}
	return &Runtime{
		opts:     opts,
		conn:     conn,
		client:   runtimeapi.NewRuntimeServiceClient(conn),
		recheck:  make(chan struct{}, 1),
		why:      fmt.Errorf("%w: the container runtime at %s has not been asked yet", ErrUnreachable, opts.Endpoint),
		inFlight: map[string]struct{}{},
		asked:    make(chan struct{}),
	}, nil
}

// Asked is closed once Start has asked the runtime for the first time and it answered, or did
// not within CheckTimeout: from then on Reachable says what the runtime did, not that it was
// not asked yet.
func (r *Runtime) Asked() <-chan struct{} { return r.asked }

// Endpoint is the runtime's socket, as a gRPC target.
func (r *Runtime) Endpoint() string { return r.opts.Endpoint }

// Reachable reports whether the runtime answered the last time it was asked, and if not, why.
func (r *Runtime) Reachable() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reachable {
		return true, nil
	}
	return false, r.why
}

// Close releases the connection to the runtime.
func (r *Runtime) Close() error { return r.conn.Close() }

// Start asks the runtime for its version, and asks again, with waits that double from 1s up to
// 30s, until it answers; then every minute, and at once each time a call finds it gone. Each ask
// is bounded by CheckTimeout. It returns nil when ctx is done.
func (r *Runtime) Start(ctx context.Context) error {
	log := klog.FromContext(ctx).WithValues("endpoint", r.opts.Endpoint)
	ctx = klog.NewContext(ctx, log)
	retries := recheckBackoff()
	for {
		wait := healthyRecheck
		if err := r.check(ctx); err != nil {
			wait = retries.Step()
			log.V(2).Info("The container runtime does not answer; asking again", "error", err.Error(), "retryIn", wait)
		} else {
			retries = recheckBackoff()
		}
		if ctx.Err() != nil {
			return nil
		}
		timer := r.opts.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-r.recheck:
		case <-timer.C():
		}
		timer.Stop()
		if ctx.Err() != nil {
			return nil
		}
	}
}

func recheckBackoff() wait.Backoff {
	return wait.Backoff{Duration: firstRecheck, Factor: 2, Cap: maxRecheck, Steps: math.MaxInt}
}

// check asks the runtime for its version, within CheckTimeout, and records whether it answered.
func (r *Runtime) check(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, r.opts.CheckTimeout)
	defer cancel()
	v, err := r.client.Version(cctx, &runtimeapi.VersionRequest{Version: criVersion})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		err = fmt.Errorf("%w: Version at %s: %s", ErrUnreachable, r.opts.Endpoint, describe(err))
		r.set(ctx, false, err)
		r.askedOnce.Do(func() { close(r.asked) })
		return err
	}
	r.set(ctx, true, nil, "runtime", v.GetRuntimeName(), "runtimeVersion", v.GetRuntimeVersion(), "criVersion", v.GetRuntimeApiVersion())
	r.askedOnce.Do(func() { close(r.asked) })
	return nil
}

// set records whether the runtime answered, and logs and reports a change, with kv.
func (r *Runtime) set(ctx context.Context, reachable bool, why error, kv ...any) {
	r.mu.Lock()
	changed := r.reachable != reachable
	r.reachable = reachable
	if why != nil {
		r.why = why
	}
	r.mu.Unlock()
	if !changed {
		return
	}
	log := klog.FromContext(ctx)
	if reachable {
		log.Info("The container runtime answers; containers can be restarted in place", append([]any{"endpoint", r.opts.Endpoint}, kv...)...)
	} else {
		log.Info("The container runtime does not answer; containers cannot be restarted in place until it does",
			append([]any{"endpoint", r.opts.Endpoint, "error", why.Error()}, kv...)...)
	}
	if r.opts.OnReachable != nil {
		r.opts.OnReachable(reachable)
	}
}

// lost records that a call found the runtime unreachable, and has Start check it again.
func (r *Runtime) lost(ctx context.Context, why error) {
	r.set(ctx, false, why)
	select {
	case r.recheck <- struct{}{}:
	default: // one pending check covers several
	}
}

// describe is the code and message of a failed call, for messages.
func describe(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	return st.Code().String() + ": " + st.Message()
}

// fail turns the failure of a call to the runtime into the package's errors: ErrUnreachable for
// a runtime that cannot be reached or does not serve CRI (and Start then checks it again),
// ErrTimeout for one that did not answer within the deadline, ErrRuntime for its own errors. A
// call canceled by its caller stays a cancellation.
func (r *Runtime) fail(ctx context.Context, call string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	switch st.Code() {
	case codes.Unavailable, codes.Unimplemented:
		why := fmt.Errorf("%w: %s at %s: %s", ErrUnreachable, call, r.opts.Endpoint, describe(err))
		r.lost(ctx, why)
		return why
	case codes.DeadlineExceeded:
		return fmt.Errorf("%w: %s at %s did not answer within the call's deadline", ErrTimeout, call, r.opts.Endpoint)
	case codes.Canceled:
		return fmt.Errorf("%s at %s: %w", call, r.opts.Endpoint, st.Err())
	}
	return fmt.Errorf("%w: %s at %s: %s", ErrRuntime, call, r.opts.Endpoint, describe(err))
}
