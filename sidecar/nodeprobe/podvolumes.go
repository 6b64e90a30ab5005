package nodeprobe

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// PodVolumes says which pods kubelet records a CSI volume published for, by the volume's name
// (a PersistentVolume's name), from one read of the pods folder and of each pod's CSI volumes
// folder that it keeps for MaxAge. Find with a Records whose Pods is set looks there instead of
// reading the whole pods folder and looking into every pod at each call, so that a sweep's
// probes of a node's volumes, tens a second, read the folders about once per MaxAge. It only
// narrows where Find looks: each publish record Find returns is still read from its file at the
// call, so a pod gone since the read is not returned, and a pod published since is found once the
// read is MaxAge old. The zero value is not usable: use NewPodVolumes.
type PodVolumes struct {
	kubeletDir string
	maxAge     time.Duration
	now        func() time.Time

	mu     sync.Mutex
	readAt time.Time
	byName map[string][]string
	err    error
}

// NewPodVolumes returns the pods' CSI volume folders under kubeletDir, read again when a lookup
// finds them older than maxAge. now is the clock (time.Now when nil).
func NewPodVolumes(kubeletDir string, maxAge time.Duration, now func() time.Time) *PodVolumes {
	if now == nil {
		now = time.Now
	}
	return &PodVolumes{kubeletDir: kubeletDir, maxAge: maxAge, now: now}
}

// dirs returns the folders of the volume named name in the pods' CSI volume folders (one per
// pod that kubelet published it for, as read at most maxAge ago).
func (p *PodVolumes) dirs(name string) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now := p.now(); p.byName == nil || now.Sub(p.readAt) >= p.maxAge {
		p.byName, p.err = readPodVolumes(p.kubeletDir)
		p.readAt = now
	}
	return p.byName[name], p.err
}

// readPodVolumes reads pods/<pod UID>/volumes/kubernetes.io~csi/<volume name> under kubeletDir:
// the folders of each volume name, in the order of the pods folder. A pod without CSI volumes, or
// gone while it is read, has none.
func readPodVolumes(kubeletDir string) (map[string][]string, error) {
	root := filepath.Join(kubeletDir, podsDir)
	pods, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string][]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read kubelet's pods folder: %w", ErrBadRecord, err)
	}
	out := map[string][]string{}
	for _, pod := range pods {
		if !pod.IsDir() {
			continue
		}
		dir := filepath.Join(root, pod.Name(), podVolumesDir)
		vols, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: read %s: %w", ErrBadRecord, dir, err)
		}
		for _, v := range vols {
			out[v.Name()] = append(out[v.Name()], filepath.Join(dir, v.Name()))
		}
	}
	return out, nil
}
