package nodeprobe

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/driverkit"
)

// hungStatus is the status of a mount that does not answer, as driverkit reports it.
const hungStatus = csi.VolumeHealthErrorType_INACCESSIBLE

// Options configure a Prober. Zero values take the defaults documented on each field.
type Options struct {
	// KubeletDir is kubelet's root folder as this process sees it. Required.
	KubeletDir string
	// MountInfo is the mount table read. Default: /proc/self/mountinfo.
	MountInfo string
	// Stat configures the stats of mounts.
	Stat StatterOptions
}

// Prober probes volumes on the node it runs on. It is safe for concurrent use.
type Prober struct {
	records   Records
	mountInfo string
	statter   *Statter
}

// New returns a Prober.
func New(opts Options) *Prober {
	if opts.MountInfo == "" {
		opts.MountInfo = "/proc/self/mountinfo"
	}
	return &Prober{records: Records{KubeletDir: opts.KubeletDir}, mountInfo: opts.MountInfo, statter: NewStatter(opts.Stat)}
}

// Request names the volume to probe.
type Request struct {
	// Driver is the CSI driver's name.
	Driver string
	// Handle is the CSI volume handle.
	Handle string
	// PV is the PersistentVolume's name, the volume's folder name in pods' records.
	PV string
	// ReadOnly says the volume is published read-only (a read-only PV, or ReadOnlyMany): a
	// read-only mount is then what is expected.
	ReadOnly bool
	// Block says the volume is a raw block volume (volumeMode Block): its publish targets are
	// devices, read rather than stat'ed (ProbeBlock).
	Block bool
}

// Probe examines the volume: the findings are its adverse conditions (none: healthy), about the
// staging path and publish targets of vol, what kubelet records of it. It fails with
// ErrNotOnNode when kubelet records no mount of the volume, with ErrBadRecord when a record it
// needs cannot be read, and when the mount table cannot be read.
func (p *Prober) Probe(ctx context.Context, req Request) (vol *Volume, findings []driverkit.Finding, err error) {
	if req.Block {
		return p.ProbeBlock(ctx, req)
	}
	vol, err = p.records.Find(req.Driver, req.Handle, req.PV)
	if err != nil {
		return nil, nil, err
	}
	infos, err := driverkit.ReadMountTable(p.mountInfo)
	if err != nil {
		return vol, nil, fmt.Errorf("read the mount table %s: %w", p.mountInfo, err)
	}
	paths := append([]string{}, vol.Targets...)
	if vol.StagingPath != "" {
		paths = append(paths, vol.StagingPath)
	}
	tops := make(map[string]*driverkit.MountInfo, len(paths))
	for _, path := range paths {
		tops[path] = driverkit.TopMount(infos, path)
	}
	stats := p.statDevices(ctx, tops)

	stagingAnswers := false
	if vol.StagingPath != "" {
		top := tops[vol.StagingPath]
		switch {
		case top == nil:
			findings = append(findings, driverkit.Finding{Path: vol.StagingPath, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: driverkit.ReasonMountGone,
				Message: fmt.Sprintf("kubelet staged the volume at %s, but nothing is mounted there", vol.StagingPath)})
		default:
			findings = p.mountFindings(findings, vol.StagingPath, top, stats[driverkit.MountDevice(top)], req.ReadOnly)
			stagingAnswers = stats[driverkit.MountDevice(top)].finding == nil && stats[driverkit.MountDevice(top)].err == nil
		}
	}
	for _, target := range vol.Targets {
		top := tops[target]
		if top == nil {
			findings = append(findings, notMounted(target))
			continue
		}
		st := stats[driverkit.MountDevice(top)]
		if f := st.finding; f != nil && f.Reason == driverkit.ReasonMountDisconnected && stagingAnswers {
			findings = append(findings, driverkit.Finding{Path: target, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: driverkit.ReasonStaleMountInPods,
				Message: fmt.Sprintf("%s still holds a dead mount (%s) while the staging path %s answers: the pods of this target see the dead mount", target, f.Message, vol.StagingPath)})
			continue
		}
		findings = p.mountFindings(findings, target, top, st, req.ReadOnly)
	}
	return vol, findings, nil
}

// ProbeBlock examines a raw block volume: each publish target that kubelet records, one device
// per pod, must still be there and be a block device whose first page reads within the stat
// timeout (Statter.ReadBlock). Its staging folder is the driver's own, in a form only the driver
// knows, and is not examined. It fails with ErrNotOnNode when kubelet keeps no record of the
// volume, with ErrBadRecord when its record cannot be read, and with ErrNotProbed when kubelet
// published it for no pod: nothing then shows whether the device works.
func (p *Prober) ProbeBlock(ctx context.Context, req Request) (*Volume, []driverkit.Finding, error) {
	vol, err := p.records.FindBlock(req.Driver, req.Handle, req.PV)
	if err != nil {
		return nil, nil, err
	}
	if len(vol.Targets) == 0 {
		return vol, nil, fmt.Errorf("%w: raw block volume %q of PersistentVolume %q is staged on this node but published for no pod; the sidecar reads a block volume's device where kubelet published it, and its staging folder is the driver's own",
			ErrNotProbed, req.Handle, req.PV)
	}
	findings := make([]*driverkit.Finding, len(vol.Targets))
	var wg sync.WaitGroup
	for i, target := range vol.Targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
				findings[i] = &driverkit.Finding{Path: target, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: driverkit.ReasonMountGone,
					Message: fmt.Sprintf("kubelet published the block volume at %s, which no longer exists", target)}
				return
			}
			f, err := p.statter.ReadBlock(ctx, target)
			if err != nil {
				f = &driverkit.Finding{Path: target, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: driverkit.ReasonMountCheckFailed,
					Message: fmt.Sprintf("cannot check the block device at %s: %v", target, err)}
			}
			findings[i] = f
		}()
	}
	wg.Wait()
	var out []driverkit.Finding
	for _, f := range findings {
		if f != nil {
			out = append(out, *f)
		}
	}
	return vol, out, nil
}

// notMounted is the finding of a publish target that kubelet records but that is no mount.
func notMounted(target string) driverkit.Finding {
	_, err := os.Lstat(target)
	if errors.Is(err, fs.ErrNotExist) {
		return driverkit.Finding{Path: target, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: driverkit.ReasonMountGone,
			Message: fmt.Sprintf("kubelet published the volume at %s, which no longer exists", target)}
	}
	return driverkit.Finding{Path: target, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: healerv1alpha1.ReasonPublishTargetNotMounted,
		Message: fmt.Sprintf("kubelet still has the volume published at %s, but nothing is mounted there: pods whose mount propagation is HostToContainer write to the node's own disk there", target)}
}

// mountFindings adds the findings of the mount top at path, whose stat gave st.
func (p *Prober) mountFindings(findings []driverkit.Finding, path string, top *driverkit.MountInfo, st statResult, readOnly bool) []driverkit.Finding {
	switch {
	case st.err != nil:
		return append(findings, driverkit.Finding{Path: path, Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: driverkit.ReasonMountCheckFailed,
			Message: fmt.Sprintf("cannot check %s: %v", path, st.err)})
	case st.finding != nil:
		f := *st.finding
		f.Path = path
		if f.Reason == driverkit.ReasonMountHung || f.Reason == driverkit.ReasonMountDisconnected {
			// One stat answers for every path of the same mount; the message names the path stat'ed.
			f.Message = fmt.Sprintf("%s: %s", path, f.Message)
		}
		return append(findings, f)
	}
	if driverkit.ReadOnlyMount(top) && !readOnly {
		findings = append(findings, driverkit.Finding{Path: path, Status: csi.VolumeHealthErrorType_DEGRADED, Reason: driverkit.ReasonReadOnlyMount,
			Message: fmt.Sprintf("%s is mounted read-only, but the volume is meant to be read-write", path)})
	}
	return findings
}

// statResult is what the stat of one mount gave.
type statResult struct {
	finding *driverkit.Finding
	err     error
}

// statDevices stats each mount of tops once, all at once: paths of one mount (a staging path and
// the bind mounts of its targets) share its device, and its answer.
func (p *Prober) statDevices(ctx context.Context, tops map[string]*driverkit.MountInfo) map[string]statResult {
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[string]statResult{}
	for path, top := range tops {
		if top == nil {
			continue
		}
		dev := driverkit.MountDevice(top)
		mu.Lock()
		_, seen := out[dev]
		if !seen {
			out[dev] = statResult{}
		}
		mu.Unlock()
		if seen {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := p.statter.Stat(ctx, path)
			mu.Lock()
			out[dev] = statResult{finding: f, err: err}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// Records returns the reader of kubelet's records the Prober uses.
func (p *Prober) Records() Records { return p.records }

// List returns the persistent volumes of driver that kubelet records on the node; see
// Records.List.
func (p *Prober) List(driver string) ([]Volume, error) {
	return p.records.List(driver)
}
