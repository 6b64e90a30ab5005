package driverkit

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/csi-addons/spec/lib/go/identity"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// Volume is what a driver recorded about one volume staged on its node.
type Volume struct {
	// ID is the CSI volume ID.
	ID string
	// StagingPath is where NodeStageVolume mounted it.
	StagingPath string
	// PublishTargets are the targets NodePublishVolume mounted it at and that were not unpublished.
	PublishTargets []PublishTarget
	// VolumeContext is the volume context it was staged with; ListStagedVolumes reports it.
	VolumeContext map[string]string
	// Expect is what its healthy staging mount looks like.
	Expect Expect
	// Kept says that the volume is kept alive across the restarts ServerOptions.VolumeKeeping
	// names: its mounter runs outside the node plugin (for example in driverkit's mount
	// supervisor, its own DaemonSet), so that a restart of the plugin killed no mounter of it.
	// ProbeVolume reports it as kept; it is ignored (reported false) while VolumeKeeping is
	// empty, as the protocol allows kept only from a driver that advertises keeping. It changes
	// nothing else: a kept volume whose mount is broken is reported, and healed, like any other.
	Kept bool
}

// Driver is what a CSI driver implements to be healed through the kit.
type Driver interface {
	// Volume returns the driver's record of a volume staged on this node; found is false when
	// the volume is not staged here (the kit answers FAILED_PRECONDITION).
	Volume(ctx context.Context, volumeID string) (v Volume, found bool, err error)
	// StagedVolumes lists the volumes staged on this node, for ListStagedVolumes.
	StagedVolumes(ctx context.Context) ([]Volume, error)
	// Inspect returns the driver's own findings about the volume, beyond the kit's mount checks
	// (for example ReasonDataLoss when its backing data is gone), and whether the kit may heal it
	// (a driver that cannot restart this volume's mounter, or a volume whose data is lost, says
	// false).
	Inspect(ctx context.Context, v Volume) (findings []Finding, healable bool)
	// Remount stops what is left of the volume's mounter (killing a frozen one) and starts a new
	// one that mounts the volume at v.StagingPath. The kit calls it during a heal, with the dead
	// mount already detached, while it holds the volume's lock.
	Remount(ctx context.Context, v Volume) error
}

// ServerOptions configure Register. Zero values take the defaults documented on each field.
type ServerOptions struct {
	// DriverName is reported by the CSI-Addons GetIdentity. Required.
	DriverName string
	// VendorVersion is reported by GetIdentity. Default: "unknown".
	VendorVersion string
	// NodeID is reported in the identity manifest under "nodeID". Default: none.
	NodeID string
	// Locks is shared with the driver's CSI Node service (see Locks.UnaryServerInterceptor).
	// Default: a new set, which protects the Healer calls from each other only.
	Locks *Locks
	// Checker checks and repairs mounts. Default: NewChecker(CheckerOptions{}).
	Checker *Checker
	// Capabilities lists the Healer RPCs to advertise and serve; the others answer UNIMPLEMENTED.
	// Default: PROBE, HEAL and LIST_VOLUMES.
	Capabilities []healerv1alpha1.HealerCapability_RPC_Type
	// Attributes are returned by GetHealerCapabilities. Default: none.
	Attributes map[string]string
	// VolumeKeeping lists the restarts that the driver's kept volumes (Volume.Kept) live
	// through, advertised as VolumeKeeping capabilities: PLUGIN_RESTART when their mounters run
	// outside the node plugin, MOUNTER_RESTART when a new mounter also takes over the live
	// connection of a dead one. Default: none (no volume is reported kept).
	VolumeKeeping []healerv1alpha1.HealerCapability_VolumeKeeping_Type
	// Logger receives one line per heal with what was done. Default: discard.
	Logger logr.Logger
}

// withDefaults validates the options and fills in their defaults. needName is set for the
// Identity service, which must report a name.
func (o ServerOptions) withDefaults(needName bool) (ServerOptions, error) {
	if needName && o.DriverName == "" {
		return o, fmt.Errorf("%w: DriverName is required: GetIdentity must report the driver's name", ErrInvalidOptions)
	}
	if o.VendorVersion == "" {
		o.VendorVersion = "unknown"
	}
	if o.Locks == nil {
		o.Locks = &Locks{}
	}
	if o.Checker == nil {
		o.Checker = NewChecker(CheckerOptions{})
	}
	if o.Capabilities == nil {
		o.Capabilities = []healerv1alpha1.HealerCapability_RPC_Type{
			healerv1alpha1.HealerCapability_RPC_PROBE,
			healerv1alpha1.HealerCapability_RPC_HEAL,
			healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES,
		}
	}
	seen := map[healerv1alpha1.HealerCapability_RPC_Type]bool{}
	for _, t := range o.Capabilities {
		switch {
		case t == healerv1alpha1.HealerCapability_RPC_UNKNOWN || healerv1alpha1.HealerCapability_RPC_Type_name[int32(t)] == "":
			return o, fmt.Errorf("%w: Capabilities lists RPC type %d, which the protocol does not define", ErrInvalidOptions, t)
		case seen[t]:
			return o, fmt.Errorf("%w: Capabilities lists %s twice", ErrInvalidOptions, t)
		}
		seen[t] = true
	}
	if !seen[healerv1alpha1.HealerCapability_RPC_PROBE] {
		return o, fmt.Errorf("%w: Capabilities must include PROBE: every driver serves ProbeVolume", ErrInvalidOptions)
	}
	keeps := map[healerv1alpha1.HealerCapability_VolumeKeeping_Type]bool{}
	for _, t := range o.VolumeKeeping {
		switch {
		case t == healerv1alpha1.HealerCapability_VolumeKeeping_UNKNOWN || healerv1alpha1.HealerCapability_VolumeKeeping_Type_name[int32(t)] == "":
			return o, fmt.Errorf("%w: VolumeKeeping lists type %d, which the protocol does not define", ErrInvalidOptions, t)
		case keeps[t]:
			return o, fmt.Errorf("%w: VolumeKeeping lists %s twice", ErrInvalidOptions, t)
		}
		keeps[t] = true
	}
	for k := range o.Attributes {
		if k == "" {
			return o, fmt.Errorf("%w: Attributes has an empty key", ErrInvalidOptions)
		}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	return o, nil
}

// Register registers the Healer service and the CSI-Addons Identity service on s (the driver's
// CSI-Addons gRPC server). The Identity service announces the Healer protocol in its manifest
// (healerv1alpha1.IdentityManifestKey) and the NODE_SERVICE capability.
//
// ProbeVolume takes the volume's lock (ABORTED when busy), answers FAILED_PRECONDITION for a
// volume that is not staged or whose staging path differs from the driver's record, checks the
// staging path and every publish target (the request's and the driver's record), adds
// Driver.Inspect's findings, reports healable from Inspect, and kept from Volume.Kept when
// ServerOptions.VolumeKeeping advertises keeping. HealVolume does the same checks,
// answers FAILED_PRECONDITION for a volume Inspect says is not healable, and otherwise runs
// Checker.Repair with Driver.Remount; its health is what is still wrong afterwards.
// ListStagedVolumes pages through Driver.StagedVolumes in volume ID order.
func Register(s grpc.ServiceRegistrar, d Driver, opts ServerOptions) error {
	ids, err := NewIdentityServer(opts)
	if err != nil {
		return err
	}
	hs, err := NewHealerServer(d, opts)
	if err != nil {
		return err
	}
	identity.RegisterIdentityServer(s, ids)
	healerv1alpha1.RegisterHealerServer(s, hs)
	return nil
}

// NewHealerServer returns the Healer service Register registers, for drivers that register their
// services themselves.
func NewHealerServer(d Driver, opts ServerOptions) (healerv1alpha1.HealerServer, error) {
	if d == nil {
		return nil, fmt.Errorf("%w: a Driver is required", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults(false)
	if err != nil {
		return nil, err
	}
	return &healerServer{d: d, opts: opts}, nil
}

// NewIdentityServer returns the CSI-Addons Identity service Register registers.
func NewIdentityServer(opts ServerOptions) (identity.IdentityServer, error) {
	opts, err := opts.withDefaults(true)
	if err != nil {
		return nil, err
	}
	return &identityServer{opts: opts}, nil
}

// identityServer is the CSI-Addons Identity service. The CSI-Addons capabilities have no entry
// for healing, so the manifest announces the Healer protocol.
type identityServer struct {
	identity.UnimplementedIdentityServer
	opts ServerOptions
}

func (s *identityServer) GetIdentity(context.Context, *identity.GetIdentityRequest) (*identity.GetIdentityResponse, error) {
	manifest := map[string]string{healerv1alpha1.IdentityManifestKey: healerv1alpha1.Version}
	if s.opts.NodeID != "" {
		manifest["nodeID"] = s.opts.NodeID
	}
	return &identity.GetIdentityResponse{Name: s.opts.DriverName, VendorVersion: s.opts.VendorVersion, Manifest: manifest}, nil
}

func (s *identityServer) GetCapabilities(context.Context, *identity.GetCapabilitiesRequest) (*identity.GetCapabilitiesResponse, error) {
	return &identity.GetCapabilitiesResponse{
		Capabilities: []*identity.Capability{{
			Type: &identity.Capability_Service_{
				Service: &identity.Capability_Service{Type: identity.Capability_Service_NODE_SERVICE},
			},
		}},
	}, nil
}

// Probe reports ready: the kit has no state to load, and the driver registers it once it can
// answer.
func (s *identityServer) Probe(context.Context, *identity.ProbeRequest) (*identity.ProbeResponse, error) {
	return &identity.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// healerServer is the Healer service. ProbeVolume and HealVolume make their checks in this
// order, each with its code (docs/protocol.md):
//
//  1. the RPC is advertised                                   else UNIMPLEMENTED
//  2. volume_id is set                                         else INVALID_ARGUMENT
//  3. the driver knows the volume                              else NOT_FOUND
//  4. no other call holds the volume's lock                    else ABORTED
//  5. the volume is staged here (at the path given)            else FAILED_PRECONDITION
//  6. HealVolume only: Driver.Inspect says it can be healed    else FAILED_PRECONDITION
//
// The record the call acts on is read again once the lock is taken, so that it cannot change
// under the call (a NodeUnstageVolume holds the same lock).
type healerServer struct {
	healerv1alpha1.UnimplementedHealerServer
	d    Driver
	opts ServerOptions
}

var _ healerv1alpha1.HealerServer = (*healerServer)(nil)

func (s *healerServer) GetHealerCapabilities(context.Context, *healerv1alpha1.GetHealerCapabilitiesRequest) (*healerv1alpha1.GetHealerCapabilitiesResponse, error) {
	resp := &healerv1alpha1.GetHealerCapabilitiesResponse{Attributes: maps.Clone(s.opts.Attributes)}
	for _, t := range s.opts.Capabilities {
		resp.Capabilities = append(resp.Capabilities, healerv1alpha1.NewRPCCapability(t))
	}
	for _, t := range s.opts.VolumeKeeping {
		resp.Capabilities = append(resp.Capabilities, healerv1alpha1.NewVolumeKeepingCapability(t))
	}
	return resp, nil
}

func (s *healerServer) ProbeVolume(ctx context.Context, req *healerv1alpha1.ProbeVolumeRequest) (*healerv1alpha1.ProbeVolumeResponse, error) {
	v, release, err := s.begin(ctx, healerv1alpha1.HealerCapability_RPC_PROBE, req.GetVolumeId(), req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	defer release()

	targets := s.publishTargets(v, req.GetPublishTargetPaths())
	findings := s.checkMounts(ctx, v, targets)
	if f, ok := s.opts.Checker.StaleInPods(v.ID, v.StagingPath, v.Expect); ok {
		findings = append(findings, f)
	}
	own, healable := s.d.Inspect(ctx, v)
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	findings = append(findings, own...)
	if len(findings) > 0 && onlyReasons(findings, ReasonStaleMountInPods) {
		// The node's mounts work: no heal can reach pods that kept the dead mount.
		healable = false
	}
	return &healerv1alpha1.ProbeVolumeResponse{
		HealthStatuses: Health(findings),
		Healable:       healable,
		Kept:           v.Kept && len(s.opts.VolumeKeeping) > 0,
	}, nil
}

func (s *healerServer) HealVolume(ctx context.Context, req *healerv1alpha1.HealVolumeRequest) (*healerv1alpha1.HealVolumeResponse, error) {
	start := time.Now()
	v, release, err := s.begin(ctx, healerv1alpha1.HealerCapability_RPC_HEAL, req.GetVolumeId(), req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	defer release()

	own, healable := s.d.Inspect(ctx, v)
	var steps Steps
	steps.add("look up", start)
	if !healable {
		msg := fmt.Sprintf("volume %q cannot be healed by this driver", v.ID)
		if len(own) > 0 {
			msg += ": " + messages(own)
		}
		return nil, status.Error(codes.FailedPrecondition, msg)
	}
	log := s.opts.Logger.WithValues("volume", v.ID)
	res, err := s.opts.Checker.Repair(ctx, Repair{
		VolumeID:       v.ID,
		StagingPath:    v.StagingPath,
		Expect:         v.Expect,
		PublishTargets: s.publishTargets(v, req.GetPublishTargetPaths()),
		Remount:        func(ctx context.Context) error { return s.d.Remount(ctx, v) },
	})
	steps = append(steps, res.Steps...)
	if err != nil {
		log.Error(err, "Heal failed", "actions", res.Actions, "health", messages(res.Findings))
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Errorf(codes.Internal, "heal of volume %q failed: %v (done before: %s; still wrong: %s)",
			v.ID, err, orNothing(strings.Join(res.Actions, "; ")), orNothing(messages(res.Findings)))
	}
	// The driver's own findings are measured again: the heal may have changed them.
	at := time.Now()
	own, _ = s.d.Inspect(ctx, v)
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	findings := res.Findings
	if !hasReason(findings, ReasonStaleMountInPods) {
		// Pods may still hold a mount that an earlier heal replaced.
		if f, ok := s.opts.Checker.StaleInPods(v.ID, v.StagingPath, v.Expect); ok {
			findings = append(findings, f)
		}
	}
	findings = append(findings, own...)
	steps.add("check after", at)
	took := time.Since(start)
	if len(res.Actions) == 0 {
		log.V(2).Info("Heal found nothing to repair", "health", messages(findings), "took", took, "steps", steps.String())
	} else {
		log.Info("Healed volume", "actions", res.Actions, "health", messages(findings), "took", took, "steps", steps.String())
	}
	return &healerv1alpha1.HealVolumeResponse{HealthStatuses: Health(findings)}, nil
}

func (s *healerServer) ListStagedVolumes(ctx context.Context, req *healerv1alpha1.ListStagedVolumesRequest) (*healerv1alpha1.ListStagedVolumesResponse, error) {
	if !s.serves(healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES) {
		return nil, status.Error(codes.Unimplemented, "this driver does not advertise LIST_VOLUMES")
	}
	if req.GetMaxEntries() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "max_entries must not be negative, got %d", req.GetMaxEntries())
	}
	from := ""
	if tok := req.GetStartingToken(); tok != "" {
		var ok bool
		if from, ok = decodePageToken(tok); !ok {
			return nil, status.Errorf(codes.Aborted, "starting_token %q was not issued by this driver; start the listing again", tok)
		}
	}
	volumes, err := s.d.StagedVolumes(ctx)
	if err != nil {
		return nil, driverError(ctx, err, "list the staged volumes")
	}
	slices.SortFunc(volumes, func(a, b Volume) int { return strings.Compare(a.ID, b.ID) })
	i, _ := slices.BinarySearchFunc(volumes, from, func(v Volume, id string) int { return strings.Compare(v.ID, id) })
	volumes = volumes[i:]

	resp := &healerv1alpha1.ListStagedVolumesResponse{}
	if limit := int(req.GetMaxEntries()); limit > 0 && len(volumes) > limit {
		resp.NextToken = encodePageToken(volumes[limit].ID)
		volumes = volumes[:limit]
	}
	for _, v := range volumes {
		var paths []string
		for _, t := range v.PublishTargets {
			paths = append(paths, t.Path)
		}
		resp.Entries = append(resp.Entries, &healerv1alpha1.ListStagedVolumesResponse_Entry{
			VolumeId:           v.ID,
			StagingTargetPath:  v.StagingPath,
			PublishTargetPaths: paths,
			VolumeContext:      maps.Clone(v.VolumeContext),
		})
	}
	return resp, nil
}

func (s *healerServer) serves(t healerv1alpha1.HealerCapability_RPC_Type) bool {
	return slices.Contains(s.opts.Capabilities, t)
}

// begin makes checks 1 to 5 for a volume RPC and returns the driver's record of the volume
// with its lock held; release unlocks it.
func (s *healerServer) begin(ctx context.Context, rpc healerv1alpha1.HealerCapability_RPC_Type, volumeID, stagingPath string) (v Volume, release func(), err error) {
	if !s.serves(rpc) {
		return Volume{}, nil, status.Errorf(codes.Unimplemented, "this driver does not advertise %s", rpc)
	}
	if volumeID == "" {
		return Volume{}, nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	// The protocol checks that the volume is known before its lock: an unknown volume answers
	// NOT_FOUND even while another call holds the lock of its ID.
	if _, _, err := s.d.Volume(ctx, volumeID); err != nil {
		return Volume{}, nil, driverError(ctx, err, fmt.Sprintf("look up volume %q", volumeID))
	}
	unlock, err := s.opts.Locks.Lock(volumeID)
	if err != nil {
		return Volume{}, nil, err
	}
	// Looked up again under the lock: a CSI call that held it may have changed the record.
	v, found, err := s.d.Volume(ctx, volumeID)
	switch {
	case err != nil:
		unlock()
		return Volume{}, nil, driverError(ctx, err, fmt.Sprintf("look up volume %q", volumeID))
	case !found:
		unlock()
		return Volume{}, nil, status.Errorf(codes.FailedPrecondition, "volume %q is not staged on this node", volumeID)
	case v.StagingPath == "":
		unlock()
		return Volume{}, nil, status.Errorf(codes.Internal, "the driver's record of volume %q has no staging path", volumeID)
	case stagingPath != "" && filepath.Clean(stagingPath) != filepath.Clean(v.StagingPath):
		unlock()
		return Volume{}, nil, status.Errorf(codes.FailedPrecondition,
			"volume %q is staged at %s, not at %s", volumeID, v.StagingPath, stagingPath)
	}
	if v.ID == "" {
		v.ID = volumeID
	}
	return v, unlock, nil
}

// publishTargets are the record's publish targets and then the request's that the record does
// not have. The read-only flag of a target the driver has no record of is the one its current
// mount shows, so that a heal never makes a read-only target writable.
func (s *healerServer) publishTargets(v Volume, requested []string) []PublishTarget {
	var targets []PublishTarget
	seen := map[string]bool{}
	for _, t := range v.PublishTargets {
		t.Path = filepath.Clean(t.Path)
		if !seen[t.Path] {
			seen[t.Path] = true
			targets = append(targets, t)
		}
	}
	var infos []*mountInfo
	for _, p := range requested {
		if p == "" {
			continue
		}
		p = filepath.Clean(p)
		if seen[p] {
			continue
		}
		seen[p] = true
		if infos == nil {
			infos, _ = readMountTable(s.opts.Checker.options().MountInfo)
		}
		top := topMount(infos, p)
		targets = append(targets, PublishTarget{Path: p, ReadOnly: top != nil && readOnly(top)})
	}
	return targets
}

// checkMounts checks the staging mount and every publish target.
func (s *healerServer) checkMounts(ctx context.Context, v Volume, targets []PublishTarget) []Finding {
	findings := s.opts.Checker.Check(ctx, v.StagingPath, v.Expect)
	for _, t := range targets {
		want := v.Expect
		want.ReadOnly = t.ReadOnly
		findings = append(findings, s.opts.Checker.Check(ctx, t.Path, want)...)
	}
	return findings
}

// driverError turns an error of a Driver method into a gRPC status: one that carries a status
// keeps it, ErrVolumeNotFound is NOT_FOUND, the end of the call's context its code, and
// anything else INTERNAL.
func driverError(ctx context.Context, err error, what string) error {
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	switch {
	case errors.Is(err, ErrVolumeNotFound):
		return status.Errorf(codes.NotFound, "%s: %v", what, err)
	case ctx.Err() != nil:
		return status.Errorf(status.FromContextError(ctx.Err()).Code(), "%s: %v", what, err)
	default:
		return status.Errorf(codes.Internal, "%s: %v", what, err)
	}
}

func orNothing(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// pageTokenPrefix versions the ListStagedVolumes token, so that a token from elsewhere is
// recognised as unusable. The token names the first volume of the next page: volumes staged or
// unstaged between two pages then neither repeat nor shift the others.
const pageTokenPrefix = "driverkit/v1/"

func encodePageToken(nextID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + nextID))
}

func decodePageToken(tok string) (nextID string, ok bool) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", false
	}
	return strings.CutPrefix(string(b), pageTokenPrefix)
}
