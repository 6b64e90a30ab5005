package nodeprobe

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// kubelet's layout of CSI volumes under its root folder (pkg/volume/csi of kubelet v1.37):
//
//	plugins/kubernetes.io/csi/<driver>/<hex sha256 of the volume handle>/globalmount   staging path
//	plugins/kubernetes.io/csi/<driver>/<hex sha256 of the volume handle>/vol_data.json
//	pods/<pod UID>/volumes/kubernetes.io~csi/<volume name>/mount                        publish target
//	pods/<pod UID>/volumes/kubernetes.io~csi/<volume name>/vol_data.json
//	pods/<pod UID>/volume-subpaths/<pod's volume name>/<container>/<mount index>      subPath bind mounts
//
// The volume name of a PersistentVolume is the PV's name. vol_data.json is a JSON object of
// strings that kubelet writes before it calls NodeStageVolume or NodePublishVolume and removes
// after the matching unstage or unpublish.
//
// A raw block volume (volumeMode Block) has a layout of its own, by PersistentVolume name alone
// (pkg/volume/csi/csi_block.go and csi_util.go of kubelet v1.37):
//
//	plugins/kubernetes.io/csi/volumeDevices/<pv>/data/vol_data.json    the volume's record
//	plugins/kubernetes.io/csi/volumeDevices/staging/<pv>               staging path (a folder the driver uses)
//	plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod UID>     publish target: the device, one per pod
//	plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod UID>         kubelet's own bind mount of the device
const (
	csiPluginDir  = "plugins/kubernetes.io/csi"
	podsDir       = "pods"
	podVolumesDir = "volumes/kubernetes.io~csi"
	podSubpathDir = "volume-subpaths"
	volDataFile   = "vol_data.json"
	globalMount   = "globalmount"
	publishMount  = "mount"

	blockDir        = "volumeDevices"
	blockDataDir    = "data"
	blockStagingDir = "staging"
	blockPublishDir = "publish"
)

// The keys of vol_data.json this package reads.
const (
	keyVolumeHandle  = "volumeHandle"
	keyDriverName    = "driverName"
	keySpecVolID     = "specVolID"
	keyLifecycleMode = "volumeLifecycleMode"
)

// Volume is what kubelet's records on the node say of one CSI volume of one driver.
type Volume struct {
	// Driver is the CSI driver's name.
	Driver string
	// Handle is the CSI volume handle.
	Handle string
	// PV is the PersistentVolume's name, where a record names it ("" otherwise).
	PV string
	// StagingPath is the path kubelet staged the volume at, "" when kubelet keeps no staging
	// record of it (a driver without STAGE_UNSTAGE_VOLUME, or not staged).
	StagingPath string
	// Targets are the paths kubelet published the volume at, one per pod, sorted: for a raw
	// block volume, the device files the driver placed there.
	Targets []string
	// Block is a raw block volume (volumeMode Block), recorded in kubelet's volumeDevices layout.
	Block bool
}

// Records reads kubelet's records of CSI volumes under its root folder. The zero value is not
// usable: set KubeletDir.
type Records struct {
	// KubeletDir is kubelet's root folder as this process sees it, such as /var/lib/kubelet.
	KubeletDir string
	// Pods, when set, is where Find looks up which pods a volume is published for, instead of
	// reading the pods folder at each call; it must read the same KubeletDir.
	Pods *PodVolumes
}

// StagingDir returns the folder of a volume's staging record: its staging path is the
// globalmount folder in it.
func (r Records) StagingDir(driver, handle string) string {
	sum := sha256.Sum256([]byte(handle))
	return filepath.Join(r.KubeletDir, csiPluginDir, driver, hex.EncodeToString(sum[:]))
}

// PublishTarget returns the path kubelet publishes the PersistentVolume pv at for the pod with
// UID podUID, and gives the pod's containers as the host path of their mount of it.
func (r Records) PublishTarget(podUID, pv string) string {
	return filepath.Join(r.KubeletDir, podsDir, podUID, podVolumesDir, pv, publishMount)
}

// SubpathDir returns the folder under which kubelet bind-mounts the subPaths of the volumes of the
// pod with UID podUID, one folder per volume of the pod named by the pod's name for it (not by
// the PersistentVolume), before it gives them to the containers.
func (r Records) SubpathDir(podUID string) string {
	return filepath.Join(r.KubeletDir, podsDir, podUID, podSubpathDir)
}

// Find returns what kubelet records of the volume handle of driver, published under the volume
// name pv (a PersistentVolume's name). It fails with ErrNotOnNode when kubelet records neither a
// staging path nor a publish target of it, and with ErrBadRecord, naming the file, when a record
// it needs is missing or unreadable.
func (r Records) Find(driver, handle, pv string) (*Volume, error) {
	if driver == "" || handle == "" || pv == "" || strings.ContainsRune(pv, '/') || pv == "." || pv == ".." {
		return nil, fmt.Errorf("%w: driver %q, volume handle %q, PersistentVolume %q", ErrInvalidVolume, driver, handle, pv)
	}
	v := &Volume{Driver: driver, Handle: handle}
	dir := r.StagingDir(driver, handle)
	staged, err := r.stagingRecord(dir, driver, handle)
	if err != nil {
		return nil, err
	}
	if staged != nil {
		v.StagingPath, v.PV = staged.StagingPath, staged.PV
	}
	dirs, err := r.publishDirs(pv)
	if err != nil {
		return nil, err
	}
	for _, d := range dirs {
		data, err := readVolData(d, true)
		if err != nil {
			return nil, err
		}
		if data == nil || data[keyDriverName] != driver || data[keyVolumeHandle] != handle {
			continue
		}
		v.Targets = append(v.Targets, filepath.Join(d, publishMount))
		v.PV = pv
	}
	if v.StagingPath == "" && len(v.Targets) == 0 {
		return nil, fmt.Errorf("%w: kubelet in %s records neither a staging path (%s) nor a publish target of volume %q of driver %q for PersistentVolume %q",
			ErrNotOnNode, r.KubeletDir, filepath.Join(dir, globalMount), handle, driver, pv)
	}
	slices.Sort(v.Targets)
	return v, nil
}

// publishDirs returns the folders of the volume named pv in the pods' CSI volume folders: from
// r.Pods when set, else from a read of every pod's folder now.
func (r Records) publishDirs(pv string) ([]string, error) {
	if r.Pods != nil {
		return r.Pods.dirs(pv)
	}
	return filepath.Glob(filepath.Join(r.KubeletDir, podsDir, "*", podVolumesDir, pv))
}

// FindBlock returns what kubelet records of the raw block volume pv (a PersistentVolume's name),
// volume handle handle of driver: its staging path, when kubelet made one, and its publish
// targets, one device per pod. It fails with ErrNotOnNode when kubelet keeps no record of the
// volume, and with ErrBadRecord, naming the file, when the record is unreadable, names another
// driver or volume handle, or is missing while kubelet has the volume published.
func (r Records) FindBlock(driver, handle, pv string) (*Volume, error) {
	if driver == "" || handle == "" || pv == "" || strings.ContainsRune(pv, '/') || pv == "." || pv == ".." ||
		pv == blockStagingDir || pv == blockPublishDir {
		return nil, fmt.Errorf("%w: driver %q, volume handle %q, PersistentVolume %q", ErrInvalidVolume, driver, handle, pv)
	}
	base := filepath.Join(r.KubeletDir, csiPluginDir, blockDir)
	targets, err := blockTargets(filepath.Join(base, blockPublishDir, pv))
	if err != nil {
		return nil, err
	}
	record := filepath.Join(base, pv, blockDataDir)
	data, err := readVolData(record, false)
	switch {
	case err != nil:
		return nil, err
	case data == nil && len(targets) > 0:
		return nil, fmt.Errorf("%w: %s is missing: kubelet keeps it while it has the block volume published, and %s is there",
			ErrBadRecord, filepath.Join(record, volDataFile), targets[0])
	case data == nil:
		return nil, fmt.Errorf("%w: kubelet in %s keeps no record (%s) of block volume %q of driver %q for PersistentVolume %q",
			ErrNotOnNode, r.KubeletDir, filepath.Join(record, volDataFile), handle, driver, pv)
	case data[keyDriverName] != driver || data[keyVolumeHandle] != handle:
		return nil, fmt.Errorf("%w: %s names driver %q and volume handle %q, not driver %q and volume handle %q of PersistentVolume %q",
			ErrBadRecord, filepath.Join(record, volDataFile), data[keyDriverName], data[keyVolumeHandle], driver, handle, pv)
	}
	v := &Volume{Driver: driver, Handle: handle, PV: pv, Targets: targets, Block: true}
	if hasEntry(filepath.Join(base, blockStagingDir), pv) {
		v.StagingPath = filepath.Join(base, blockStagingDir, pv)
	}
	return v, nil
}

// blockTargets lists the publish targets in a block volume's publish folder dir, one per pod,
// sorted; none when dir does not exist.
func blockTargets(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read kubelet's publish folder of a block volume: %w", ErrBadRecord, err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, filepath.Join(dir, e.Name()))
	}
	return out, nil
}

// listBlock adds the raw block volumes of driver that kubelet records to byHandle (through get),
// and returns the records it could not read.
func (r Records) listBlock(driver string, get func(handle string) *Volume) []error {
	base := filepath.Join(r.KubeletDir, csiPluginDir, blockDir)
	entries, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return []error{fmt.Errorf("%w: read kubelet's block volume records: %w", ErrBadRecord, err)}
	}
	var bad []error
	for _, e := range entries {
		pv := e.Name()
		if !e.IsDir() || pv == blockStagingDir || pv == blockPublishDir {
			continue
		}
		data, err := readVolData(filepath.Join(base, pv, blockDataDir), false)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		if data == nil || data[keyDriverName] != driver {
			continue
		}
		found, err := r.FindBlock(driver, data[keyVolumeHandle], pv)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		v := get(found.Handle)
		v.PV, v.Block, v.StagingPath = pv, true, found.StagingPath
		v.Targets = append(v.Targets, found.Targets...)
	}
	return bad
}

// stagingRecord reads the staging record in dir: nil when kubelet keeps none there.
func (r Records) stagingRecord(dir, driver, handle string) (*Volume, error) {
	data, err := readVolData(dir, false)
	if err != nil {
		return nil, err
	}
	if data == nil {
		// kubelet never leaves globalmount without its record.
		if hasEntry(dir, globalMount) {
			return nil, fmt.Errorf("%w: %s is missing: kubelet keeps it beside every staging path it uses, and %s is there without it",
				ErrBadRecord, filepath.Join(dir, volDataFile), filepath.Join(dir, globalMount))
		}
		return nil, nil
	}
	if data[keyDriverName] != driver || data[keyVolumeHandle] != handle {
		return nil, fmt.Errorf("%w: %s names driver %q and volume handle %q, but its folder is that of driver %q and volume handle %q",
			ErrBadRecord, filepath.Join(dir, volDataFile), data[keyDriverName], data[keyVolumeHandle], driver, handle)
	}
	return &Volume{Driver: driver, Handle: handle, PV: data[keySpecVolID], StagingPath: filepath.Join(dir, globalMount)}, nil
}

// stagingRecordIn reads the staging record in dir, a folder of driver's staging records whose
// volume handle is known from the record alone.
func (r Records) stagingRecordIn(dir, driver string) (*Volume, error) {
	data, err := readVolData(dir, false)
	if err != nil || data == nil {
		if err == nil {
			return r.stagingRecord(dir, driver, "")
		}
		return nil, err
	}
	if handle := data[keyVolumeHandle]; filepath.Base(r.StagingDir(driver, handle)) != filepath.Base(dir) {
		return nil, fmt.Errorf("%w: %s names volume handle %q, whose staging folder would be %s, not %s",
			ErrBadRecord, filepath.Join(dir, volDataFile), handle, filepath.Base(r.StagingDir(driver, handle)), filepath.Base(dir))
	}
	return r.stagingRecord(dir, driver, data[keyVolumeHandle])
}

// List returns every persistent volume of driver that kubelet records on the node, staged or
// published, filesystem and raw block volumes, sorted by volume handle. A record it cannot read
// does not hide the others: it is returned in the error (ErrBadRecord, naming the file) beside the
// volumes that could be read.
func (r Records) List(driver string) ([]Volume, error) {
	if driver == "" || strings.ContainsRune(driver, '/') {
		return nil, fmt.Errorf("%w: driver %q", ErrInvalidVolume, driver)
	}
	var bad []error
	byHandle := map[string]*Volume{}
	get := func(handle string) *Volume {
		if v := byHandle[handle]; v != nil {
			return v
		}
		v := &Volume{Driver: driver, Handle: handle}
		byHandle[handle] = v
		return v
	}
	staging, err := os.ReadDir(filepath.Join(r.KubeletDir, csiPluginDir, driver))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: read kubelet's staging records: %w", ErrBadRecord, err)
	}
	for _, e := range staging {
		dir := filepath.Join(r.KubeletDir, csiPluginDir, driver, e.Name())
		if !e.IsDir() {
			continue
		}
		rec, err := r.stagingRecordIn(dir, driver)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		if rec == nil {
			continue
		}
		v := get(rec.Handle)
		v.StagingPath = rec.StagingPath
		if v.PV == "" {
			v.PV = rec.PV
		}
	}
	records, err := filepath.Glob(filepath.Join(r.KubeletDir, podsDir, "*", podVolumesDir, "*"))
	if err != nil {
		return nil, err
	}
	for _, dir := range records {
		data, err := readVolData(dir, true)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		if data == nil || data[keyDriverName] != driver || data[keyVolumeHandle] == "" {
			continue
		}
		if mode := data[keyLifecycleMode]; mode != "" && mode != "Persistent" {
			// An inline ephemeral volume lives and dies with its pod; it has no PV.
			continue
		}
		v := get(data[keyVolumeHandle])
		v.Targets = append(v.Targets, filepath.Join(dir, publishMount))
		v.PV = filepath.Base(dir)
	}
	bad = append(bad, r.listBlock(driver, get)...)
	out := make([]Volume, 0, len(byHandle))
	for _, v := range byHandle {
		slices.Sort(v.Targets)
		out = append(out, *v)
	}
	slices.SortFunc(out, func(a, b Volume) int { return strings.Compare(a.Handle, b.Handle) })
	return out, errors.Join(bad...)
}

// hasEntry tells whether the folder dir holds an entry named name. It reads dir's names alone and
// never looks at the entry itself: the entry may be a mount whose mounter is frozen, where even
// an lstat(2) waits for the mounter (the kernel asks a FUSE daemon for the attributes of its
// root), and this runs in the sidecar's own goroutines.
func hasEntry(dir, name string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return slices.Contains(names, name)
}

// readVolData reads dir/vol_data.json: nil when it does not exist (and, with publish set, when
// dir holds no mount folder either: a folder kubelet is done with). A publish folder whose
// mount folder is there without its vol_data.json, and a file that is not a JSON object of
// strings, are ErrBadRecord, naming the file.
func readVolData(dir string, publish bool) (map[string]string, error) {
	file := filepath.Join(dir, volDataFile)
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		if publish {
			if hasEntry(dir, publishMount) {
				return nil, fmt.Errorf("%w: %s is missing: kubelet keeps it beside every publish target it uses, and %s is there without it",
					ErrBadRecord, file, filepath.Join(dir, publishMount))
			}
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRecord, err)
	}
	var data map[string]string
	if err := json.Unmarshal(b, &data); err != nil {
		return nil, fmt.Errorf("%w: %s is not kubelet's volume data (a JSON object of strings): %w", ErrBadRecord, file, err)
	}
	if data[keyVolumeHandle] == "" || data[keyDriverName] == "" {
		return nil, fmt.Errorf("%w: %s names no %s or no %s", ErrBadRecord, file, keyVolumeHandle, keyDriverName)
	}
	return data, nil
}
