package restart

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	kubetypes "k8s.io/kubelet/pkg/types"
)

// Target names the containers to restart: those of one pod that mount one publish target.
type Target struct {
	// PodUID is the pod's UID, as kubelet labels its containers (io.kubernetes.pod.uid).
	PodUID string
	// PublishTarget is the volume's publish target for that pod on the node, as kubelet gives
	// it to the runtime: a container qualifies when one of its mounts has exactly this host path.
	PublishTarget string
	// SubpathDir, when set, is the pod's folder of subPath bind mounts
	// (<kubelet root>/pods/<pod UID>/volume-subpaths). A mount under it is of a subPath of one of
	// the pod's volumes, named by the pod's volume name, not by the volume: it does not qualify a
	// container, and Restart says which containers have one.
	SubpathDir string
}

// CheckPodUID checks that uid can be a pod's UID: kubelet names a folder after it, so it is one
// path element, and a label value, so it is at most 63 characters. It fails with
// ErrInvalidTarget.
func CheckPodUID(uid string) error {
	if uid == "" || uid == "." || uid == ".." || len(uid) > 63 || strings.ContainsAny(uid, "/\x00") {
		return fmt.Errorf("%w: %q is not a pod UID (one path element of at most 63 characters)", ErrInvalidTarget, uid)
	}
	return nil
}

func (t Target) validate() error {
	if err := CheckPodUID(t.PodUID); err != nil {
		return err
	}
	if !filepath.IsAbs(t.PublishTarget) || filepath.Clean(t.PublishTarget) != t.PublishTarget {
		return fmt.Errorf("%w: publish target %q is not a clean absolute path", ErrInvalidTarget, t.PublishTarget)
	}
	if t.SubpathDir != "" && !filepath.IsAbs(t.SubpathDir) {
		return fmt.Errorf("%w: subPath folder %q is not an absolute path", ErrInvalidTarget, t.SubpathDir)
	}
	return nil
}

// The time Restart keeps, of its deadline, beyond a container's grace period: for the runtime
// to kill a container that outlives it and to answer. A deadline that leaves less than this and
// minGrace stops nothing.
const (
	killMargin = time.Second
	minGrace   = time.Second
)

// found is a running container of the pod that mounts the publish target.
type found struct {
	id, name string
}

// Restart stops the running containers of the pod t.PodUID that mount t.PublishTarget, each with
// the runtime's stop signal and StopGracePeriod, or what ctx's deadline leaves of it, before
// SIGKILL; kubelet then starts them again under the pod's restart policy. It returns the names
// of the containers it stopped, sorted. It stops no other container, of that pod or another.
//
// Every runtime call is made under ctx. Errors: ErrInvalidTarget, ErrBusy (a Restart of the same
// target is in flight), ErrNoContainer (nothing to stop), ErrUnreachable, ErrTimeout (ctx's
// deadline came first, or leaves too little to stop a container gracefully), ErrRuntime. A
// failure to stop some of the containers fails the call; the containers stopped meanwhile are
// logged.
func (r *Runtime) Restart(ctx context.Context, t Target) ([]string, error) {
	if err := t.validate(); err != nil {
		return nil, err
	}
	if !r.acquire(t.PublishTarget) {
		return nil, fmt.Errorf("%w: pod %s, mount %s", ErrBusy, t.PodUID, t.PublishTarget)
	}
	defer r.release(t.PublishTarget)
	log := klog.FromContext(ctx).WithValues("podUID", t.PodUID)
	ctx = klog.NewContext(ctx, log)

	matched, subpaths, err := r.find(ctx, t)
	if err != nil {
		return nil, err
	}
	if len(matched) == 0 {
		err := fmt.Errorf("%w: no running container of pod %s on this node has %s among its mounts", ErrNoContainer, t.PodUID, t.PublishTarget)
		if len(subpaths) > 0 {
			err = fmt.Errorf("%w; containers %s mount a subPath of a volume of the pod, which cannot be tied to this volume from the node: replace the pod to give them the repaired mount",
				err, strings.Join(subpaths, ", "))
		}
		return nil, err
	}
	if len(subpaths) > 0 {
		log.Info("Containers that mount a subPath of a volume of the pod are left running: it cannot be tied to this volume from the node", "containers", subpaths)
	}
	grace, err := r.grace(ctx)
	if err != nil {
		return nil, err
	}
	return r.stop(ctx, matched, grace)
}

// find lists the pod's running containers and reads the mounts of each: those that mount the
// publish target, and the names of the others that mount a subPath of one of the pod's volumes.
func (r *Runtime) find(ctx context.Context, t Target) ([]found, []string, error) {
	list, err := r.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{kubetypes.KubernetesPodUIDLabel: t.PodUID},
	}})
	if err != nil {
		return nil, nil, r.fail(ctx, "ListContainers", err)
	}
	r.set(ctx, true, nil)
	var matched []found
	var subpaths []string
	for _, c := range list.GetContainers() {
		// The runtime filtered by state and label; what a stop relies on is checked again.
		if c.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING || c.GetLabels()[kubetypes.KubernetesPodUIDLabel] != t.PodUID {
			continue
		}
		resp, err := r.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
		if status.Code(err) == codes.NotFound {
			// Removed since the list: not running.
			continue
		}
		if err != nil {
			return nil, nil, r.fail(ctx, "ContainerStatus", err)
		}
		st := resp.GetStatus()
		if st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING || st.GetLabels()[kubetypes.KubernetesPodUIDLabel] != t.PodUID {
			continue
		}
		name := st.GetLabels()[kubetypes.KubernetesContainerNameLabel]
		if name == "" {
			name = st.GetMetadata().GetName()
		}
		mounts, subpath := false, false
		for _, m := range st.GetMounts() {
			hostPath := m.GetHostPath()
			if hostPath == "" {
				continue
			}
			hostPath = filepath.Clean(hostPath)
			if hostPath == t.PublishTarget {
				mounts = true
			} else if t.SubpathDir != "" && strings.HasPrefix(hostPath, t.SubpathDir+string(filepath.Separator)) {
				subpath = true
			}
		}
		switch {
		case mounts:
			matched = append(matched, found{id: c.GetId(), name: name})
		case subpath:
			subpaths = append(subpaths, name)
		}
	}
	slices.Sort(subpaths)
	return matched, subpaths, nil
}

// grace is the grace period of each stop: StopGracePeriod, or less when ctx's deadline leaves
// less, in whole seconds.
func (r *Runtime) grace(ctx context.Context) (time.Duration, error) {
	grace := r.opts.StopGracePeriod
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline) - killMargin
		if left < minGrace {
			return 0, fmt.Errorf("%w: the call's deadline leaves %s, too little to stop a container gracefully (at least %s)",
				ErrTimeout, time.Until(deadline).Round(time.Millisecond), minGrace+killMargin)
		}
		grace = min(grace, left)
	}
	return grace.Truncate(time.Second), nil
}

// stop stops the containers at once, each with grace, and returns their names, sorted.
func (r *Runtime) stop(ctx context.Context, containers []found, grace time.Duration) ([]string, error) {
	log := klog.FromContext(ctx)
	errs := make([]error, len(containers))
	var wg sync.WaitGroup
	for i, c := range containers {
		wg.Go(func() {
			_, err := r.client.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: c.id, Timeout: int64(grace / time.Second)})
			switch {
			case status.Code(err) == codes.NotFound:
				// Removed since it was read: it no longer runs with the old mount.
				log.V(2).Info("Container gone before it was stopped", "container", c.name, "containerID", c.id)
			case err != nil:
				errs[i] = fmt.Errorf("container %s (%s): %w", c.name, c.id, r.fail(ctx, "StopContainer", err))
			}
		})
	}
	wg.Wait()
	var names, stopped []string
	for i, c := range containers {
		names = append(names, c.name)
		if errs[i] == nil {
			stopped = append(stopped, c.name)
		}
	}
	slices.Sort(names)
	if err := errors.Join(errs...); err != nil {
		if len(stopped) > 0 {
			log.Info("Some containers were stopped before a stop failed", "stopped", stopped, "error", err.Error())
		}
		return nil, err
	}
	log.Info("Stopped containers for kubelet to start again with the repaired mount", "containers", names, "gracePeriod", grace)
	return names, nil
}

// acquire marks target in flight; false when it already is.
func (r *Runtime) acquire(target string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.inFlight[target]; ok {
		return false
	}
	r.inFlight[target] = struct{}{}
	return true
}

func (r *Runtime) release(target string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inFlight, target)
}
