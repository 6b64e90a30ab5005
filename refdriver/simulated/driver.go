// Package simulated is the reference driver's simulated mode, the reference implementation of
// the volume-healer Healer service: a simulated CSI driver node plugin whose volumes can be
// broken on purpose and healed, with nothing mounted.
//
// It serves the CSI-Addons Identity service and the Healer service on a UNIX socket (NewServer),
// keeps each volume's state in a JSON file so that the state survives a restart, holds a
// per-volume lock (a second call on a busy volume gets ABORTED), and counts calls. Tests drive
// it through the Go methods of Driver when it runs in the same process, or through the HTTP
// control interface (ControlHandler, ControlClient; package control) when it runs as a separate
// process.
//
// Driver authors: healer.go is the part to read. It shows the order of checks a Healer
// implementation makes and which gRPC code each failure gets.
//
// It speaks only the wire protocol (api/healer) and shares the control interface with the real
// mode through package control: it must not import any package of the controller or the
// sidecar, nor package plugin.
package simulated

import (
	"cmp"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/control"
)

// Driver is one simulated CSI driver node plugin: one node's worth of volumes.
type Driver struct {
	opts         Options
	store        store
	healMounters map[string]bool
	keepMounters map[string]bool
	counters     *control.Recorder

	mu      sync.Mutex
	volumes map[string]*Volume
	// busy holds the volumes with a probe or heal in flight: the per-volume lock. A real driver
	// takes the same lock in NodeStageVolume and NodeUnstageVolume, so that a heal never races
	// the kubelet's own calls.
	busy map[string]bool
}

// New loads the driver's volumes from opts.StateDir, creating opts.SeedVolumes on the first
// start.
func New(opts Options) (*Driver, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	d := &Driver{
		opts:         opts,
		store:        store{dir: filepath.Join(opts.StateDir, "volumes")},
		healMounters: map[string]bool{},
		keepMounters: map[string]bool{},
		counters:     control.NewRecorder(),
		busy:         map[string]bool{},
	}
	for _, m := range opts.HealMounters {
		d.healMounters[m] = true
	}
	for _, m := range opts.KeepMounters {
		d.keepMounters[m] = true
	}
	vols, fresh, err := d.store.load()
	if err != nil {
		return nil, err
	}
	d.volumes = vols
	if fresh {
		for _, id := range opts.SeedVolumes {
			if _, err := d.AddVolume(VolumeSpec{ID: id}); err != nil {
				return nil, fmt.Errorf("seed volume %q: %w", id, err)
			}
		}
	}
	return d, nil
}

// Register adds the CSI-Addons Identity service and the Healer service to s, as a CSI driver
// does on its CSI-Addons socket.
func (d *Driver) Register(s grpc.ServiceRegistrar) {
	identity.RegisterIdentityServer(s, d.IdentityServer())
	healerv1alpha1.RegisterHealerServer(s, d.HealerServer())
}

// IdentityServer returns the driver's CSI-Addons Identity service.
func (d *Driver) IdentityServer() identity.IdentityServer {
	return &identityServer{d: d}
}

// HealerServer returns the driver's Healer service.
func (d *Driver) HealerServer() healerv1alpha1.HealerServer {
	return &healerServer{d: d}
}

// Name returns the driver name it reports in GetIdentity.
func (d *Driver) Name() string {
	return d.opts.DriverName
}

// Volumes returns every volume, sorted by ID.
func (d *Driver) Volumes() []Volume {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Volume, 0, len(d.volumes))
	for _, v := range d.volumes {
		out = append(out, v.clone())
	}
	slices.SortFunc(out, func(a, b Volume) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Volume returns one volume, or ErrVolumeNotFound.
func (d *Driver) Volume(id string) (Volume, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.volumes[id]
	if !ok {
		return Volume{}, fmt.Errorf("%w: %q", control.ErrVolumeNotFound, id)
	}
	return v.clone(), nil
}

// Healable reports whether the driver can heal the volume: its mounter is one of
// Options.HealMounters.
func (d *Driver) Healable(v Volume) bool {
	return d.healMounters[v.VolumeContext[MounterKey]]
}

// Kept reports whether the driver keeps the volume alive across the restarts it advertises
// (Options.VolumeKeeping): its mounter is one of Options.KeepMounters.
func (d *Driver) Kept(v Volume) bool {
	return d.keepMounters[v.VolumeContext[MounterKey]]
}

// AddVolume adds a healthy volume, staged unless spec says otherwise.
func (d *Driver) AddVolume(spec VolumeSpec) (Volume, error) {
	if strings.TrimSpace(spec.ID) == "" {
		return Volume{}, fmt.Errorf("%w: volume id is empty", control.ErrInvalidRequest)
	}
	mounter := cmp.Or(spec.Mounter, "rbd-nbd")
	v := &Volume{
		ID:                 spec.ID,
		Condition:          control.Healthy,
		Staged:             !spec.NotStaged,
		StagingTargetPath:  healerv1alpha1.StagingTargetPath(d.opts.StagingRoot, d.opts.DriverName, spec.ID),
		PublishTargetPaths: slices.Clone(spec.PublishTargetPaths),
		VolumeContext:      map[string]string{},
	}
	maps.Copy(v.VolumeContext, spec.VolumeContext)
	v.VolumeContext[MounterKey] = mounter

	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.volumes[v.ID]; ok {
		return Volume{}, fmt.Errorf("%w: %q", control.ErrVolumeExists, v.ID)
	}
	if err := d.store.save(v); err != nil {
		return Volume{}, err
	}
	d.volumes[v.ID] = v
	d.opts.Logger.Info("Volume added", "volume", v.ID, "mounter", mounter, "staged", v.Staged)
	return v.clone(), nil
}

// RemoveVolume forgets a volume and deletes its state file.
func (d *Driver) RemoveVolume(id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.volumes[id]; !ok {
		return fmt.Errorf("%w: %q", control.ErrVolumeNotFound, id)
	}
	if err := d.store.remove(id); err != nil {
		return err
	}
	delete(d.volumes, id)
	d.opts.Logger.Info("Volume removed", "volume", id)
	return nil
}

// SetCondition breaks a volume (or makes it healthy again) on purpose. hang applies to Hung
// only; zero means Options.DefaultHang. Calls already waiting on a hung volume keep waiting.
func (d *Driver) SetCondition(id string, c control.Condition, hang time.Duration) (Volume, error) {
	if _, err := control.ParseCondition(string(c)); err != nil {
		return Volume{}, err
	}
	if hang < 0 {
		return Volume{}, fmt.Errorf("%w: hang must not be negative, got %s", control.ErrInvalidRequest, hang)
	}
	if c == control.Hung && hang == 0 {
		hang = d.opts.DefaultHang
	}
	if c != control.Hung {
		hang = 0
	}
	return d.update(id, func(v *Volume) {
		v.Condition = c
		v.Hang = sanity.Duration(hang)
	})
}

// SetStaged stages or unstages a volume on this node (only the record: nothing is mounted).
func (d *Driver) SetStaged(id string, staged bool) (Volume, error) {
	return d.update(id, func(v *Volume) { v.Staged = staged })
}

// SetRecheckAfter sets the recheck_after that probes and heals of the volume return; zero
// removes it.
func (d *Driver) SetRecheckAfter(id string, after time.Duration) (Volume, error) {
	if after < 0 {
		return Volume{}, fmt.Errorf("%w: recheck after must not be negative, got %s", control.ErrInvalidRequest, after)
	}
	return d.update(id, func(v *Volume) { v.RecheckAfter = sanity.Duration(after) })
}

// Counters returns a snapshot of the call counters.
func (d *Driver) Counters() control.Counters {
	return d.counters.Counters()
}

// Calls returns the call log: every ProbeVolume and HealVolume call since the driver started or
// since ResetCounters (at most MaxCallLog, the most recent), oldest first.
func (d *Driver) Calls() []control.Call {
	return d.counters.Calls()
}

// ResetCounters sets every counter back to zero and empties the call log; calls still in flight
// stay counted as in flight.
func (d *Driver) ResetCounters() {
	d.counters.Reset()
}

// update changes one volume and writes it to disk; the in-memory copy changes only when the
// write succeeded.
func (d *Driver) update(id string, change func(*Volume)) (Volume, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.volumes[id]
	if !ok {
		return Volume{}, fmt.Errorf("%w: %q", control.ErrVolumeNotFound, id)
	}
	next := v.clone()
	change(&next)
	if err := d.store.save(&next); err != nil {
		return Volume{}, err
	}
	d.volumes[id] = &next
	d.opts.Logger.Info("Volume changed", "volume", id, "condition", next.Condition, "staged", next.Staged)
	return next.clone(), nil
}

// tryLock takes the per-volume lock without waiting. ok is false when another call holds it.
func (d *Driver) tryLock(id string) (unlock func(), ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.busy[id] {
		return nil, false
	}
	d.busy[id] = true
	return func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		delete(d.busy, id)
	}, true
}

func (d *Driver) serves(t healerv1alpha1.HealerCapability_RPC_Type) bool {
	return slices.Contains(d.opts.Capabilities, t)
}
