// Package fakecri is a container runtime for tests: it serves the CRI runtime service (the part
// of it the healer sidecar calls: Version, ListContainers, ContainerStatus, StopContainer) on a
// real UNIX socket, from containers a test describes, and records the calls it gets. A test can
// make it hang on a call or hold the stops.
//
// It stands in for containerd in the sidecar's tests; it imports nothing of volume-healer.
package fakecri

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The labels kubelet sets on the containers it creates.
const (
	PodUIDLabel        = "io.kubernetes.pod.uid"
	ContainerNameLabel = "io.kubernetes.container.name"
)

// Container is a container of the fake runtime.
type Container struct {
	// ID is the runtime's container ID.
	ID string
	// PodUID and Name are the pod's UID and the container's name, as kubelet labels them.
	PodUID, Name string
	// Exited makes the container an exited one; otherwise it runs.
	Exited bool
	// HostPaths are the host paths of the container's mounts.
	HostPaths []string
}

// Stop is one StopContainer call.
type Stop struct {
	// ID is the container stopped.
	ID string
	// Timeout is the grace period asked for, in seconds.
	Timeout int64
}

// Runtime is the fake runtime's state: its containers and the calls it got.
type Runtime struct {
	runtimeapi.UnimplementedRuntimeServiceServer

	mu         sync.Mutex
	containers []*Container
	stops      []Stop
	calls      map[string]int
	hang       map[string]bool
	hold       chan struct{}
	// stopping receives the ID of each StopContainer call as it arrives.
	stopping chan string
}

// Server is a Runtime served on a UNIX socket.
type Server struct {
	*Runtime
	srv  *grpc.Server
	done chan struct{}
	once sync.Once
}

// Serve serves a runtime with containers on the UNIX socket at path, replacing a socket file
// left there. Stop it with Stop.
func Serve(path string, containers ...Container) (*Server, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSocket != 0 {
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	r := &Runtime{calls: map[string]int{}, hang: map[string]bool{}, stopping: make(chan string, 64)}
	for _, c := range containers {
		r.Add(c)
	}
	s := &Server{Runtime: r, srv: grpc.NewServer(), done: make(chan struct{})}
	runtimeapi.RegisterRuntimeServiceServer(s.srv, r)
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(lis)
	}()
	return s, nil
}

// Stop stops serving at once; the socket file goes with the listener.
func (s *Server) Stop() {
	s.once.Do(func() {
		s.srv.Stop()
		<-s.done
	})
}

// Add adds a container.
func (r *Runtime) Add(c Container) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.HostPaths = slices.Clone(c.HostPaths)
	r.containers = append(r.containers, &c)
}

// Running reports whether the container id runs.
func (r *Runtime) Running(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.find(id)
	return c != nil && !c.Exited
}

// Stops returns the StopContainer calls made so far.
func (r *Runtime) Stops() []Stop {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.stops)
}

// Calls returns the number of calls made so far, all methods together.
func (r *Runtime) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += c
	}
	return n
}

// Hang makes the calls of the methods named (such as "ListContainers"), and of those alone, wait
// for their caller to give up. Hang() ends the hangs.
func (r *Runtime) Hang(methods ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.hang)
	for _, m := range methods {
		r.hang[m] = true
	}
}

// HoldStops makes StopContainer calls wait, once they are recorded, until release is called or
// their caller gives up. Stopping receives the ID of each as it arrives.
func (r *Runtime) HoldStops() (release func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	hold := make(chan struct{})
	r.hold = hold
	var once sync.Once
	return func() { once.Do(func() { close(hold) }) }
}

// Stopping receives the ID of each StopContainer call as it arrives.
func (r *Runtime) Stopping() <-chan string { return r.stopping }

func (r *Runtime) find(id string) *Container {
	for _, c := range r.containers {
		if c.ID == id {
			return c
		}
	}
	return nil
}

// enter counts a call of method and hangs it if asked to.
func (r *Runtime) enter(ctx context.Context, method string) error {
	r.mu.Lock()
	r.calls[method]++
	hang := r.hang[method]
	r.mu.Unlock()
	if hang {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	return nil
}

func state(c *Container) runtimeapi.ContainerState {
	if c.Exited {
		return runtimeapi.ContainerState_CONTAINER_EXITED
	}
	return runtimeapi.ContainerState_CONTAINER_RUNNING
}

func labels(c *Container) map[string]string {
	return map[string]string{PodUIDLabel: c.PodUID, ContainerNameLabel: c.Name, "io.kubernetes.pod.name": "pod-" + c.PodUID}
}

// Version answers as containerd does.
func (r *Runtime) Version(ctx context.Context, _ *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	if err := r.enter(ctx, "Version"); err != nil {
		return nil, err
	}
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fakecri", RuntimeVersion: "v0.0.0", RuntimeApiVersion: "v1"}, nil
}

// ListContainers lists the containers that pass the filter's ID, state and labels.
func (r *Runtime) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	if err := r.enter(ctx, "ListContainers"); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f := req.GetFilter()
	out := &runtimeapi.ListContainersResponse{}
	for _, c := range r.containers {
		if f.GetId() != "" && f.GetId() != c.ID {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != state(c) {
			continue
		}
		l := labels(c)
		match := true
		for k, v := range f.GetLabelSelector() {
			if l[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		out.Containers = append(out.Containers, &runtimeapi.Container{
			Id: c.ID, Metadata: &runtimeapi.ContainerMetadata{Name: c.Name}, State: state(c), Labels: l,
		})
	}
	return out, nil
}

// ContainerStatus answers with the container's state, labels and mounts.
func (r *Runtime) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	if err := r.enter(ctx, "ContainerStatus"); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.find(req.GetContainerId())
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", req.GetContainerId())
	}
	st := &runtimeapi.ContainerStatus{Id: c.ID, Metadata: &runtimeapi.ContainerMetadata{Name: c.Name}, State: state(c), Labels: labels(c)}
	for i, p := range c.HostPaths {
		st.Mounts = append(st.Mounts, &runtimeapi.Mount{ContainerPath: fmt.Sprintf("/mnt/%d", i), HostPath: p})
	}
	return &runtimeapi.ContainerStatusResponse{Status: st}, nil
}

// StopContainer records the stop and makes the container exited, after the hold, if any.
func (r *Runtime) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	if err := r.enter(ctx, "StopContainer"); err != nil {
		return nil, err
	}
	r.mu.Lock()
	c := r.find(req.GetContainerId())
	if c == nil {
		r.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "container %q not found", req.GetContainerId())
	}
	r.stops = append(r.stops, Stop{ID: c.ID, Timeout: req.GetTimeout()})
	hold := r.hold
	r.mu.Unlock()
	select {
	case r.stopping <- c.ID:
	default:
	}
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	r.mu.Lock()
	c.Exited = true
	r.mu.Unlock()
	return &runtimeapi.StopContainerResponse{}, nil
}
