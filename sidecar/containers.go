package sidecar

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/sidecar/restart"
)

// restartCallsTimeout is what a RestartContainers call without a deadline of its caller is given
// beyond the containers' grace period: to list the pod's containers, read their mounts, and have
// the runtime kill a container that outlives its grace period.
const restartCallsTimeout = 10 * time.Second

// RestartContainers stops, through the node's container runtime, the running containers of one
// pod that mount the publish target of a PV of this sidecar's driver, for kubelet to start them
// again with the repaired mount (package restart). The caller was authenticated before
// (authenticatedFirst); the sidecar serves it only where it was given the runtime's socket.
func (h *nodeHealer) RestartContainers(ctx context.Context, req *healerv1alpha1.NodeRestartContainersRequest) (*healerv1alpha1.NodeRestartContainersResponse, error) {
	resp, err := h.restartContainers(ctx, req)
	err = toStatus(err)
	h.metrics.containerRestart(status.Code(err))
	return resp, err
}

func (h *nodeHealer) restartContainers(ctx context.Context, req *healerv1alpha1.NodeRestartContainersRequest) (*healerv1alpha1.NodeRestartContainersResponse, error) {
	if req.GetPvName() == "" {
		return nil, fmt.Errorf("%w: pv_name is required", ErrInvalidRequest)
	}
	if req.GetPodUid() == "" {
		return nil, fmt.Errorf("%w: pod_uid is required", ErrInvalidRequest)
	}
	if err := restart.CheckPodUID(req.GetPodUid()); err != nil {
		return nil, fmt.Errorf("%w: pod_uid: %w", ErrInvalidRequest, err)
	}
	if h.runtime == nil {
		return nil, fmt.Errorf("%w: the sidecar on node %q was given no access to the container runtime (--container-runtime-endpoint), so it cannot restart containers in place; replace the pod instead",
			ErrNoContainerRuntime, h.nodeName)
	}
	info, err := h.driver.current(ctx)
	if err != nil {
		return nil, err
	}
	vol, err := h.volumes.resolve(ctx, info.name, req.GetPvName())
	if err != nil {
		return nil, err
	}
	records := h.local.Records()
	target := restart.Target{
		PodUID:        req.GetPodUid(),
		PublishTarget: records.PublishTarget(req.GetPodUid(), vol.pvName),
		SubpathDir:    records.SubpathDir(req.GetPodUid()),
	}
	log := klog.FromContext(ctx).WithValues("volume", vol.volumeID, "podUID", target.PodUID)
	rctx, cancel := withAnswerMargin(klog.NewContext(ctx, log), h.restartTimeout)
	defer cancel()
	names, err := h.runtime.Restart(rctx, target)
	if err != nil {
		return nil, fmt.Errorf("restart the containers of pod %s that mount PersistentVolume %q on node %q: %w", target.PodUID, vol.pvName, h.nodeName, err)
	}
	log.Info("Restarted containers in place", "containers", names)
	return &healerv1alpha1.NodeRestartContainersResponse{Containers: names}, nil
}
