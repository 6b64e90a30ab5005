package driverkit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// DefaultKubeletRegistrationDir is the folder kubelet's plugin watcher watches for plugin
// registration sockets, under kubelet's default root.
const DefaultKubeletRegistrationDir = "/var/lib/kubelet/plugins_registry"

// maxUnixSocketPath is the longest path a UNIX socket can be bound to on Linux (sun_path holds
// 108 bytes, the last one a NUL).
const maxUnixSocketPath = 107

// KubeletRegistration configures the registration of a CSI driver with kubelet, which
// node-driver-registrar does for drivers that do not do it themselves. Zero values take the
// defaults documented on each field.
type KubeletRegistration struct {
	// Dir is kubelet's plugin registration folder as this process sees it; the registration
	// socket is <Dir>/<DriverName>-reg.sock. Default: DefaultKubeletRegistrationDir.
	Dir string

	// DriverName is the CSI driver's name, as its CSIDriver object and GetPluginInfo say it.
	// Required.
	DriverName string

	// Endpoint is the path of the driver's CSI socket as kubelet sees it (in kubelet's mount
	// namespace, not in the driver's container), such as
	// /var/lib/kubelet/plugins/<DriverName>/csi.sock. A plain path, not a "unix://" URL. Required.
	Endpoint string

	// Versions are the CSI versions the driver supports, reported to kubelet.
	// Default: ["1.0.0"].
	Versions []string

	// ShutdownTimeout bounds how long Start waits for a call in flight once its context is
	// done. Default: 5s.
	ShutdownTimeout time.Duration

	// OnStatus, when set, is called with every registration status kubelet reports, in order,
	// from the gRPC call that reported it; it must not block. Default: none.
	OnStatus func(RegistrationStatus)

	// Logger receives a line per GetInfo and per status kubelet reports (an error for a failed
	// registration). Default: discard.
	Logger logr.Logger
}

// RegistrationStatus is what kubelet reported after it validated the driver's registration.
type RegistrationStatus struct {
	// Registered is true when kubelet registered the driver.
	Registered bool
	// Error is kubelet's reason when it did not.
	Error string
	// At is when kubelet reported it.
	At time.Time
}

// withDefaults validates the options and fills in their defaults.
func (o KubeletRegistration) withDefaults() (KubeletRegistration, error) {
	if o.Dir == "" {
		o.Dir = DefaultKubeletRegistrationDir
	}
	switch {
	case o.DriverName == "":
		return o, fmt.Errorf("%w: KubeletRegistration.DriverName is required: kubelet registers the driver under it", ErrInvalidOptions)
	case o.DriverName != filepath.Base(o.DriverName) || o.DriverName == "." || o.DriverName == "..":
		return o, fmt.Errorf("%w: KubeletRegistration.DriverName %q is not a CSI driver name (it names the registration socket, so it cannot hold a \"/\")", ErrInvalidOptions, o.DriverName)
	case o.Endpoint == "":
		return o, fmt.Errorf("%w: KubeletRegistration.Endpoint is required: the path of the CSI socket as kubelet sees it", ErrInvalidOptions)
	case !filepath.IsAbs(o.Endpoint):
		return o, fmt.Errorf("%w: KubeletRegistration.Endpoint %q must be an absolute path (not a unix:// URL): kubelet dials it as a path", ErrInvalidOptions, o.Endpoint)
	}
	if len(o.Versions) == 0 {
		o.Versions = []string{"1.0.0"}
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 5 * time.Second
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	if p := o.SocketPath(); len(p) > maxUnixSocketPath {
		return o, fmt.Errorf("%w: the registration socket %s is %d bytes long, more than a UNIX socket path may be (%d); use a shorter Dir",
			ErrInvalidOptions, p, len(p), maxUnixSocketPath)
	}
	return o, nil
}

// SocketPath is the registration socket kubelet's plugin watcher finds: <Dir>/<DriverName>-reg.sock.
func (o KubeletRegistration) SocketPath() string {
	dir := o.Dir
	if dir == "" {
		dir = DefaultKubeletRegistrationDir
	}
	return filepath.Join(dir, o.DriverName+"-reg.sock")
}

// KubeletRegistrar serves kubelet's plugin registration service for one CSI driver: kubelet's
// plugin watcher finds its socket in the registration folder, asks it for the driver's name
// and CSI endpoint (GetInfo), and reports whether it registered the driver
// (NotifyRegistrationStatus). Removing the socket makes kubelet deregister the driver.
type KubeletRegistrar struct {
	opts KubeletRegistration
	srv  *grpc.Server
	lis  *net.UnixListener
	// made is the socket file this registrar bound, to tell it from one a later instance
	// bound at the same path.
	made os.FileInfo

	mu      sync.Mutex
	last    RegistrationStatus
	known   bool
	started bool
}

// NewKubeletRegistrar listens on the registration socket at once, replacing a socket file
// left by an earlier instance that was killed; Start then serves kubelet. Anything at that
// path that is not a socket is left alone and is an error.
func NewKubeletRegistrar(opts KubeletRegistration) (*KubeletRegistrar, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	path := opts.SocketPath()
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create the kubelet registration folder %s: %w", opts.Dir, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket (%s); remove it so that the driver can register", path, fi.Mode().Type())
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("remove the stale registration socket %s: %w", path, err)
		}
		opts.Logger.Info("Replaced a stale registration socket", "path", path)
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on the registration socket %s: %w", path, err)
	}
	// Start removes the socket itself, and only if it is still this registrar's.
	lis.SetUnlinkOnClose(false)
	made, err := os.Lstat(path)
	if err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("stat the registration socket %s: %w", path, err)
	}
	r := &KubeletRegistrar{opts: opts, lis: lis, made: made, srv: grpc.NewServer()}
	registerapi.RegisterRegistrationServer(r.srv, &registrationServer{r: r})
	return r, nil
}

// RegisterWithKubelet registers a CSI driver with kubelet and keeps it registered until ctx is
// done: NewKubeletRegistrar, then Start.
func RegisterWithKubelet(ctx context.Context, opts KubeletRegistration) error {
	r, err := NewKubeletRegistrar(opts)
	if err != nil {
		return err
	}
	return r.Start(ctx)
}

// SocketPath is the registration socket the registrar serves.
func (r *KubeletRegistrar) SocketPath() string {
	return r.opts.SocketPath()
}

// Status returns the last registration status kubelet reported; ok is false while kubelet has
// reported none.
func (r *KubeletRegistrar) Status() (s RegistrationStatus, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.known
}

// Start serves kubelet until ctx is done, then stops (a call in flight gets
// KubeletRegistration.ShutdownTimeout) and removes the socket, which deregisters the driver.
// It returns nil after a shutdown requested through ctx. A registrar starts once.
func (r *KubeletRegistrar) Start(ctx context.Context) error {
	r.mu.Lock()
	if r.started {
		r.mu.Unlock()
		return errors.New("the kubelet registrar was started already")
	}
	r.started = true
	r.mu.Unlock()

	log := r.opts.Logger.WithValues("driver", r.opts.DriverName, "path", r.opts.SocketPath())
	log.Info("Serving kubelet plugin registration", "endpoint", r.opts.Endpoint, "versions", r.opts.Versions)
	served := make(chan error, 1)
	go func() { served <- r.srv.Serve(r.lis) }()

	var err error
	select {
	case err = <-served:
		err = fmt.Errorf("serve the registration socket %s: %w", r.opts.SocketPath(), err)
	case <-ctx.Done():
		stopped := make(chan struct{})
		go func() {
			r.srv.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(r.opts.ShutdownTimeout):
			r.srv.Stop()
		}
	}
	r.removeSocket(log)
	return err
}

// removeSocket removes the socket file unless another instance replaced it meanwhile: that
// one's registration must stay.
func (r *KubeletRegistrar) removeSocket(log logr.Logger) {
	path := r.opts.SocketPath()
	fi, err := os.Lstat(path)
	if err != nil {
		return
	}
	if !os.SameFile(fi, r.made) {
		log.Info("The registration socket belongs to another instance now; leaving it")
		return
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Error(err, "Cannot remove the registration socket; kubelet keeps the driver registered until it is gone")
		return
	}
	log.Info("Removed the registration socket")
}

func (r *KubeletRegistrar) report(s RegistrationStatus) {
	r.mu.Lock()
	r.last, r.known = s, true
	r.mu.Unlock()
	if r.opts.OnStatus != nil {
		r.opts.OnStatus(s)
	}
}

// registrationServer is kubelet's pluginregistration.Registration service.
type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	r *KubeletRegistrar
}

var _ registerapi.RegistrationServer = (*registrationServer)(nil)

// GetInfo tells kubelet that this is a CSI plugin, its name, where its CSI socket is, and the CSI
// versions it supports.
func (s *registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	o := s.r.opts
	o.Logger.V(2).Info("Kubelet asked for the plugin's registration", "driver", o.DriverName, "endpoint", o.Endpoint)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              o.DriverName,
		Endpoint:          o.Endpoint,
		SupportedVersions: slices.Clone(o.Versions),
	}, nil
}

// NotifyRegistrationStatus records what kubelet did with the registration. A failure is logged
// as an error: kubelet then does not call the driver at all, and pods using its volumes stay
// ContainerCreating.
func (s *registrationServer) NotifyRegistrationStatus(_ context.Context, req *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	o := s.r.opts
	st := RegistrationStatus{Registered: req.GetPluginRegistered(), Error: req.GetError(), At: time.Now()}
	if st.Registered {
		o.Logger.Info("Registered with kubelet", "driver", o.DriverName, "endpoint", o.Endpoint)
	} else {
		o.Logger.Error(errors.New(cmp.Or(st.Error, "no reason given")), "Kubelet refused the driver's registration",
			"driver", o.DriverName, "endpoint", o.Endpoint, "versions", o.Versions)
	}
	s.r.report(st)
	return &registerapi.RegistrationStatusResponse{}, nil
}
