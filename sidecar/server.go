package sidecar

import (
	"context"
	"errors"
	"fmt"
	"path"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
	"github.com/volume-healer/volume-healer/sidecar/restart"
)

// nodeHealer serves NodeHealer: it resolves each PV from the caches and relays the call to the
// driver.
type nodeHealer struct {
	healerv1alpha1.UnimplementedNodeHealerServer
	nodeName string
	driver   *driverClient
	volumes  *volumes
	// local probes and lists volumes from kubelet's records for a driver that does not.
	local *nodeprobe.Prober
	// runtime restarts containers in place (RestartContainers); nil when the sidecar was given
	// no container runtime socket.
	runtime *restart.Runtime
	// restartTimeout bounds a RestartContainers call whose caller sent no deadline.
	restartTimeout time.Duration
	// metrics counts the restarts and the panics of the read ahead.
	metrics *Metrics
	// attachments is the node's status.volumesAttached; nil checks attachments with GETs of
	// VolumeAttachments alone.
	attachments *nodeAttachments
	// started is when the sidecar was made; firstProbe logs the first probe asked of it, which
	// after a node plugin restart tells how long the restart took to reach its volumes.
	started    time.Time
	clock      clock.PassiveClock
	firstProbe sync.Once
	// podVolumes is the recent read of kubelet's pods' folders that probes take their publish
	// target paths from (publishTargetsMaxAge); nil reads them at each call.
	podVolumes *nodeprobe.PodVolumes
}

var _ healerv1alpha1.NodeHealerServer = (*nodeHealer)(nil)

// GetHealerCapabilities answers from the cache of the driver's identity and capabilities, with
// what the sidecar serves itself for a driver that does not (capabilitiesFor).
func (h *nodeHealer) GetHealerCapabilities(ctx context.Context, _ *healerv1alpha1.NodeGetHealerCapabilitiesRequest) (*healerv1alpha1.NodeGetHealerCapabilitiesResponse, error) {
	info, err := h.driver.current(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return h.capabilitiesFor(info), nil
}

// ProbeVolume probes the volume of a PV: the driver does, or the sidecar itself when the driver
// does not advertise PROBE. The driver's kept is relayed only from a driver that advertises
// volume keeping, as the protocol allows it from no other; the sidecar's own probe keeps nothing.
func (h *nodeHealer) ProbeVolume(ctx context.Context, req *healerv1alpha1.NodeProbeVolumeRequest) (*healerv1alpha1.NodeProbeVolumeResponse, error) {
	h.firstProbe.Do(func() {
		if h.clock != nil {
			klog.FromContext(ctx).Info("First probe since the sidecar started", "pv", req.GetPvName(), "sinceStart", h.clock.Since(h.started).Round(time.Millisecond))
		}
	})
	info, err := h.driver.current(ctx)
	if err == nil && !info.serves(healerv1alpha1.HealerCapability_RPC_PROBE) {
		return h.probeLocally(ctx, info, req)
	}
	vol, ctx, err := h.prepare(ctx, req.GetPvName(), req.GetVolume(), healerv1alpha1.HealerCapability_RPC_PROBE)
	if err != nil {
		return nil, toStatus(err)
	}
	cctx, cancel := h.driver.callContext(ctx)
	defer cancel()
	resp, err := h.driver.healer.ProbeVolume(cctx, &healerv1alpha1.ProbeVolumeRequest{
		VolumeId:           vol.volumeID,
		StagingTargetPath:  vol.stagingPath,
		PublishTargetPaths: vol.publishTargets,
		VolumeContext:      vol.context,
		VolumeCapability:   vol.capability,
		Secrets:            vol.secrets,
	})
	if err != nil {
		return nil, h.driver.relay(err)
	}
	if err := checkProbe(resp); err != nil {
		return nil, toStatus(err)
	}
	kept := resp.GetKept()
	if kept && (info == nil || !info.keeps()) {
		klog.FromContext(ctx).V(2).Info("The driver says the volume is kept but advertises no volume keeping; relayed as not kept", "volume", vol.volumeID)
		kept = false
	}
	klog.FromContext(ctx).V(4).Info("Probed", "health", len(resp.GetHealthStatuses()), "healable", resp.GetHealable(), "kept", kept)
	return &healerv1alpha1.NodeProbeVolumeResponse{
		HealthStatuses: resp.GetHealthStatuses(),
		Healable:       resp.GetHealable(),
		RecheckAfter:   resp.GetRecheckAfter(),
		VolumeId:       vol.volumeID,
		ProbeSource:    healerv1alpha1.ProbeSource_PROBE_SOURCE_DRIVER,
		Kept:           kept,
	}, nil
}

// HealVolume heals the volume of a PV.
func (h *nodeHealer) HealVolume(ctx context.Context, req *healerv1alpha1.NodeHealVolumeRequest) (*healerv1alpha1.NodeHealVolumeResponse, error) {
	began := time.Now()
	vol, ctx, err := h.prepare(ctx, req.GetPvName(), req.GetVolume(), healerv1alpha1.HealerCapability_RPC_HEAL)
	if err != nil {
		return nil, toStatus(err)
	}
	cctx, cancel := h.driver.callContext(ctx)
	defer cancel()
	called := time.Now()
	resp, err := h.driver.healer.HealVolume(cctx, &healerv1alpha1.HealVolumeRequest{
		VolumeId:           vol.volumeID,
		StagingTargetPath:  vol.stagingPath,
		PublishTargetPaths: vol.publishTargets,
		VolumeContext:      vol.context,
		VolumeCapability:   vol.capability,
		Secrets:            vol.secrets,
	})
	if err != nil {
		return nil, h.driver.relay(err)
	}
	if err := checkHeal(resp); err != nil {
		return nil, toStatus(err)
	}
	// took is the whole call in the sidecar, driverTook the driver's part of it.
	klog.FromContext(ctx).Info("Heal done", "remainingHealth", len(resp.GetHealthStatuses()),
		"took", time.Since(began).Round(time.Microsecond), "driverTook", time.Since(called).Round(time.Microsecond))
	return &healerv1alpha1.NodeHealVolumeResponse{
		HealthStatuses: resp.GetHealthStatuses(),
		RecheckAfter:   resp.GetRecheckAfter(),
		VolumeId:       vol.volumeID,
	}, nil
}

// ListStagedVolumes relays one page of the driver's list, with the PV of each volume, or lists
// the volumes from kubelet's records when the driver does not advertise LIST_VOLUMES.
func (h *nodeHealer) ListStagedVolumes(ctx context.Context, req *healerv1alpha1.NodeListStagedVolumesRequest) (*healerv1alpha1.NodeListStagedVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "max_entries must not be negative, got %d", req.GetMaxEntries())
	}
	info, err := h.driver.current(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	if !info.serves(healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES) {
		return h.listLocally(ctx, info, req)
	}
	cctx, cancel := h.driver.callContext(ctx)
	defer cancel()
	resp, err := h.driver.healer.ListStagedVolumes(cctx, &healerv1alpha1.ListStagedVolumesRequest{
		MaxEntries:    req.GetMaxEntries(),
		StartingToken: req.GetStartingToken(),
	})
	if err != nil {
		return nil, h.driver.relay(err)
	}
	if err := checkList(resp); err != nil {
		return nil, toStatus(err)
	}
	out := &healerv1alpha1.NodeListStagedVolumesResponse{NextToken: resp.GetNextToken()}
	for _, e := range resp.GetEntries() {
		out.Entries = append(out.Entries, &healerv1alpha1.NodeListStagedVolumesResponse_Entry{
			PvName:            h.volumes.pvNameFor(info.name, e.GetVolumeId()),
			VolumeId:          e.GetVolumeId(),
			StagingTargetPath: e.GetStagingTargetPath(),
		})
	}
	return out, nil
}

// prepare makes the checks every volume RPC shares, in the order of the protocol's error
// tables, and resolves the PV: from the caller's facts when it sent them, else with a read of the
// PV. The returned context logs with the volume ID too.
func (h *nodeHealer) prepare(ctx context.Context, pvName string, facts *healerv1alpha1.VolumeFacts, rpc healerv1alpha1.HealerCapability_RPC_Type) (*volume, context.Context, error) {
	if pvName == "" {
		return nil, ctx, fmt.Errorf("%w: pv_name is required", ErrInvalidRequest)
	}
	info, err := h.driver.current(ctx)
	if err != nil {
		return nil, ctx, err
	}
	log := klog.FromContext(ctx)
	if !info.serves(rpc) {
		return nil, ctx, notAdvertised(info, rpc)
	}
	vol, err := h.volumeFor(ctx, info, pvName, facts)
	if err != nil {
		return nil, ctx, err
	}
	if err := h.onNode(ctx, info, vol, rpc); err != nil {
		return nil, ctx, err
	}
	// The driver may check the pods' mounts too: kubelet's records on this node say where they
	// are.
	vol.publishTargets = h.publishTargets(ctx, info.name, vol, rpc)
	// A probe looks at the node's mount and needs no credentials: only a heal, which may stage
	// the volume again, reads the node-stage Secret, so that a sweep's probes read nothing per
	// volume.
	if rpc == healerv1alpha1.HealerCapability_RPC_HEAL {
		if err := h.volumes.stageSecrets(ctx, vol); err != nil {
			return nil, ctx, err
		}
	}
	return vol, klog.NewContext(ctx, log.WithValues("volume", vol.volumeID)), nil
}

// volumeFor builds the volume of PV pvName from the caller's facts, or, when the caller sent
// none (an older controller), from the PV read from the API server.
func (h *nodeHealer) volumeFor(ctx context.Context, info *driverInfo, pvName string, facts *healerv1alpha1.VolumeFacts) (*volume, error) {
	if facts != nil {
		return h.volumes.fromFacts(info.name, pvName, facts)
	}
	return h.volumes.resolve(ctx, info.name, pvName)
}

// onNode checks that vol is on the sidecar's node before any call reaches the driver and before
// its node-stage Secret is read, from the node's own truth, whatever the caller said of the
// volume: the node's status.volumesAttached lists it (the attach/detach controller's record,
// watched as one object), or kubelet's records on the node show it staged or published here, or
// the driver lists it as staged here. Only while the Node has not been read (the watch failed or
// has not listed yet) is the attachment read instead as an older sidecar did, from the
// VolumeAttachment of the PV on this node (a probe may go by one read in the last
// probeAttachmentFresh). None of these: ErrNotOnNode, whoever asked.
func (h *nodeHealer) onNode(ctx context.Context, info *driverInfo, vol *volume, rpc healerv1alpha1.HealerCapability_RPC_Type) error {
	known := false
	if h.attachments != nil {
		var attached bool
		if attached, known = h.attachments.attached(ctx, info.name, vol.volumeID); attached {
			return nil
		}
	}
	if h.recordedHere(info.name, vol) {
		return nil
	}
	if !known {
		reuse := time.Duration(0)
		if rpc == healerv1alpha1.HealerCapability_RPC_PROBE {
			reuse = probeAttachmentFresh
		}
		attached, err := h.volumes.attachedHere(ctx, info.name, vol.pvName, vol.volumeID, reuse)
		if err != nil {
			return err
		}
		if attached {
			return nil
		}
	}
	if !info.serves(healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES) {
		return fmt.Errorf("%w: PersistentVolume %q (volume %q of driver %q) is not attached on node %q, kubelet records no mount of it there, and the driver does not list its staged volumes (LIST_VOLUMES) to show it is staged here; this sidecar acts only on its node's volumes",
			ErrNotOnNode, vol.pvName, vol.volumeID, info.name, h.nodeName)
	}
	token := ""
	for page := 0; page < 10000; page++ {
		cctx, cancel := h.driver.callContext(ctx)
		resp, err := h.driver.healer.ListStagedVolumes(cctx, &healerv1alpha1.ListStagedVolumesRequest{StartingToken: token})
		cancel()
		if err != nil {
			return h.driver.relay(err)
		}
		if err := checkList(resp); err != nil {
			return err
		}
		for _, e := range resp.GetEntries() {
			if e.GetVolumeId() == vol.volumeID {
				return nil
			}
		}
		if resp.GetNextToken() == "" || resp.GetNextToken() == token {
			break
		}
		token = resp.GetNextToken()
	}
	return fmt.Errorf("%w: PersistentVolume %q (volume %q of driver %q) is not attached on node %q and the driver does not list it as staged here; this sidecar acts only on its node's volumes",
		ErrNotOnNode, vol.pvName, vol.volumeID, info.name, h.nodeName)
}

func notAdvertised(info *driverInfo, rpc healerv1alpha1.HealerCapability_RPC_Type) error {
	if info.healerUnimplemented {
		return fmt.Errorf("%w: the driver %q does not serve the Healer service", ErrNotAdvertised, info.name)
	}
	return fmt.Errorf("%w: the driver %q does not advertise %s", ErrNotAdvertised, info.name, rpc)
}

// toStatus is where the sidecar's own errors get their gRPC codes (docs/protocol.md, NodeHealer
// error tables). The sidecar's sentinel errors decide first, so that "not ready because the
// driver said X" is UNAVAILABLE whatever X was; other errors that carry a status keep it.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	code, ok := codes.Internal, true
	switch {
	case errors.Is(err, ErrInvalidRequest), errors.Is(err, ErrNotCSIVolume), errors.Is(err, ErrOtherDriver), errors.Is(err, restart.ErrInvalidTarget):
		code = codes.InvalidArgument
	case errors.Is(err, ErrPVNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrNotOnNode):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrNotAdvertised), errors.Is(err, ErrNoContainerRuntime):
		code = codes.Unimplemented
	case errors.Is(err, restart.ErrNoContainer):
		code = codes.FailedPrecondition
	case errors.Is(err, restart.ErrBusy):
		code = codes.Aborted
	case errors.Is(err, restart.ErrUnreachable):
		code = codes.Unavailable
	case errors.Is(err, restart.ErrTimeout):
		code = codes.DeadlineExceeded
	case errors.Is(err, restart.ErrRuntime):
		code = codes.Internal
	case errors.Is(err, ErrNotReady), errors.Is(err, ErrSecretsUnavailable), errors.Is(err, ErrSecretNotFound):
		// A missing node-stage Secret is not "nothing to do here" (FAILED_PRECONDITION, which
		// the controller takes as a volume not on the node): the volume is there and cannot be
		// looked at until the Secret exists, so the controller retries and keeps its restart
		// pending.
		code = codes.Unavailable
	case errors.Is(err, ErrMalformedResponse):
		code = codes.Internal
	default:
		ok = false
	}
	if ok {
		return status.Error(code, err.Error())
	}
	if st, isStatus := status.FromError(err); isStatus {
		return st.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// authenticatedFirst returns a copy of desc whose every method admits its caller before anything
// else: before the request is read from the wire and decoded, before the interceptors (metrics,
// logs, panic recovery) and the handler run. A caller without a valid token thus costs the
// sidecar the check of its token and nothing more, whatever it sends. A refused call is counted
// and logged here, as the interceptors would.
func (s *Sidecar) authenticatedFirst(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	out := *desc
	out.Methods = slices.Clone(desc.Methods)
	for i := range out.Methods {
		rpc, handler := out.Methods[i].MethodName, out.Methods[i].Handler
		out.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, next grpc.UnaryServerInterceptor) (any, error) {
			start := s.opts.Clock.Now()
			admitted, err := s.admit(ctx, rpc)
			if err != nil {
				took := s.opts.Clock.Since(start)
				s.metrics.call(rpc, status.Code(err), took)
				s.log.V(2).Info("Call refused", "rpc", rpc, "code", status.Code(err), "error", err.Error(), "took", took)
				return nil, err
			}
			return handler(srv, admitted, dec, next)
		}
	}
	return &out
}

// admit authenticates the caller of rpc and returns the call's context with the caller's name. A
// panic while doing so refuses this call alone, as recoverPanics does for the rest.
func (s *Sidecar) admit(ctx context.Context, rpc string) (_ context.Context, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.metrics.panicked(rpc)
			s.log.Error(nil, "Authentication panicked", "rpc", rpc, "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "the sidecar failed while authenticating %s: %v", rpc, r)
		}
	}()
	user, err := s.auth.authenticate(ctx)
	if err != nil {
		return ctx, err
	}
	return context.WithValue(ctx, callerKey{}, user), nil
}

// recoverPanics turns a panic while handling a call into an Internal error for that call alone: one malformed object or message must not take down the sidecar, and
// with it every volume of the node.
func (s *Sidecar) recoverPanics(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			rpc := path.Base(info.FullMethod)
			s.metrics.panicked(rpc)
			klog.FromContext(ctx).Error(nil, "Call panicked", "panic", r, "stack", string(debug.Stack()))
			resp, err = nil, status.Errorf(codes.Internal, "the sidecar failed while handling %s: %v", rpc, r)
		}
	}()
	return handler(ctx, req)
}

// observe counts and times every call, logs failures, and gives the handler a logger with the
// RPC, the driver and the PV.
func (s *Sidecar) observe(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	rpc := path.Base(info.FullMethod)
	// The server's contexts do not derive from Start's, so the logger comes from the sidecar.
	log := s.log.WithValues("rpc", rpc, "caller", callerOf(ctx))
	if d := s.driver.cached(); d != nil {
		log = log.WithValues("driver", d.name)
	}
	if r, ok := req.(interface{ GetPvName() string }); ok {
		log = log.WithValues("pv", r.GetPvName())
	}
	start := s.opts.Clock.Now()
	resp, err := handler(klog.NewContext(ctx, log), req)
	took := s.opts.Clock.Since(start)
	code := status.Code(err)
	s.metrics.call(rpc, code, took)
	switch code {
	case codes.OK:
		log.V(5).Info("Call answered", "took", took)
	case codes.Internal, codes.Unknown, codes.DataLoss:
		log.Error(err, "Call failed", "code", code, "took", took)
	default:
		log.V(2).Info("Call refused", "code", code, "error", err.Error(), "took", took)
	}
	return resp, err
}

// limits are the connection limits of the NodeHealer server.
type limits struct {
	// enforcement is the policy the controller's pings must fit (the protocol's).
	enforcement keepalive.EnforcementPolicy
	// params make the server ping an idle controller, so that the connection of a controller
	// that vanished (its node lost, its pod killed without a FIN) is closed within a minute and
	// a half instead of the two hours of TCP's own keepalive.
	params keepalive.ServerParameters
	// maxStreams caps the calls one connection may have in flight.
	maxStreams uint32
}

// serverLimits returns the NodeHealer server's connection limits.
func serverLimits() limits {
	return limits{
		enforcement: keepalive.EnforcementPolicy{
			MinTime:             healerv1alpha1.KeepaliveMinTime,
			PermitWithoutStream: healerv1alpha1.KeepalivePermitWithoutStream,
		},
		params: keepalive.ServerParameters{
			Time:    time.Minute,
			Timeout: healerv1alpha1.KeepaliveTimeout,
		},
		maxStreams: healerv1alpha1.MaxConcurrentStreams,
	}
}

// options are the limits as server options.
func (l limits) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(l.enforcement),
		grpc.KeepaliveParams(l.params),
		grpc.MaxConcurrentStreams(l.maxStreams),
	}
}
