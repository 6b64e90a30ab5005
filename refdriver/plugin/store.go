package plugin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/volume-healer/volume-healer/driverkit"
)

// volumeIDPattern is the shape of the IDs CreateVolume hands out. Any other ID is unknown,
// which also keeps IDs that could escape the state folder ("../x") away from the disk.
var volumeIDPattern = regexp.MustCompile(`^vol-[0-9a-f]{24}$`)

// volumeIDFor derives a volume's ID from its name, so that a retried CreateVolume finds the
// volume its first attempt created.
func volumeIDFor(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "vol-" + hex.EncodeToString(sum[:12])
}

// volumeMeta describes a volume created by CreateVolume: <state>/volumes/<id>.json, next to its
// backing folder <state>/volumes/<id>/.
type volumeMeta struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	CapacityBytes int64  `json:"capacityBytes"`
	// Parked is the staging of a volume that the control interface unstaged on purpose, kept
	// so that it can stage the volume again where it was.
	Parked *record `json:"parked,omitempty"`
}

// record is what the plugin knows of a volume staged on this node: <state>/staged/<id>.json.
type record struct {
	VolumeID      string            `json:"volumeId"`
	StagingPath   string            `json:"stagingPath"`
	VolumeContext map[string]string `json:"volumeContext,omitempty"`
	// FsName is the mount source the volume's mounter gives its mount.
	FsName         string   `json:"fsName"`
	PublishTargets []target `json:"publishTargets,omitempty"`
	// Mounter is the mounter the volume was staged with; "" (records of earlier versions) is
	// OwnMounter. A volume keeps its mounter until it is unstaged, whatever the plugin's
	// options say meanwhile: its mounts are that mounter's.
	Mounter Mounter `json:"mounter,omitempty"`
	// MounterPID is the mounter started last for the volume, by this run of the plugin or an
	// earlier one, or by the mount supervisor; 0 while none was started yet.
	MounterPID int `json:"mounterPid,omitempty"`
	// Supervised is set when the node's mount supervisor holds the volume's mount and runs its
	// mounter (Options.SupervisorSocket): the plugin never kills or unmounts it itself.
	Supervised bool `json:"supervised,omitempty"`
}

// target is one publish target of a staged volume.
type target struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

func (r *record) clone() *record {
	c := *r
	c.PublishTargets = slices.Clone(r.PublishTargets)
	c.VolumeContext = maps.Clone(r.VolumeContext)
	return &c
}

func (r *record) target(path string) (target, bool) {
	for _, t := range r.PublishTargets {
		if t.Path == path {
			return t, true
		}
	}
	return target{}, false
}

func (r *record) withoutTarget(path string) *record {
	c := r.clone()
	c.PublishTargets = slices.DeleteFunc(c.PublishTargets, func(t target) bool { return t.Path == path })
	return c
}

// mounter is the mounter the volume was staged with.
func (r *record) mounter() Mounter {
	if r.Mounter == "" {
		return OwnMounter
	}
	return r.Mounter
}

// expect is what the volume's healthy staging mount looks like.
func (r *record) expect() driverkit.Expect {
	return driverkit.Expect{Source: r.FsName, FSType: r.mounter().fsType()}
}

// kitVolume is the record as driverkit sees it.
func (r *record) kitVolume() driverkit.Volume {
	v := driverkit.Volume{
		ID:            r.VolumeID,
		StagingPath:   r.StagingPath,
		VolumeContext: r.clone().VolumeContext,
		Expect:        r.expect(),
		// A supervised volume's mounter runs in the mount supervisor, which holds its FUSE
		// connection: it lives through this plugin's restarts and its mounter's.
		Kept: r.Supervised,
	}
	for _, t := range r.PublishTargets {
		v.PublishTargets = append(v.PublishTargets, driverkit.PublishTarget{Path: t.Path, ReadOnly: t.ReadOnly})
	}
	return v
}

// store keeps the plugin's state in files. Every write replaces its file atomically (write, then
// rename), so that a plugin killed mid-write leaves the previous state.
type store struct {
	dir string
}

func (s store) volumesDir() string { return filepath.Join(s.dir, "volumes") }
func (s store) stagedDir() string  { return filepath.Join(s.dir, "staged") }
func (s store) nodesDir() string   { return filepath.Join(s.dir, "nodes") }

// attachmentsDir holds a folder per volume published to nodes by ControllerPublishVolume, with
// one file per node.
func (s store) attachmentsDir() string { return filepath.Join(s.dir, "attachments") }

func (s store) volumeAttachmentsDir(id string) string {
	return filepath.Join(s.attachmentsDir(), url.PathEscape(id))
}

func (s store) attachmentFile(volumeID, nodeID string) string {
	return filepath.Join(s.volumeAttachmentsDir(volumeID), url.PathEscape(nodeID)+".json")
}

func (s store) nodeFile(nodeID string) string {
	return filepath.Join(s.nodesDir(), url.PathEscape(nodeID)+".json")
}

// backing is the folder that holds a volume's data.
func (s store) backing(id string) string { return filepath.Join(s.volumesDir(), id) }

func (s store) metaFile(id string) string { return filepath.Join(s.volumesDir(), id+".json") }

func (s store) recordFile(id string) string {
	// PathEscape keeps "/" out of the name, whatever the ID.
	return filepath.Join(s.stagedDir(), url.PathEscape(id)+".json")
}

func (s store) init() error {
	for _, dir := range []string{s.volumesDir(), s.stagedDir(), s.nodesDir(), s.attachmentsDir()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("%w: create %s: %w", ErrState, dir, err)
		}
	}
	return nil
}

// meta reads a volume's description; found is false for a volume CreateVolume did not create
// (or DeleteVolume deleted).
func (s store) meta(id string) (m *volumeMeta, found bool, err error) {
	if !volumeIDPattern.MatchString(id) {
		return nil, false, nil
	}
	m = &volumeMeta{}
	found, err = readFile(s.metaFile(id), m)
	if !found || err != nil {
		return nil, found, err
	}
	return m, true, nil
}

func (s store) saveMeta(m *volumeMeta) error {
	return writeFile(s.metaFile(m.ID), m)
}

// deleteVolume removes the volume's data, then its description, so that a deletion cut short
// is finished by the next attempt.
func (s store) deleteVolume(id string) error {
	if err := os.RemoveAll(s.backing(id)); err != nil {
		return fmt.Errorf("%w: remove the data of volume %s: %w", ErrState, id, err)
	}
	if err := os.RemoveAll(s.volumeAttachmentsDir(id)); err != nil {
		return fmt.Errorf("%w: remove the attachments of volume %s: %w", ErrState, id, err)
	}
	if err := os.Remove(s.metaFile(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: remove volume %s: %w", ErrState, id, err)
	}
	return nil
}

// nodeRecord says that a plugin played a node on this state folder: ControllerPublishVolume
// publishes volumes to these nodes only.
type nodeRecord struct {
	NodeID string `json:"nodeId"`
}

// saveNode records that a plugin plays nodeID on this state folder.
func (s store) saveNode(nodeID string) error {
	return writeFile(s.nodeFile(nodeID), &nodeRecord{NodeID: nodeID})
}

// nodeKnown tells whether a plugin ever played nodeID on this state folder.
func (s store) nodeKnown(nodeID string) (bool, error) {
	return readFile(s.nodeFile(nodeID), &nodeRecord{})
}

// attachment is a volume published to a node by ControllerPublishVolume:
// <state>/attachments/<volume>/<node>.json.
type attachment struct {
	VolumeID   string                               `json:"volumeId"`
	NodeID     string                               `json:"nodeId"`
	ReadOnly   bool                                 `json:"readOnly,omitempty"`
	AccessMode csi.VolumeCapability_AccessMode_Mode `json:"accessMode"`
}

// attachments reads the nodes a volume is published to, sorted by node ID.
func (s store) attachments(volumeID string) ([]*attachment, error) {
	dir := s.volumeAttachmentsDir(volumeID)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrState, dir, err)
	}
	var out []*attachment
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		a := &attachment{}
		found, err := readFile(filepath.Join(dir, e.Name()), a)
		if err != nil {
			return nil, err
		}
		if found {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b *attachment) int { return strings.Compare(a.NodeID, b.NodeID) })
	return out, nil
}

func (s store) saveAttachment(a *attachment) error {
	if err := os.MkdirAll(s.volumeAttachmentsDir(a.VolumeID), 0o755); err != nil {
		return fmt.Errorf("%w: create %s: %w", ErrState, s.volumeAttachmentsDir(a.VolumeID), err)
	}
	return writeFile(s.attachmentFile(a.VolumeID, a.NodeID), a)
}

// removeAttachment forgets that the volume is published to the node; found is false when it
// was not.
func (s store) removeAttachment(volumeID, nodeID string) (found bool, err error) {
	err = os.Remove(s.attachmentFile(volumeID, nodeID))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%w: remove the attachment of volume %s to node %s: %w", ErrState, volumeID, nodeID, err)
	}
	// The volume's folder goes with its last attachment; one still in use stays.
	_ = os.Remove(s.volumeAttachmentsDir(volumeID))
	return true, nil
}

// readRecord reads one staging record from the disk, as a plugin sharing this state folder may
// have written it.
func (s store) readRecord(id string) (*record, bool, error) {
	r := &record{}
	found, err := readFile(s.recordFile(id), r)
	if !found || err != nil {
		return nil, false, err
	}
	return r, true, nil
}

// records reads every staging record.
func (s store) records() (map[string]*record, error) {
	entries, err := os.ReadDir(s.stagedDir())
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrState, s.stagedDir(), err)
	}
	out := make(map[string]*record, len(entries))
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(s.stagedDir(), e.Name())
		r := &record{}
		if _, err := readFile(path, r); err != nil {
			return nil, err
		}
		if r.VolumeID == "" || r.StagingPath == "" {
			return nil, fmt.Errorf("%w: %s has no volume ID or staging path", ErrState, path)
		}
		out[r.VolumeID] = r
	}
	return out, nil
}

func (s store) saveRecord(r *record) error {
	return writeFile(s.recordFile(r.VolumeID), r)
}

func (s store) removeRecord(id string) error {
	if err := os.Remove(s.recordFile(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: remove the record of volume %s: %w", ErrState, id, err)
	}
	return nil
}

func readFile(path string, into any) (found bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%w: read %s: %w", ErrState, path, err)
	}
	if err := json.Unmarshal(b, into); err != nil {
		return false, fmt.Errorf("%w: parse %s: %w", ErrState, path, err)
	}
	return true, nil
}

func writeFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("%w: encode %s: %w", ErrState, path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("%w: write %s: %w", ErrState, path, err)
	}
	_, werr := tmp.Write(append(b, '\n'))
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("%w: write %s: %w", ErrState, tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("%w: write %s: %w", ErrState, path, err)
	}
	return nil
}
