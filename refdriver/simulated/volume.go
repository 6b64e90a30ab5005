package simulated

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
	"github.com/volume-healer/volume-healer/refdriver/control"
)

// MounterKey is the volume context key that names the mounter of a volume, as Ceph CSI uses it.
// Whether a volume is healable depends on it (Options.HealMounters).
const MounterKey = "mounter"

// Volume is one simulated volume as the driver records it. It is stored as one JSON file per
// volume under the state folder and served as is by the control interface.
type Volume struct {
	// ID is the CSI volume ID (a PV's spec.csi.volumeHandle).
	ID string `json:"id"`
	// Condition is the simulated state of the mount. Probes report it as health() says:
	// gone as INACCESSIBLE (MountGone), readonly as DEGRADED (ReadOnlyMount), lost as
	// DATA_LOSS (DataLoss); a hung volume blocks every probe and heal for Hang first, then
	// reports INACCESSIBLE (MountHung). A heal repairs all but lost.
	Condition control.Condition `json:"condition"`
	// Hang is how long calls block while Condition is Hung.
	Hang sanity.Duration `json:"hang,omitempty"`
	// Staged tells whether the volume is staged on this node. Calls for a volume that is not
	// staged fail with FAILED_PRECONDITION, and ListStagedVolumes leaves it out.
	Staged bool `json:"staged"`
	// StagingTargetPath is where the volume is (pretended to be) staged: the kubelet layout
	// under Options.StagingRoot at the time the volume was added.
	StagingTargetPath string `json:"stagingTargetPath"`
	// PublishTargetPaths are where the volume is published for pods, when known.
	PublishTargetPaths []string `json:"publishTargetPaths,omitempty"`
	// VolumeContext is the volume context the volume was staged with; MounterKey names its
	// mounter.
	VolumeContext map[string]string `json:"volumeContext,omitempty"`
	// RecheckAfter, when positive, is returned as recheck_after by probes and heals.
	RecheckAfter sanity.Duration `json:"recheckAfter,omitempty"`
}

func (v *Volume) clone() Volume {
	c := *v
	c.PublishTargetPaths = slices.Clone(v.PublishTargetPaths)
	c.VolumeContext = maps.Clone(v.VolumeContext)
	return c
}

// VolumeSpec describes a volume to add.
type VolumeSpec struct {
	// ID is the CSI volume ID. Required.
	ID string `json:"id"`
	// Mounter is stored in the volume context under MounterKey; it decides whether the volume is
	// healable. Default: "rbd-nbd". Use for example "krbd" for a volume the driver cannot heal.
	Mounter string `json:"mounter,omitempty"`
	// NotStaged adds the volume without staging it on this node. Default: staged.
	NotStaged bool `json:"notStaged,omitempty"`
	// VolumeContext is merged into the volume's context (MounterKey comes from Mounter).
	VolumeContext map[string]string `json:"volumeContext,omitempty"`
	// PublishTargetPaths are reported by ListStagedVolumes.
	PublishTargetPaths []string `json:"publishTargetPaths,omitempty"`
}

// store keeps one JSON file per volume in dir. Each write replaces the file atomically (write
// then rename), so a driver killed mid-write keeps the previous state.
type store struct {
	dir string
}

func (s store) fileName(id string) string {
	// PathEscape keeps "/" out of the name; volume IDs are free-form strings.
	return filepath.Join(s.dir, url.PathEscape(id)+".json")
}

// load reads every volume file. fresh is true when the folder did not exist yet.
func (s store) load() (vols map[string]*Volume, fresh bool, err error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			return nil, false, fmt.Errorf("%w: create %s: %w", ErrState, s.dir, err)
		}
		return map[string]*Volume{}, true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("%w: read %s: %w", ErrState, s.dir, err)
	}
	vols = make(map[string]*Volume, len(entries))
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(s.dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, false, fmt.Errorf("%w: read %s: %w", ErrState, path, err)
		}
		var v Volume
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, false, fmt.Errorf("%w: parse %s: %w", ErrState, path, err)
		}
		if v.ID == "" {
			return nil, false, fmt.Errorf("%w: %s has no volume id", ErrState, path)
		}
		if _, err := control.ParseCondition(string(v.Condition)); err != nil {
			return nil, false, fmt.Errorf("%w: %s: %w", ErrState, path, err)
		}
		vols[v.ID] = &v
	}
	return vols, false, nil
}

func (s store) save(v *Volume) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("%w: encode volume %s: %w", ErrState, v.ID, err)
	}
	path := s.fileName(v.ID)
	tmp, err := os.CreateTemp(s.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("%w: write volume %s: %w", ErrState, v.ID, err)
	}
	_, werr := tmp.Write(append(b, '\n'))
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("%w: write %s: %w", ErrState, tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("%w: write %s: %w", ErrState, path, err)
	}
	return nil
}

func (s store) remove(id string) error {
	if err := os.Remove(s.fileName(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: remove volume %s: %w", ErrState, id, err)
	}
	return nil
}
