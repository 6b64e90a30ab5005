// Package plugin is the reference driver's real mode: a CSI node plugin (with the controller
// calls that create volumes and publish them to nodes, which may run in a second process on the
// same state folder) whose volumes are folders under its state folder, mounted
// at the staging path by a userspace FUSE mounter (package mounter, run as `refdriver mounter`)
// and bind-mounted at each publish target. Its mounters die with the plugin's process group, as
// ceph-fuse dies with its node plugin container, and leave dead mounts behind: the failure
// volume-healer exists for. It is healed through package driverkit, which serves the Healer
// service on the CSI-Addons socket. With Options.SupervisorSocket its volumes are mounted by the
// node's mount supervisor instead (package driverkit/supervisor, supervised.go), whose mounters
// live through the plugin's restarts and whose connections live through the mounters'.
//
// With Options.Stock it plays a driver that knows nothing of volume-healer instead (stock.go):
// no Healer service, and a Node service that mounts a broken volume again by itself, as
// ceph-csi's does. With Options.Mounter RcloneMounter its volumes' FUSE daemon is `rclone mount`,
// a mounter nobody here wrote, in place of its own.
//
// Faults can be applied on purpose through the HTTP control interface (ControlHandler, package
// control), the paths and bodies the simulated mode serves too, so that `healerctl sanity
// --control` and tests drive both modes alike; here each fault is real: a killed, frozen or
// read-only mounter, a removed backing folder.
//
// It must not import the controller's or the sidecar's packages, nor test/.
package plugin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/driverkit/fuseconn"
	"github.com/volume-healer/volume-healer/driverkit/supervisor"
	"github.com/volume-healer/volume-healer/refdriver/control"
)

// Plugin is one node's reference driver with real mounts.
type Plugin struct {
	opts     Options
	store    store
	locks    *driverkit.Locks
	checker  *driverkit.Checker
	counters *control.Recorder

	// createMu serialises CreateVolume and DeleteVolume, which the volume locks do not cover.
	createMu sync.Mutex

	mu sync.Mutex
	// records are the volumes staged on this node. A record changes only under its volume's
	// lock; mu guards the map.
	records map[string]*record
	// children are the mounters this run started, by PID.
	children map[int]*child
	// resumes are the pending SIGCONTs of volumes made hung for a while, by volume ID.
	resumes map[string]*time.Timer
	// sup is the node's mount supervisor, nil when the plugin runs its mounters itself.
	sup supervisorClient
}

// New loads the state folder. Volumes staged by an earlier run keep their records; their
// mounters are not adopted: when that run's process group was killed, they are dead and their
// mounts answer ENOTCONN until a heal starts new ones. The mounters of supervised volumes
// (Options.SupervisorSocket) were not in that group: they still serve, and nothing at start-up
// touches them.
func New(opts Options) (*Plugin, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	p := &Plugin{
		opts:     opts,
		store:    store{dir: opts.StateDir},
		locks:    &driverkit.Locks{},
		checker:  driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: opts.StatTimeout}),
		counters: control.NewRecorder(),
		children: map[int]*child{},
		resumes:  map[string]*time.Timer{},
	}
	if opts.SupervisorSocket != "" {
		p.sup = supervisor.NewClient(opts.SupervisorSocket, opts.SupervisorTimeout)
	}
	if err := p.store.init(); err != nil {
		return nil, err
	}
	// ControllerPublishVolume, served here or by another plugin on the same state folder,
	// publishes volumes to the nodes recorded so.
	if err := p.store.saveNode(opts.NodeID); err != nil {
		return nil, err
	}
	records, err := p.store.records()
	if err != nil {
		return nil, err
	}
	p.records = records
	for _, r := range records {
		p.opts.Logger.Info("Volume staged by an earlier run", "volume", r.VolumeID, "stagingPath", r.StagingPath,
			"publishTargets", len(r.PublishTargets), "mounter", r.mounter(), "mounterPID", r.MounterPID, "supervised", r.Supervised)
	}
	if opts.UnmountDeadTargetsOnStart {
		p.unmountDeadTargets(context.Background())
	}
	return p, nil
}

// Register adds the CSI Identity, Controller and Node services to s, the server on the CSI
// socket. That server must run the plugin's Locks().UnaryServerInterceptor(), so that the Node
// calls and the heals of a volume never overlap; NewServer sets that up.
func (p *Plugin) Register(s grpc.ServiceRegistrar) {
	csi.RegisterIdentityServer(s, &identityServer{p: p})
	csi.RegisterControllerServer(s, &controllerServer{p: p})
	csi.RegisterNodeServer(s, &nodeServer{p: p})
}

// RegisterAddons adds the CSI-Addons Identity and Healer services (driverkit) to s, the server
// on the CSI-Addons socket; both share the plugin's volume locks with the Node service. A Stock
// plugin adds the CSI-Addons Identity only.
func (p *Plugin) RegisterAddons(s grpc.ServiceRegistrar) error {
	if p.opts.Stock {
		p.registerStockAddons(s)
		return nil
	}
	return driverkit.Register(s, p, driverkit.ServerOptions{
		DriverName:    p.opts.DriverName,
		VendorVersion: p.opts.VendorVersion,
		NodeID:        p.opts.NodeID,
		Locks:         p.locks,
		Checker:       p.checker,
		Capabilities:  p.opts.Capabilities,
		VolumeKeeping: p.volumeKeeping(),
		// The mounter every volume has (volume context "mounter"), for policies.
		Attributes: map[string]string{"healMounters": mounterName},
		Logger:     p.opts.Logger,
	})
}

// volumeKeeping is what the plugin's supervised volumes live through: a restart of this plugin,
// whose process group does not hold their mounters, and, on a kernel that resends a dead
// mounter's unanswered requests, a restart of their mounter. Nothing without a supervisor.
func (p *Plugin) volumeKeeping() []healerv1alpha1.HealerCapability_VolumeKeeping_Type {
	if p.sup == nil {
		return nil
	}
	keeps := []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART}
	if fuseconn.KernelResends() {
		keeps = append(keeps, healerv1alpha1.HealerCapability_VolumeKeeping_MOUNTER_RESTART)
	}
	return keeps
}

// Locks returns the volume locks the Node service and the Healer service share.
func (p *Plugin) Locks() *driverkit.Locks {
	return p.locks
}

// mounterName is the volume context value of "mounter" for every volume, as Ceph CSI names a
// volume's mounter there.
const mounterName = "fuse"

// mounterKey is the volume context key that names the mounter.
const mounterKey = "mounter"

func (p *Plugin) record(id string) (*record, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.records[id]
	if !ok {
		return nil, false
	}
	return r.clone(), true
}

// recordList returns every record, sorted by volume ID.
func (p *Plugin) recordList() []*record {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*record, 0, len(p.records))
	for _, id := range slices.Sorted(maps.Keys(p.records)) {
		out = append(out, p.records[id].clone())
	}
	return out
}

// ownerOf returns the volume that has path as its staging path or a publish target, if any.
func (p *Plugin) ownerOf(path string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, r := range p.records {
		if _, ok := r.target(path); ok || r.StagingPath == path {
			return id, true
		}
	}
	return "", false
}

// saveRecord writes r and then makes it the volume's record. The caller holds the volume's
// lock.
func (p *Plugin) saveRecord(r *record) error {
	if err := p.store.saveRecord(r); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.records[r.VolumeID] = r.clone()
	return nil
}

// dropRecord forgets a staged volume. The caller holds the volume's lock.
func (p *Plugin) dropRecord(id string) error {
	if err := p.store.removeRecord(id); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.records, id)
	p.cancelResumeLocked(id)
	return nil
}

// known tells whether CreateVolume created the volume (and DeleteVolume did not delete it).
func (p *Plugin) known(id string) (bool, error) {
	_, found, err := p.store.meta(id)
	return found, err
}

// fsName returns a new mount source for a staging of the volume.
func (p *Plugin) fsName(id string) string {
	// A random part makes the source unique to this staging of the volume, on any machine:
	// the kit finds the pods that kept a dead mount by its source, which must then name no
	// other mount (another node plugin on the same machine, a test beside this one).
	var b [6]byte
	_, _ = rand.Read(b[:])
	return p.opts.DriverName + ":" + id + ":" + hex.EncodeToString(b[:])
}

// checkMounts runs the kit's checks on the volume's staging mount and publish targets (all of
// them, or only the one at path when path is set), and adds the plugin's own findings.
func (p *Plugin) checkMounts(ctx context.Context, r *record, path string) (findings []driverkit.Finding, healable bool) {
	if path == "" || path == r.StagingPath {
		findings = append(findings, p.checker.Check(ctx, r.StagingPath, r.expect())...)
	}
	for _, t := range r.PublishTargets {
		if path == "" || path == t.Path {
			want := r.expect()
			want.ReadOnly = t.ReadOnly
			findings = append(findings, p.checker.Check(ctx, t.Path, want)...)
		}
	}
	own, healable := p.Inspect(ctx, r.kitVolume())
	return append(findings, own...), healable
}

// repair repairs a staged volume the way HealVolume does. The caller holds the volume's lock.
func (p *Plugin) repair(ctx context.Context, r *record) (driverkit.RepairResult, error) {
	v := r.kitVolume()
	return p.checker.Repair(ctx, driverkit.Repair{
		VolumeID:       v.ID,
		StagingPath:    v.StagingPath,
		Expect:         v.Expect,
		PublishTargets: v.PublishTargets,
		Remount:        func(ctx context.Context) error { return p.Remount(ctx, v) },
	})
}

// findingsError describes what is still wrong with a volume.
func findingsError(findings []driverkit.Finding) string {
	msgs := make([]string, 0, len(findings))
	for _, f := range findings {
		msgs = append(msgs, fmt.Sprintf("%s/%s: %s", f.Status, f.Reason, f.Message))
	}
	return strings.Join(msgs, "; ")
}
