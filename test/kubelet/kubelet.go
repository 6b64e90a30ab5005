package kubelet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// csiPluginName is the name of kubelet's CSI volume plugin, the folder of its staging paths and,
// escaped, of its publish paths.
const csiPluginName = "kubernetes.io/csi"

// DefaultCallTimeout bounds each CSI call when the caller's context has no deadline: kubelet's
// csiTimeout.
const DefaultCallTimeout = 2 * time.Minute

// Volume is a persistent volume as kubelet sees it when it stages and publishes it: the CSI
// source of the PV and the PV's access mode and mount options.
type Volume struct {
	// DriverName is spec.csi.driver. Required.
	DriverName string
	// Handle is spec.csi.volumeHandle, the CSI volume ID. Required.
	Handle string
	// PVName names the PV, the folder of its publish paths. Required to publish.
	PVName string
	// VolumeContext is spec.csi.volumeAttributes.
	VolumeContext map[string]string
	// PublishContext is what ControllerPublishVolume returned, from the VolumeAttachment.
	PublishContext map[string]string
	// StageSecrets and PublishSecrets are the contents of spec.csi.nodeStageSecretRef and
	// spec.csi.nodePublishSecretRef.
	StageSecrets, PublishSecrets map[string]string
	// ReadOnly is spec.csi.readOnly (or the pod's readOnly), sent in NodePublishVolume.
	ReadOnly bool
	// FSType is spec.csi.fsType.
	FSType string
	// MountFlags are spec.mountOptions.
	MountFlags []string
	// AccessMode is the CSI access mode kubelet maps the PV's first access mode to. Default:
	// SINGLE_NODE_WRITER, ReadWriteOnce's.
	AccessMode csi.VolumeCapability_AccessMode_Mode
}

// capability is the VolumeCapability kubelet sends for a filesystem volume, in
// csiDriverClient.NodeStageVolume and NodePublishVolume (pkg/volume/csi/csi_client.go).
func (v Volume) capability() *csi.VolumeCapability {
	mode := v.AccessMode
	if mode == csi.VolumeCapability_AccessMode_UNKNOWN {
		mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	}
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
			FsType:     v.FSType,
			MountFlags: v.MountFlags,
		}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func (v Volume) validate() error {
	if v.DriverName == "" || v.Handle == "" {
		return fmt.Errorf("volume %q of driver %q: both the driver name and the volume handle are required", v.Handle, v.DriverName)
	}
	return nil
}

// Kubelet stages and publishes volumes under its root folder as kubelet does under
// /var/lib/kubelet. Its methods may be called from any goroutine.
type Kubelet struct {
	root string
	// bindID is the mountinfo ID of the bind mount of root on itself that New made.
	bindID int

	closeOnce sync.Once
	closeErr  error
}

// New makes root a kubelet root folder: it creates root, bind-mounts it on itself and makes the
// bind recursively shared, so that mounts made below root reach every mount namespace that has a
// slave copy of it, as workloads with HostToContainer propagation have. Close undoes it.
//
// Kubelet does the same to its root folder at start (Kubelet.setupDataDirs calls
// HostUtil.MakeRShared, pkg/volume/util/hostutil DoMakeRShared), except that it skips the bind
// when the folder already sits on a shared mount; New always binds, so that Close has a mount of
// its own to remove and no mount of the host's is touched.
func New(root string) (*Kubelet, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("kubelet root %q: must be an absolute path", root)
	}
	if err := os.MkdirAll(root, 0o750); err != nil {
		return nil, fmt.Errorf("create kubelet root: %w", err)
	}
	// mountinfo shows resolved paths; compare with those.
	root, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, fmt.Errorf("kubelet root: %w", err)
	}
	if err := syscall.Mount(root, root, "", syscall.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind-mount kubelet root %s on itself: %w", root, err)
	}
	k := &Kubelet{root: root}
	if err := syscall.Mount("", root, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		_ = syscall.Unmount(root, syscall.MNT_DETACH)
		return nil, fmt.Errorf("make kubelet root %s rshared: %w", root, err)
	}
	top, err := topMount(root)
	if err != nil {
		_ = syscall.Unmount(root, syscall.MNT_DETACH)
		return nil, err
	}
	k.bindID = top.ID
	for _, dir := range []string{k.podsDir(), k.pluginsDir()} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			_ = k.Close()
			return nil, fmt.Errorf("kubelet root: %w", err)
		}
	}
	return k, nil
}

// Root returns the root folder, symbolic links resolved.
func (k *Kubelet) Root() string { return k.root }

func (k *Kubelet) podsDir() string    { return filepath.Join(k.root, "pods") }
func (k *Kubelet) pluginsDir() string { return filepath.Join(k.root, "plugins") }

// StagingPath returns the path kubelet gives NodeStageVolume for a filesystem volume of driver
// with the volume handle:
// <root>/plugins/kubernetes.io/csi/<driver>/<hex sha256 of handle>/globalmount.
//
// It copies makeDeviceMountPath in kubelet's pkg/volume/csi/csi_attacher.go (v1.37), with
// VolumeHost.GetPluginDir("kubernetes.io/csi") being <root>/plugins/kubernetes.io/csi.
func (k *Kubelet) StagingPath(driver, handle string) string {
	sum := sha256.Sum256([]byte(handle))
	return filepath.Join(k.pluginsDir(), csiPluginName, driver, hex.EncodeToString(sum[:]), "globalmount")
}

// PublishPath returns the path kubelet gives NodePublishVolume for the PV pvName in the pod with
// UID podUID: <root>/pods/<pod uid>/volumes/kubernetes.io~csi/<pv name>/mount.
//
// It copies csiMountMgr.GetPath and getTargetPath in kubelet's pkg/volume/csi/csi_mounter.go
// (v1.37): VolumeHost.GetPodVolumeDir with the plugin name and the PV name escaped by
// utilstrings.EscapeQualifiedName ("/" becomes "~"), then GetCSIMounterPath's "/mount".
func (k *Kubelet) PublishPath(podUID, pvName string) string {
	return filepath.Join(k.podsDir(), podUID, "volumes", escapeQualifiedName(csiPluginName), escapeQualifiedName(pvName), "mount")
}

// escapeQualifiedName is k8s.io/utils/strings.EscapeQualifiedName.
func escapeQualifiedName(in string) string {
	return strings.ReplaceAll(in, "/", "~")
}

// Stage stages v as kubelet's csiAttacher.MountDevice does (pkg/volume/csi/csi_attacher.go): it
// asks the driver for its Node capabilities, creates the staging path (the globalmount folder
// itself, mode 0750) and, if the driver has STAGE_UNSTAGE_VOLUME, calls NodeStageVolume with it.
// A driver without the capability is not called, and Stage returns nil.
func (k *Kubelet) Stage(ctx context.Context, conn grpc.ClientConnInterface, v Volume) error {
	if err := v.validate(); err != nil {
		return err
	}
	ctx, cancel := callContext(ctx)
	defer cancel()
	node := csi.NewNodeClient(conn)
	staged, err := supportsStageUnstage(ctx, node)
	if err != nil {
		return err
	}
	path := k.StagingPath(v.DriverName, v.Handle)
	if err := os.MkdirAll(path, 0o750); err != nil {
		return fmt.Errorf("stage volume %s: create staging path: %w", v.Handle, err)
	}
	if !staged {
		return nil
	}
	_, err = node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId:          v.Handle,
		PublishContext:    v.PublishContext,
		StagingTargetPath: path,
		VolumeCapability:  v.capability(),
		Secrets:           v.StageSecrets,
		VolumeContext:     v.VolumeContext,
	})
	if err != nil {
		return fmt.Errorf("NodeStageVolume %s at %s: %w", v.Handle, path, err)
	}
	return nil
}

// Unstage unstages v as kubelet's csiAttacher.UnmountDevice does: NodeUnstageVolume if the
// driver has STAGE_UNSTAGE_VOLUME, then removeMountDir: the staging path and its parent folder
// are removed unless something is still mounted there.
func (k *Kubelet) Unstage(ctx context.Context, conn grpc.ClientConnInterface, v Volume) error {
	if err := v.validate(); err != nil {
		return err
	}
	ctx, cancel := callContext(ctx)
	defer cancel()
	node := csi.NewNodeClient(conn)
	staged, err := supportsStageUnstage(ctx, node)
	if err != nil {
		return err
	}
	path := k.StagingPath(v.DriverName, v.Handle)
	if staged {
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.Handle, StagingTargetPath: path}); err != nil {
			return fmt.Errorf("NodeUnstageVolume %s at %s: %w", v.Handle, path, err)
		}
	}
	return removeMountDir(path)
}

// Publish publishes v for the pod with UID podUID as kubelet's csiMountMgr.SetUpAt does
// (pkg/volume/csi/csi_mounter.go): it creates the parent folder of the publish path (mode 0750),
// leaving the publish path itself to the driver as the CSI spec says, and calls
// NodePublishVolume with the staging path if the driver has STAGE_UNSTAGE_VOLUME. It returns the
// publish path.
func (k *Kubelet) Publish(ctx context.Context, conn grpc.ClientConnInterface, v Volume, podUID string) (string, error) {
	if err := v.validate(); err != nil {
		return "", err
	}
	if v.PVName == "" || podUID == "" {
		return "", fmt.Errorf("publish volume %s: both the PV name and the pod UID are required", v.Handle)
	}
	ctx, cancel := callContext(ctx)
	defer cancel()
	node := csi.NewNodeClient(conn)
	staged, err := supportsStageUnstage(ctx, node)
	if err != nil {
		return "", err
	}
	var staging string
	if staged {
		staging = k.StagingPath(v.DriverName, v.Handle)
	}
	target := k.PublishPath(podUID, v.PVName)
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return "", fmt.Errorf("publish volume %s: create the parent of the publish path: %w", v.Handle, err)
	}
	_, err = node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId:          v.Handle,
		PublishContext:    v.PublishContext,
		StagingTargetPath: staging,
		TargetPath:        target,
		VolumeCapability:  v.capability(),
		Readonly:          v.ReadOnly,
		Secrets:           v.PublishSecrets,
		VolumeContext:     v.VolumeContext,
	})
	if err != nil {
		return "", fmt.Errorf("NodePublishVolume %s at %s: %w", v.Handle, target, err)
	}
	return target, nil
}

// Unpublish unpublishes v from the pod with UID podUID as kubelet's csiMountMgr.TearDownAt does:
// NodeUnpublishVolume, then removeMountDir: the publish path and its parent folder are removed
// unless something is still mounted there.
func (k *Kubelet) Unpublish(ctx context.Context, conn grpc.ClientConnInterface, v Volume, podUID string) error {
	if err := v.validate(); err != nil {
		return err
	}
	ctx, cancel := callContext(ctx)
	defer cancel()
	target := k.PublishPath(podUID, v.PVName)
	if _, err := csi.NewNodeClient(conn).NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.Handle, TargetPath: target}); err != nil {
		return fmt.Errorf("NodeUnpublishVolume %s at %s: %w", v.Handle, target, err)
	}
	return removeMountDir(target)
}

// Close lazily unmounts every mount still below the root, deepest first and every layer of
// stacked mounts, then the bind of the root on itself that New made. The folders stay.
func (k *Kubelet) Close() error {
	k.closeOnce.Do(func() { k.closeErr = k.unmountAll() })
	return k.closeErr
}

func (k *Kubelet) unmountAll() error {
	// Each round unmounts every mount seen; a mount the kernel propagated in meanwhile, or one
	// that a failed unmount left, is seen by the next round.
	for range 10 {
		mounts, err := mountsUnder(k.root)
		if err != nil {
			return err
		}
		var left []*mountEntry
		for _, m := range mounts {
			if m.Mountpoint != k.root || m.ID != k.bindID {
				left = append(left, m)
			}
		}
		if len(left) == 0 {
			break
		}
		sortDeepestFirst(left)
		for _, m := range left {
			if err := unmount(m.Mountpoint); err != nil {
				return err
			}
		}
	}
	mounts, err := mountsUnder(k.root)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if m.ID != k.bindID {
			return fmt.Errorf("kubelet root %s: %s is still mounted after 10 rounds of unmounting", k.root, m.Mountpoint)
		}
	}
	if len(mounts) == 1 {
		return unmount(k.root)
	}
	return nil
}

// supportsStageUnstage is csiDriverClient.NodeSupportsStageUnstage.
func supportsStageUnstage(ctx context.Context, node csi.NodeClient) (bool, error) {
	resp, err := node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		return false, fmt.Errorf("NodeGetCapabilities: %w", err)
	}
	for _, c := range resp.GetCapabilities() {
		if c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME {
			return true, nil
		}
	}
	return false, nil
}

// removeMountDir is kubelet's removeMountDir (pkg/volume/csi/csi_mounter.go): unless dir is a
// mount point, remove it and its parent folder. This package writes no vol_data.json, so the
// parent is empty unless something else put files there, and is then left.
func removeMountDir(dir string) error {
	mounted, err := isMountPoint(dir)
	if err != nil || mounted {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if err := os.Remove(filepath.Dir(dir)); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return fmt.Errorf("remove %s: %w", filepath.Dir(dir), err)
	}
	return nil
}

func callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultCallTimeout)
}
