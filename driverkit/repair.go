package driverkit

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

// PublishTarget is one place a volume is published for a pod (NodePublishVolume's target path).
type PublishTarget struct {
	// Path is the target path kubelet gave NodePublishVolume.
	Path string
	// ReadOnly is the readonly flag of that NodePublishVolume call.
	ReadOnly bool
}

// Repair describes the repair of one volume.
type Repair struct {
	// VolumeID names the volume in messages.
	VolumeID string
	// StagingPath is where the volume's mounter mounts it (NodeStageVolume's staging path).
	StagingPath string
	// Expect is what a healthy staging mount looks like.
	Expect Expect
	// PublishTargets are the volume's publish targets; each gets the repaired mount.
	PublishTargets []PublishTarget
	// Remount stops what is left of the volume's mounter (a frozen one must be killed) and starts
	// a new one mounted at StagingPath. The kit calls it after the dead mount was detached from
	// StagingPath, and checks the result itself.
	Remount func(ctx context.Context) error
}

// RepairResult says what a repair did and what is still wrong.
type RepairResult struct {
	// Findings are what is still wrong after the repair: empty means the volume is healthy on the
	// node and every running workload that can receive the new mount sees it. A volume whose
	// staging mount was repaired but that running pods still see dead gives ReasonStaleMountInPods.
	Findings []Finding
	// Actions lists what was done, in order, for logs ("detached dead mount at ...").
	Actions []string
	// Steps are the steps the repair took and how long each took, in order, for logs.
	Steps Steps
}

// Step is a step of a call and how long it took.
type Step struct {
	// Name names the step: "check", "detach", "remount", "check again", "restack", "search".
	Name string
	// Took is how long the step took.
	Took time.Duration
}

// Steps are the steps of one call, in order.
type Steps []Step

// add appends the step name begun at start, ending now, and returns now.
func (s *Steps) add(name string, start time.Time) time.Time {
	now := time.Now()
	*s = append(*s, Step{Name: name, Took: now.Sub(start)})
	return now
}

// String lists the steps as "check 1.2ms, remount 30ms".
func (s Steps) String() string {
	parts := make([]string, 0, len(s))
	for _, st := range s {
		parts = append(parts, st.Name+" "+st.Took.Round(10*time.Microsecond).String())
	}
	return strings.Join(parts, ", ")
}

// Repair repairs the volume's mounts:
//  1. the staging mount is checked; a read-only one (the only finding) is remounted read-write;
//     a gone, disconnected, hung or wrong one is detached (lazily, every stacked layer) and
//     r.Remount starts the mounter again; the staging mount is checked again;
//  2. every publish target that is not healthy or does not show the staging mount's device gets
//     the staging mount bind-mounted on top of what is there, read-only where the target is. The
//     dead mount is not detached first: a new mount stacked on the target propagates to the
//     workloads' mount namespaces that are slaves of it (HostToContainer, Bidirectional), while a
//     detach would not reach them;
//  3. the mount namespaces under CheckerOptions.Proc are searched for mounts of the dead device
//     that are still top-most at their mount point (pods with propagation None):
//     ReasonStaleMountInPods, naming how many processes and namespaces. The dead staging mount
//     is held open from before it is detached until then, so that its device number cannot be
//     given to another new mount meanwhile.
//
// The returned error is for failures of the repair itself (Remount failed, a mount call failed);
// the result still lists the findings known at that point.
func (c *Checker) Repair(ctx context.Context, r Repair) (RepairResult, error) {
	var res RepairResult
	staging := filepath.Clean(r.StagingPath)
	opts := c.options()
	// dead collects the devices of the mounts the repair replaces, for the search of pods that
	// still see them.
	dead := map[string]bool{}

	at := time.Now()
	findings := c.Check(ctx, staging, r.Expect)
	at = res.Steps.add("check", at)
	switch {
	case len(findings) == 0:
	case onlyReasons(findings, ReasonReadOnlyMount):
		if err := remountReadWrite(staging, opts.MountInfo); err != nil {
			res.Findings = findings
			return res, fmt.Errorf("volume %s: %w", r.VolumeID, err)
		}
		res.Actions = append(res.Actions, "remounted the read-only staging mount at "+staging+" read-write")
		at = res.Steps.add("remount", at)
		findings = c.Check(ctx, staging, r.Expect)
		at = res.Steps.add("check again", at)
	case ctx.Err() != nil || !onlyReasons(findings, ReasonMountGone, ReasonMountDisconnected, ReasonMountHung,
		ReasonWrongMountSource, ReasonWrongFilesystemType, ReasonReadOnlyMount):
		// A mount that could not be checked is not known to be broken: detaching it could
		// take a working volume away from its pods.
		res.Findings = findings
		return res, fmt.Errorf("volume %s: the staging mount at %s could not be checked, so it is not repaired: %s",
			r.VolumeID, staging, messages(findings))
	default:
		// The dead mount is known to the search by its device number, which the kernel hands
		// to a new mount (another volume's new mounter, started by a repair beside this one)
		// as soon as the last mount of the dead filesystem is gone: detaching the staging
		// mount can be that. Holding the dead mount open keeps its number until the search
		// is done, so that a mount found with it is the dead one.
		unpin := c.pinMount(staging)
		defer unpin()
		if dev, err := c.MountDevice(staging); err == nil && dev != "" {
			dead[dev] = true
		}
		n, err := UnmountAll(staging)
		if n > 0 {
			res.Actions = append(res.Actions, fmt.Sprintf("detached %d broken mount(s) at %s (%s)", n, staging, messages(findings)))
		}
		if err != nil {
			res.Findings = findings
			return res, fmt.Errorf("volume %s: %w", r.VolumeID, err)
		}
		at = res.Steps.add("detach", at)
		if err := r.Remount(ctx); err != nil {
			res.Findings = c.Check(ctx, staging, r.Expect)
			return res, fmt.Errorf("volume %s: start its mounter again at %s: %w", r.VolumeID, staging, err)
		}
		res.Actions = append(res.Actions, "started the mounter of volume "+r.VolumeID+" again at "+staging)
		at = res.Steps.add("remount", at)
		findings = c.Check(ctx, staging, r.Expect)
		at = res.Steps.add("check again", at)
	}
	if len(findings) > 0 {
		// Stacking a broken staging mount on the publish targets would help no pod.
		res.Findings = findings
		return res, nil
	}
	stagingDev, err := c.MountDevice(staging)
	if err != nil {
		return res, fmt.Errorf("volume %s: %w", r.VolumeID, err)
	}

	var errs []error
	for _, t := range r.PublishTargets {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: publish targets left unrepaired: %w", r.VolumeID, context.Cause(ctx)))
			break
		}
		target := filepath.Clean(t.Path)
		want := r.Expect
		want.ReadOnly = t.ReadOnly
		dev, err := c.MountDevice(target)
		if err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", r.VolumeID, err))
			continue
		}
		tf := c.Check(ctx, target, want)
		if len(tf) == 0 && dev == stagingDev {
			continue
		}
		if dev != "" && hasReason(tf, ReasonMountDisconnected, ReasonMountHung) {
			dead[dev] = true
		}
		if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
			// kubelet creates and removes publish targets; one that is gone belongs to no
			// pod any more, and the finding says so.
			res.Findings = append(res.Findings, tf...)
			continue
		}
		if err := BindMount(staging, target, t.ReadOnly); err != nil {
			res.Findings = append(res.Findings, tf...)
			errs = append(errs, fmt.Errorf("volume %s: %w", r.VolumeID, err))
			continue
		}
		how := ""
		if t.ReadOnly {
			how = " read-only"
		}
		res.Actions = append(res.Actions, fmt.Sprintf("mounted the staging mount%s on top of publish target %s (%s)", how, target, whyRestack(tf)))
		res.Findings = append(res.Findings, c.Check(ctx, target, want)...)
	}

	at = res.Steps.add("restack", at)
	delete(dead, stagingDev)
	repairedAt := c.markRepaired(r.VolumeID)
	if len(dead) > 0 {
		if f, ok := c.staleFinding(r.VolumeID, slices.Sorted(maps.Keys(dead)), repairedAt); ok {
			res.Findings = append(res.Findings, f)
		}
		res.Steps.add("search", at)
	}
	return res, errors.Join(errs...)
}

// pinMount opens the top-most mount at path without reading it (O_PATH), which keeps that
// mount and its filesystem, and so its device number, alive after it is detached, until the
// returned function closes it. The open does not reach a FUSE mounter; should it still not
// return within the stat timeout, or fail, nothing is pinned.
func (c *Checker) pinMount(path string) (unpin func()) {
	type opened struct {
		fd  int
		err error
	}
	ch := make(chan opened, 1)
	abandoned := make(chan struct{})
	go func() {
		fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
		select {
		case ch <- opened{fd, err}:
		case <-abandoned:
			if err == nil {
				_ = unix.Close(fd)
			}
		}
	}()
	timer := time.NewTimer(c.options().StatTimeout)
	defer timer.Stop()
	select {
	case o := <-ch:
		if o.err != nil {
			return func() {}
		}
		return func() { _ = unix.Close(o.fd) }
	case <-timer.C:
		close(abandoned)
		return func() {}
	}
}

// staleFinding searches the mount namespaces of other processes for mounts of the dead devices
// that nothing was stacked on, and reports them (ok) as ReasonStaleMountInPods. A search that
// fails is reported too: the repair cannot claim that every pod sees the repaired volume.
func (c *Checker) staleFinding(volumeID string, devices []string, since time.Time) (Finding, bool) {
	return c.staleFindingOf(volumeID, strings.Join(devices, ", "), deviceIn(devices), since)
}

// staleFindingOf is staleFinding for the mounts match selects, in a search begun at since or
// later; what names them in messages.
func (c *Checker) staleFindingOf(volumeID, what string, match func(*mountInfo) bool, since time.Time) (Finding, bool) {
	opts := c.options()
	s, scanErr := c.scanStale(match, since)
	own, err := os.Readlink(filepath.Join(opts.Proc, "self", "ns", "mnt"))
	if err != nil {
		scanErr = errors.Join(scanErr, fmt.Errorf("find the checker's own mount namespace: %w", err))
	}
	var others []StaleMount
	for _, m := range s.mounts {
		if m.Namespace != own {
			others = append(others, m)
		}
	}
	if len(others) > 0 {
		others = c.confirmStale(others, staleConfirmDelay)
	}
	procs, namespaces := 0, map[string]bool{}
	for _, m := range others {
		if !namespaces[m.Namespace] {
			namespaces[m.Namespace] = true
			procs += s.procs[m.Namespace]
		}
	}
	if len(others) == 0 && scanErr == nil {
		return Finding{}, false
	}
	if len(others) == 0 {
		return Finding{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: ReasonMountCheckFailed,
			Message: fmt.Sprintf("volume %s was repaired on the node, but whether running pods still see its dead mount (%s) is unknown: %v; "+
				"restart the pods that use the volume if they cannot read it", volumeID, what, scanErr)}, true
	}
	var examples []string
	for _, m := range others[:min(len(others), 3)] {
		examples = append(examples, fmt.Sprintf("%s at %s in process %d", m.Device, m.MountPoint, m.PID))
	}
	if len(others) > 3 {
		examples = append(examples, fmt.Sprintf("and %d more", len(others)-3))
	}
	msg := fmt.Sprintf("volume %s was repaired on the node, but %d process(es) in %d other mount namespace(s) still see its dead mount (%s): "+
		"their mount propagation is None, so they cannot receive the repaired mount; restart those pods",
		volumeID, procs, len(namespaces), strings.Join(examples, ", "))
	if scanErr != nil {
		msg += fmt.Sprintf(" (the search was incomplete: %v)", scanErr)
	}
	if s.hidden > 0 {
		msg += fmt.Sprintf(" (%d process(es) could not be searched: permission denied)", s.hidden)
	}
	return Finding{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: ReasonStaleMountInPods, Message: msg}, true
}

// staleConfirmDelay is how long after a search finds a dead mount in another namespace it looks
// again (confirmStale).
const staleConfirmDelay = 100 * time.Millisecond

// confirmStale looks at the stale mounts a search found again, after delay, and keeps those
// still there: their namespace still has a process, and the dead device is still the top-most
// mount at the mount point. A container runtime setting up a container copies the node's mounts
// into a namespace of its own and makes them private until it switches to the container's root
// and lets go of the copy, a few milliseconds; a search in that moment finds the node's dead
// mounts there, in no pod. A pod keeps its copy until it is restarted.
func (c *Checker) confirmStale(mounts []StaleMount, delay time.Duration) []StaleMount {
	time.Sleep(delay)
	proc := c.options().Proc
	// Each namespace is read again through the process the search read it through, or through
	// another of its processes if that one is gone.
	via := map[string]int{}
	tables := map[string][]*mountInfo{}
	inNamespace := func(pid int, ns string) bool {
		got, err := os.Readlink(filepath.Join(proc, strconv.Itoa(pid), "ns", "mnt"))
		return err == nil && got == ns
	}
	table := func(m StaleMount) ([]*mountInfo, int) {
		if infos, ok := tables[m.Namespace]; ok {
			return infos, via[m.Namespace]
		}
		pid := m.PID
		if !inNamespace(pid, m.Namespace) {
			pid = c.processIn(m.Namespace)
		}
		var infos []*mountInfo
		if pid > 0 {
			infos, _ = readMountTable(filepath.Join(proc, strconv.Itoa(pid), "mountinfo"))
			if !inNamespace(pid, m.Namespace) {
				// The process left the namespace (exited, its number reused) while being read.
				infos = nil
			}
		}
		tables[m.Namespace], via[m.Namespace] = infos, pid
		return infos, pid
	}
	var kept []StaleMount
	for _, m := range mounts {
		infos, pid := table(m)
		if top := topMount(infos, m.MountPoint); top != nil && device(top) == m.Device {
			m.PID = pid
			kept = append(kept, m)
		}
	}
	return kept
}

// processIn returns a process whose mount namespace is ns, or 0 when there is none.
func (c *Checker) processIn(ns string) int {
	found := 0
	_ = eachProcess(c.options().Proc, func(pid int, got string, err error) bool {
		if err == nil && got == ns {
			found = pid
			return false
		}
		return true
	})
	return found
}

// eachProcess calls f with each process under the /proc folder proc and its mount namespace (the
// target of ns/mnt), or the error reading it, until f returns false. It fails only when proc
// cannot be listed.
func eachProcess(proc string, f func(pid int, ns string, err error) bool) error {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		ns, err := os.Readlink(filepath.Join(proc, e.Name(), "ns", "mnt"))
		if !f(pid, ns, err) {
			return nil
		}
	}
	return nil
}

// StaleInPods reports (ok) the running processes in other mount namespaces that still see an
// old mount of the volume: a mount with the volume's source and filesystem type (want.Source and
// want.FSType, which must both be set and the source unique to the volume) whose device is not the
// one of the live staging mount at stagingPath, with nothing stacked on it. It finds what a pod
// with mount propagation None keeps after any repair, also one made before this process started,
// so a probe reports it too. Without a live staging mount it reports nothing: the staging
// findings say what is wrong then.
func (c *Checker) StaleInPods(volumeID, stagingPath string, want Expect) (Finding, bool) {
	if want.Source == "" || want.FSType == "" {
		return Finding{}, false
	}
	live, err := c.MountDevice(filepath.Clean(stagingPath))
	if err != nil || live == "" {
		return Finding{}, false
	}
	return c.staleFindingOf(volumeID, "source "+want.Source+", not device "+live, func(m *mountInfo) bool {
		return m.Source == want.Source && m.FSType == want.FSType && device(m) != live
	}, c.probeSearchSince(volumeID))
}

// staleSearchReuse is how old a search of the mount namespaces a probe may take its answer from
// (StaleInPods). The probes and repairs of a node plugin's restart each ask for one, and on a node
// with many pods a search costs as much as a repair: a search for each would put every call
// behind the searches of the others. A probe of a volume that Repair changed within that time
// takes only a search begun after the change, so that it sees the pods' mounts as the repair
// left them; a pod that let go of a dead mount is seen gone at most this long after.
const staleSearchReuse = time.Second

// probeSearchSince is the oldest start of a search that a probe of volume volumeID may take.
func (c *Checker) probeSearchSince(volumeID string) time.Time {
	since := time.Now().Add(-staleSearchReuse)
	c.scanMu.Lock()
	defer c.scanMu.Unlock()
	if at, ok := c.repaired[volumeID]; ok && at.After(since) {
		since = at
	}
	return since
}

// markRepaired notes that Repair changed volume volumeID's mounts now, and returns now.
func (c *Checker) markRepaired(volumeID string) time.Time {
	now := time.Now()
	c.scanMu.Lock()
	defer c.scanMu.Unlock()
	if c.repaired == nil {
		c.repaired = map[string]time.Time{}
	}
	for id, at := range c.repaired {
		if now.Sub(at) > staleSearchReuse {
			delete(c.repaired, id)
		}
	}
	c.repaired[volumeID] = now
	return now
}

// maxLayers bounds UnmountAll, so that a path that cannot be unmounted ends the loop.
const maxLayers = 16

// UnmountAll detaches every mount stacked at path (lazily: MNT_DETACH, so a dead or hung mount
// cannot block it) and returns how many it detached. Nothing mounted is not an error, nor is a
// path that does not exist; a symbolic link is not followed. A driver's NodeUnpublishVolume and
// NodeUnstageVolume use it, since a repaired target holds two layers.
//
// It reads no mount table: the kernel answers EINVAL once nothing is mounted at path. A table
// read per layer cost each repair two reads of the node's largest table, and the repairs of a
// restart, each changing that table, waited on one another's reads.
func UnmountAll(path string) (int, error) {
	path = filepath.Clean(path)
	for n := 0; n < maxLayers; n++ {
		err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return n, nil
		default:
			return n, fmt.Errorf("detach the mount at %s: %w", path, err)
		}
	}
	return maxLayers, fmt.Errorf("%s is still a mount point after %d detaches", path, maxLayers)
}

// BindMount bind-mounts source onto target, on top of whatever is mounted there, read-only when
// readOnly is set. A driver's NodePublishVolume uses it.
func BindMount(source, target string, readOnly bool) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s on %s: %w", source, target, err)
	}
	if !readOnly {
		return nil
	}
	// A bind mount takes its per-mount flags from the source; the read-only remount must keep
	// them (nosuid, nodev, ...), since a remount replaces them all.
	flags := uintptr(unix.MS_RDONLY)
	if infos, err := readMountTable(selfMountInfo); err == nil {
		if top := topMount(infos, target); top != nil {
			flags |= perMountFlags(mountOptions(top))
		}
	}
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|flags, ""); err != nil {
		// Leave no writable mount where a read-only one was asked for.
		_ = unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("make the bind mount of %s on %s read-only: %w", source, target, err)
	}
	return nil
}

// remountReadWrite makes the top-most mount at path read-write: its filesystem when that is
// read-only (a filesystem remounted read-only after errors), and its own flag when that is (a
// read-only bind mount). The result is checked in the mount table.
func remountReadWrite(path, table string) error {
	top, err := topMountIn(table, path)
	if err != nil {
		return err
	}
	flags := perMountFlags(mountOptions(top)) &^ unix.MS_RDONLY
	if slices.Contains(superOptions(top), "ro") {
		if err := unix.Mount("", path, "", unix.MS_REMOUNT|flags, ""); err != nil {
			return fmt.Errorf("remount the filesystem at %s read-write: %w", path, err)
		}
		if top, err = topMountIn(table, path); err != nil {
			return err
		}
	}
	if slices.Contains(mountOptions(top), "ro") {
		if err := unix.Mount("", path, "", unix.MS_REMOUNT|unix.MS_BIND|flags, ""); err != nil {
			return fmt.Errorf("remount the mount at %s read-write: %w", path, err)
		}
		if top, err = topMountIn(table, path); err != nil {
			return err
		}
	}
	if readOnly(top) {
		return fmt.Errorf("%s is still read-only after a read-write remount (mount options %s, filesystem options %s)",
			path, top.Options, top.VFSOptions)
	}
	return nil
}

func topMountIn(table, path string) (*mountInfo, error) {
	infos, err := readMountTable(table)
	if err != nil {
		return nil, err
	}
	top := topMount(infos, path)
	if top == nil {
		return nil, fmt.Errorf("nothing is mounted at %s", path)
	}
	return top, nil
}

// StaleMount is a mount of a dead device that a process in some mount namespace still sees.
type StaleMount struct {
	// PID is one process of the namespace.
	PID int
	// Namespace is the namespace's identity (the target of /proc/PID/ns/mnt).
	Namespace string
	// MountPoint is where the dead mount is mounted in that namespace.
	MountPoint string
	// Device is the dead device, "major:minor".
	Device string
}

// StaleMounts returns, for each mount namespace under CheckerOptions.Proc, the mounts of one of
// devices that are top-most at their mount point there (nothing is stacked on them), once per
// namespace and mount point. The checker's own namespace is included. Processes that exit during
// the scan are skipped, and so are processes whose namespace the checker may not read.
func (c *Checker) StaleMounts(devices []string) ([]StaleMount, error) {
	s, err := c.scanStale(deviceIn(devices), time.Now())
	return s.mounts, err
}

// staleScan is what one search of the mount namespaces found.
type staleScan struct {
	// mounts are the stale mounts, ordered by namespace and mount point.
	mounts []StaleMount
	// procs counts the processes of each namespace that has stale mounts.
	procs map[string]int
	// hidden counts the processes whose mount namespace the checker may not read. A node
	// plugin that heals runs privileged in the host's PID namespace, where every pod's
	// processes are readable; what it cannot read (a process of a sandbox outside its user
	// namespace) is not a pod it serves.
	hidden int
}

// deviceIn matches the mounts of one of devices.
func deviceIn(devices []string) func(*mountInfo) bool {
	want := map[string]bool{}
	for _, d := range devices {
		want[d] = true
	}
	return func(m *mountInfo) bool { return want[device(m)] }
}

// scanStale searches every mount namespace for the mounts match selects that nothing is stacked
// on, in a search of the namespaces begun at since or later (scanNamespaces).
func (c *Checker) scanStale(match func(*mountInfo) bool, since time.Time) (staleScan, error) {
	found := c.scanNamespaces(since)
	s := staleScan{procs: map[string]int{}, hidden: found.hidden}
	for _, n := range found.namespaces {
		points := map[string]bool{}
		for _, m := range n.top {
			if !match(m) || points[m.Mountpoint] {
				continue
			}
			points[m.Mountpoint] = true
			s.mounts = append(s.mounts, StaleMount{PID: n.pid, Namespace: n.ns, MountPoint: m.Mountpoint, Device: device(m)})
		}
	}
	for _, m := range s.mounts {
		s.procs[m.Namespace] = found.procs[m.Namespace]
	}
	slices.SortFunc(s.mounts, func(a, b StaleMount) int {
		return strings.Compare(a.Namespace+"\x00"+a.MountPoint, b.Namespace+"\x00"+b.MountPoint)
	})
	return s, found.err
}

// namespaceScan is one search of the machine's mount namespaces: in each, the mounts nothing is
// stacked on, read through one of its processes.
type namespaceScan struct {
	namespaces []namespaceMounts
	// procs counts the processes of each namespace.
	procs  map[string]int
	hidden int
	err    error
}

type namespaceMounts struct {
	pid int
	ns  string
	top []*mountInfo
}

// scanRun is a search in flight; began is set when it begins, res before done closes.
type scanRun struct {
	began time.Time
	done  chan struct{}
	res   namespaceScan
}

// scanNamespaces returns a search of every mount namespace begun at since or later: the last
// one that ended, if it began then, else one begun after the call. A search reads the mount
// table of each namespace of the machine, which costs as much as the node has pods and mounts,
// and the probes and repairs of a node plugin's restart all ask for one at once: a call that
// comes while a search runs waits for it to end and joins the next one, which serves every call
// that came meanwhile, so that at most two run back to back whatever the number of calls.
func (c *Checker) scanNamespaces(since time.Time) namespaceScan {
	c.scanMu.Lock()
	if last := c.lastScan; last != nil && !last.began.Before(since) {
		c.scanMu.Unlock()
		return last.res
	}
	if c.scanning == nil {
		r := &scanRun{done: make(chan struct{})}
		c.scanning = r
		c.scanMu.Unlock()
		c.runScan(r)
		return r.res
	}
	if next := c.nextScan; next != nil {
		c.scanMu.Unlock()
		<-next.done
		return next.res
	}
	next := &scanRun{done: make(chan struct{})}
	c.nextScan = next
	running := c.scanning
	c.scanMu.Unlock()
	<-running.done
	c.scanMu.Lock()
	c.scanning, c.nextScan = next, nil
	c.scanMu.Unlock()
	c.runScan(next)
	return next.res
}

// runScan searches the namespaces for r and ends it.
func (c *Checker) runScan(r *scanRun) {
	c.scansRun.Add(1)
	r.began = time.Now()
	r.res = c.readNamespaces()
	c.scanMu.Lock()
	if c.scanning == r {
		c.scanning = nil
	}
	if c.lastScan == nil || r.began.After(c.lastScan.began) {
		c.lastScan = r
	}
	waiting := c.nextScan != nil
	c.scanMu.Unlock()
	if !waiting {
		// No search follows this one: what it kept open would only hold descriptors and
		// namespaces until the next burst of calls.
		c.closeNamespaceTables()
	}
	close(r.done)
}

// readNamespaces reads the mount table of each mount namespace under CheckerOptions.Proc,
// through the first of its processes that shows one; a table read by an earlier search is read
// again only when its namespace's mounts changed since (namespaceTop).
func (c *Checker) readNamespaces() namespaceScan {
	c.nsMu.Lock()
	defer c.nsMu.Unlock()
	proc := c.options().Proc
	s := namespaceScan{procs: map[string]int{}}
	scanned := map[string]bool{}
	var errs []error
	// The checker's own namespace is the one its checks read all along (selfTable), kept open
	// and read again only when it changed: the scan takes that read rather than a second one of
	// the same table, one of the largest on a node plugin, which every repair changes.
	own := ""
	if proc == defaultProc {
		own, _ = os.Readlink(filepath.Join(proc, "self", "ns", "mnt"))
	}
	listErr := eachProcess(proc, func(pid int, ns string, err error) bool {
		if err != nil {
			if denied(err) {
				s.hidden++
			} else if !vanished(err) {
				errs = append(errs, fmt.Errorf("process %d: %w", pid, err))
			}
			return true
		}
		s.procs[ns]++
		if scanned[ns] {
			return true
		}
		var top, infos []*mountInfo
		shared := false
		if ns == own {
			infos, shared, _ = selfTable.read()
		}
		if shared {
			top = topMounts(infos)
		} else {
			// Not the own namespace, or its shared table failed: read through the process,
			// which says what went wrong.
			top, err = c.namespaceTop(ns, filepath.Join(proc, strconv.Itoa(pid)))
		}
		if err != nil {
			if denied(err) {
				s.hidden++
				return true
			}
			if !vanished(err) {
				errs = append(errs, fmt.Errorf("process %d: %w", pid, err))
			}
			return true
		}
		if top == nil {
			// A process that is exiting shows an empty table; another one of its namespace
			// will do.
			return true
		}
		scanned[ns] = true
		s.namespaces = append(s.namespaces, namespaceMounts{pid: pid, ns: ns, top: top})
		return true
	})
	if listErr != nil {
		s.err = fmt.Errorf("list processes: %w", listErr)
		return s
	}
	for ns, t := range c.nsTables {
		if !scanned[ns] {
			t.t.close()
			delete(c.nsTables, ns)
		}
	}
	s.err = errors.Join(errs...)
	return s
}

// namespaceTop returns the mounts nothing is stacked on in the mount namespace ns, whose process
// dir (/proc/PID) shows it, or nil when the process shows an empty table. The table stays open
// for the next search when it is the kernel's.
func (c *Checker) namespaceTop(ns, dir string) ([]*mountInfo, error) {
	if nt := c.nsTables[ns]; nt != nil {
		infos, fresh, err := nt.t.read()
		if err == nil && len(infos) > 0 {
			if fresh {
				nt.top = topMounts(infos)
			}
			return nt.top, nil
		}
		nt.t.close()
		delete(c.nsTables, ns)
	}
	file := filepath.Join(dir, "mountinfo")
	t, err := openPolledTable(file)
	if errors.Is(err, errNotPollable) {
		infos, err := readMountTable(file)
		if err != nil || len(infos) == 0 {
			return nil, err
		}
		return topMounts(infos), nil
	}
	if err != nil {
		return nil, err
	}
	// The process may have exited after its namespace was read, and its number gone to a
	// process of another namespace: the table would be filed under the wrong one.
	if again, err := os.Readlink(filepath.Join(dir, "ns", "mnt")); err != nil || again != ns {
		t.close()
		return nil, fs.ErrNotExist
	}
	infos, _, err := t.read()
	if err != nil || len(infos) == 0 {
		t.close()
		return nil, err
	}
	if c.nsTables == nil {
		c.nsTables = map[string]*nsTable{}
	}
	nt := &nsTable{t: t, top: topMounts(infos)}
	c.nsTables[ns] = nt
	return nt.top, nil
}

// closeNamespaceTables closes the mount tables of the other namespaces, which keep those
// namespaces alive and hold a descriptor each while open.
func (c *Checker) closeNamespaceTables() {
	c.nsMu.Lock()
	defer c.nsMu.Unlock()
	for ns, t := range c.nsTables {
		t.t.close()
		delete(c.nsTables, ns)
	}
}

// denied reports whether err says the checker may not read the process.
func denied(err error) bool {
	return errors.Is(err, fs.ErrPermission)
}

// vanished reports whether err says the process being read has exited.
func vanished(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH)
}

// onlyReasons reports whether every finding has one of reasons.
func onlyReasons(findings []Finding, reasons ...string) bool {
	for _, f := range findings {
		if !slices.Contains(reasons, f.Reason) {
			return false
		}
	}
	return true
}

// hasReason reports whether a finding has one of reasons.
func hasReason(findings []Finding, reasons ...string) bool {
	return slices.ContainsFunc(findings, func(f Finding) bool { return slices.Contains(reasons, f.Reason) })
}

// messages joins the findings' messages for an action or an error.
func messages(findings []Finding) string {
	msgs := make([]string, 0, len(findings))
	for _, f := range findings {
		msgs = append(msgs, f.Message)
	}
	return strings.Join(msgs, "; ")
}

// whyRestack says why a publish target gets the staging mount stacked on it.
func whyRestack(findings []Finding) string {
	if len(findings) == 0 {
		return "it showed another mount"
	}
	return messages(findings)
}
