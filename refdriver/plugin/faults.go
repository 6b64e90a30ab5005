package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/refdriver/control"
)

// VolumeStatus is one volume as the control interface reports it. Its JSON carries the fields
// of the simulated driver's simulated.Volume under the same names, so that a control.Client of
// either mode's volume reads it, plus what only real mounts have.
type VolumeStatus struct {
	// ID is the volume ID.
	ID string `json:"id"`
	// Name is the name CreateVolume was called with.
	Name string `json:"name,omitempty"`
	// Condition is what the checks observed (GET), or the condition the volume was just put
	// in (PUT): healthy, gone (the mount is dead, gone or wrong), readonly, hung or lost
	// (the backing folder is gone).
	Condition control.Condition `json:"condition"`
	// Staged tells whether the volume is staged on this node.
	Staged bool `json:"staged"`
	// StagingTargetPath is where it is staged, or was before the control unstaged it.
	StagingTargetPath string `json:"stagingTargetPath,omitempty"`
	// PublishTargetPaths are its publish targets.
	PublishTargetPaths []string `json:"publishTargetPaths,omitempty"`
	// PublishTargets are its publish targets with their read-only flag.
	PublishTargets []PublishTarget `json:"publishTargets,omitempty"`
	// VolumeContext is the volume context it was staged with.
	VolumeContext map[string]string `json:"volumeContext,omitempty"`
	// MounterPID is its recorded mounter; MounterRunning tells whether that process is still
	// the volume's mounter.
	MounterPID     int  `json:"mounterPid,omitempty"`
	MounterRunning bool `json:"mounterRunning"`
	// Supervised tells whether the node's mount supervisor holds the volume's mount and runs
	// its mounter (Plugin.Supervised).
	Supervised bool `json:"supervised,omitempty"`
	// BackingPath is the folder that holds the volume's data.
	BackingPath string `json:"backingPath"`
	// Findings are what the checks found wrong (GET only).
	Findings []Finding `json:"findings,omitempty"`
}

// PublishTarget is one publish target of a volume.
type PublishTarget struct {
	// Path is the target path.
	Path string `json:"path"`
	// ReadOnly is the readonly flag it was published with.
	ReadOnly bool `json:"readOnly,omitempty"`
}

// Finding is one thing the checks found wrong with a volume (driverkit.Finding).
type Finding struct {
	// Path is the staging or publish path, or "" for the volume as a whole.
	Path string `json:"path,omitempty"`
	// Status is DEGRADED, INACCESSIBLE or DATA_LOSS.
	Status string `json:"status"`
	// Reason is the CamelCase reason, such as MountDisconnected.
	Reason string `json:"reason"`
	// Message says what is wrong.
	Message string `json:"message"`
}

// Volumes reports every volume the plugin created, with the condition its checks observe now;
// a hung volume takes up to Options.StatTimeout.
func (p *Plugin) Volumes(ctx context.Context) ([]VolumeStatus, error) {
	entries, err := os.ReadDir(p.store.volumesDir())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	ids := map[string]bool{}
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok && volumeIDPattern.MatchString(id) {
			ids[id] = true
		}
	}
	for _, r := range p.recordList() {
		ids[r.VolumeID] = true
	}
	out := make([]VolumeStatus, 0, len(ids))
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		vs, err := p.VolumeStatus(ctx, id)
		if errors.Is(err, control.ErrVolumeNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, vs)
	}
	return out, nil
}

// VolumeStatus reports one volume with the condition its checks observe now.
func (p *Plugin) VolumeStatus(ctx context.Context, id string) (VolumeStatus, error) {
	vs, r, err := p.describe(id)
	if err != nil {
		return VolumeStatus{}, err
	}
	var findings []driverkit.Finding
	if r != nil {
		findings, _ = p.checkMounts(ctx, r, "")
	} else {
		findings, _ = p.Inspect(ctx, driverkit.Volume{ID: id})
	}
	vs.Condition = conditionOf(findings)
	for _, f := range findings {
		vs.Findings = append(vs.Findings, Finding{Path: f.Path, Status: f.Status.String(), Reason: f.Reason, Message: f.Message})
	}
	return vs, nil
}

// describe reports a volume without checking it; r is its record when it is staged.
func (p *Plugin) describe(id string) (vs VolumeStatus, r *record, err error) {
	m, found, err := p.store.meta(id)
	if err != nil {
		return VolumeStatus{}, nil, err
	}
	r, staged := p.record(id)
	if !found && !staged {
		return VolumeStatus{}, nil, fmt.Errorf("%w: %q", control.ErrVolumeNotFound, id)
	}
	vs = VolumeStatus{ID: id, Staged: staged, BackingPath: p.store.backing(id)}
	if found {
		vs.Name = m.Name
	}
	shown := r
	if !staged && found && m.Parked != nil {
		shown = m.Parked
	}
	if shown != nil {
		vs.StagingTargetPath = shown.StagingPath
		vs.VolumeContext = shown.VolumeContext
		for _, t := range shown.PublishTargets {
			vs.PublishTargetPaths = append(vs.PublishTargetPaths, t.Path)
			vs.PublishTargets = append(vs.PublishTargets, PublishTarget(t))
		}
	}
	if staged {
		if r.Supervised {
			p.refreshMounterPID(r)
		}
		vs.MounterPID = r.MounterPID
		vs.MounterRunning = isMounterOf(r.MounterPID, r)
		vs.Supervised = r.Supervised
	}
	return vs, r, nil
}

// conditionOf sums findings up as one of the control interface's conditions, the worst first.
func conditionOf(findings []driverkit.Finding) control.Condition {
	has := func(match func(driverkit.Finding) bool) bool { return slices.ContainsFunc(findings, match) }
	switch {
	case has(func(f driverkit.Finding) bool { return f.Status == csi.VolumeHealthErrorType_DATA_LOSS }):
		return control.Lost
	case has(func(f driverkit.Finding) bool { return f.Reason == driverkit.ReasonMountHung }):
		return control.Hung
	case has(func(f driverkit.Finding) bool { return f.Status == csi.VolumeHealthErrorType_INACCESSIBLE }):
		return control.Gone
	case len(findings) > 0:
		return control.ReadOnly
	}
	return control.Healthy
}

// lockWait is how long a control request waits for a volume's lock: longer than a probe of a
// hung volume holds it, shorter than control.Client's timeout.
const lockWait = 8 * time.Second

// lockVolume takes the volume's lock for a control request, waiting for a probe or heal in
// flight to end, since a test that breaks a volume wants it broken, not an ABORTED.
func (p *Plugin) lockVolume(ctx context.Context, id string) (unlock func(), err error) {
	ctx, cancel := context.WithTimeout(ctx, lockWait)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if unlock, ok := p.locks.TryLock(id); ok {
			return unlock, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: volume %q stayed busy for %s", control.ErrBusy, id, lockWait)
		}
	}
}

// SetCondition puts a volume in condition c with a real fault, after repairing whatever was
// wrong with it before, so that the volume ends in exactly that condition:
//
//   - gone: its mounter is killed; the mount answers ENOTCONN.
//   - readonly: its staging mount's superblock is remounted read-only, so every bind of it
//     (each publish target) turns read-only with it.
//   - hung: its mounter is stopped (SIGSTOP); calls on the mount block. With hang > 0 it
//     continues (SIGCONT) after that long.
//   - lost: its backing folder is removed; the volume reports DATA_LOSS and cannot be healed.
//   - healthy: it is repaired through the kit, as a heal would; a lost volume gets a new,
//     empty backing folder.
//
// The answer reports the volume in the condition it was put in, without checking it: a check
// of a hung mount would leave a stat blocked, and the kit answers later checks of the path
// MountHung at once while one is.
func (p *Plugin) SetCondition(ctx context.Context, id string, c control.Condition, hang time.Duration) (VolumeStatus, error) {
	if _, err := control.ParseCondition(string(c)); err != nil {
		return VolumeStatus{}, fmt.Errorf("%w: %w", control.ErrInvalidRequest, err)
	}
	if hang < 0 {
		return VolumeStatus{}, fmt.Errorf("%w: hang must not be negative, got %s", control.ErrInvalidRequest, hang)
	}
	if _, _, err := p.describe(id); err != nil {
		return VolumeStatus{}, err
	}
	unlock, err := p.lockVolume(ctx, id)
	if err != nil {
		return VolumeStatus{}, err
	}
	defer unlock()
	log := klog.FromContext(ctx).WithValues("volume", id, "condition", c)

	r, staged := p.record(id)
	if !staged && c != control.Lost && c != control.Healthy {
		return VolumeStatus{}, fmt.Errorf("%w: volume %q is not staged on this node, so it has no mount to break", control.ErrInvalidRequest, id)
	}
	if err := p.restore(ctx, id, r); err != nil {
		return VolumeStatus{}, err
	}
	if staged {
		// The repair may have started a new mounter.
		r, _ = p.record(id)
	}
	switch c {
	case control.Gone:
		err = p.stopMounter(r, false)
	case control.ReadOnly:
		if err = unix.Mount("", r.StagingPath, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			err = fmt.Errorf("remount %s read-only: %w", r.StagingPath, err)
		}
	case control.Hung:
		err = p.freeze(r, hang)
	case control.Lost:
		if err = os.RemoveAll(p.store.backing(id)); err != nil {
			err = fmt.Errorf("%w: remove the backing folder of volume %q: %w", ErrState, id, err)
		}
	}
	if err != nil {
		return VolumeStatus{}, err
	}
	log.Info("Volume condition set", "hang", hang)
	vs, _, err := p.describe(id)
	vs.Condition = c
	return vs, err
}

// restore repairs whatever is wrong with a volume, as a heal would, and gives a lost volume a
// new, empty backing folder. The caller holds the volume's lock.
func (p *Plugin) restore(ctx context.Context, id string, r *record) error {
	backing := p.store.backing(id)
	_, err := os.Stat(backing)
	lost := errors.Is(err, fs.ErrNotExist)
	if lost {
		if err := os.MkdirAll(backing, 0o777); err != nil {
			return fmt.Errorf("%w: recreate the backing folder of volume %q: %w", ErrState, id, err)
		}
	}
	if r == nil {
		return nil
	}
	p.cancelResume(id)
	if lost {
		// The running mounter serves the removed folder; a new one serves the new folder.
		if err := p.stopMounter(r, false); err != nil {
			return err
		}
	}
	findings, _ := p.checkMounts(ctx, r, "")
	if len(findings) == 0 {
		return nil
	}
	res, err := p.repair(ctx, r)
	if err != nil {
		return fmt.Errorf("repair volume %q: %w", id, err)
	}
	if len(res.Findings) > 0 {
		return fmt.Errorf("volume %q is still broken after a repair: %s", id, findingsError(res.Findings))
	}
	klog.FromContext(ctx).Info("Volume restored", "volume", id, "actions", res.Actions)
	return nil
}

// freeze stops the volume's mounter, and with hang > 0 schedules it to continue.
func (p *Plugin) freeze(r *record, hang time.Duration) error {
	sent, err := p.signalMounter(r, syscall.SIGSTOP)
	if err != nil {
		return err
	}
	if !sent {
		return fmt.Errorf("%w: volume %q has no running mounter to stop", control.ErrInvalidRequest, r.VolumeID)
	}
	// The signal is delivered to the mounter's threads one by one: until all are stopped, one
	// may still answer a request, and the mount would not look frozen yet.
	if err := waitStopped(r.MounterPID, 5*time.Second); err != nil {
		return fmt.Errorf("%w: volume %q: %w", ErrMounter, r.VolumeID, err)
	}
	if hang == 0 {
		return nil
	}
	id, pid := r.VolumeID, r.MounterPID
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cancelResumeLocked(id)
	var t *time.Timer
	t = time.AfterFunc(hang, func() {
		p.mu.Lock()
		current := p.resumes[id] == t
		if current {
			delete(p.resumes, id)
		}
		p.mu.Unlock()
		// Only the mounter that was stopped, and only while it is still the volume's.
		if rec, ok := p.record(id); current && ok {
			if rec.Supervised {
				p.refreshMounterPID(rec)
			}
			if rec.MounterPID == pid {
				_, _ = p.signalMounter(rec, syscall.SIGCONT)
			}
		}
	})
	p.resumes[id] = t
	return nil
}

func (p *Plugin) cancelResume(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cancelResumeLocked(id)
}

func (p *Plugin) cancelResumeLocked(id string) {
	if t, ok := p.resumes[id]; ok {
		t.Stop()
		delete(p.resumes, id)
	}
}

// SetStaged unstages a volume (unpublishing it first) or stages it again where it was staged,
// publishing it at the same targets, as kubelet would.
func (p *Plugin) SetStaged(ctx context.Context, id string, staged bool) (VolumeStatus, error) {
	if _, _, err := p.describe(id); err != nil {
		return VolumeStatus{}, err
	}
	unlock, err := p.lockVolume(ctx, id)
	if err != nil {
		return VolumeStatus{}, err
	}
	defer unlock()
	m, found, err := p.store.meta(id)
	if err != nil {
		return VolumeStatus{}, err
	}
	r, isStaged := p.record(id)
	switch {
	case staged == isStaged:
	case !staged:
		if found {
			m.Parked = r
			if err := p.store.saveMeta(m); err != nil {
				return VolumeStatus{}, err
			}
		}
		for _, t := range r.PublishTargets {
			if err := p.unpublish(ctx, r, t.Path, false); err != nil {
				return VolumeStatus{}, err
			}
			r = r.withoutTarget(t.Path)
		}
		if err := p.unstage(ctx, r); err != nil {
			return VolumeStatus{}, err
		}
	default:
		if !found || m.Parked == nil {
			return VolumeStatus{}, fmt.Errorf("%w: volume %q was not staged here before; stage it with NodeStageVolume", control.ErrInvalidRequest, id)
		}
		parked := m.Parked
		next := &record{VolumeID: id, StagingPath: parked.StagingPath, VolumeContext: parked.VolumeContext}
		if err := p.stage(ctx, next); err != nil {
			return VolumeStatus{}, err
		}
		for _, t := range parked.PublishTargets {
			cur, _ := p.record(id)
			if err := p.publish(ctx, cur, t); err != nil {
				return VolumeStatus{}, err
			}
		}
		m.Parked = nil
		if err := p.store.saveMeta(m); err != nil {
			return VolumeStatus{}, err
		}
	}
	vs, _, err := p.describe(id)
	return vs, err
}

// waitStopped waits until every thread of the process pid is stopped (state T in its stat).
func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		running, err := runningThreads(pid)
		if err != nil || running == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d threads of mounter %d still run %s after SIGSTOP", running, pid, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runningThreads counts the threads of pid that are not stopped.
func runningThreads(pid int) (int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, fmt.Errorf("read the threads of mounter %d: %w", pid, err)
	}
	running := 0
	for _, t := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			continue // the thread ended
		}
		// The state follows the command name, which ends at the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) {
			continue
		}
		if state := stat[i+2]; state != 'T' && state != 't' && state != 'Z' && state != 'X' {
			running++
		}
	}
	return running, nil
}
