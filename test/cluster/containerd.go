package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// containerdConfig is containerd's configuration (version 3) for this node: its root, state and
// socket under the node's folder, overlayfs snapshots, runc through the v2 shim with cgroupfs, and
// the CRI plugin's CNI set-up. Two settings this machine kind needs: apparmor is off (no apparmor
// here), and restrict_oom_score_adj keeps runc from lowering a container's oom_score_adj below
// containerd's own, which this machine does not permit (every sandbox fails without it).
// The sandbox image is pinned, so that kubelet's image garbage collection leaves it alone.
func containerdConfig(d nodeDirs, runc, sandbox string) string {
	return fmt.Sprintf(`version = 3
root = %q
state = %q

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = %q
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
`, d.containerdRoot, d.containerdState, d.containerdSock, d.containerdSock+".ttrpc", sandbox, d.cniConf, runc)
}

// ctr runs containerd's client against the node's containerd, in the k8s.io namespace that
// kubelet's containers live in.
func (c *Cluster) ctr(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"--address", c.dirs.containerdSock, "--namespace", "k8s.io"}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(c.opts.NodeBin, "ctr"), full...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// waitContainerd waits until containerd answers on its socket.
func (c *Cluster) waitContainerd(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		if _, err := c.ctr(ctx, "version"); err == nil {
			return nil
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containerd did not answer on %s: %w (log: %s)", c.dirs.containerdSock, last, tail(c.logPath("containerd"), 20))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ImportImage loads img's OCI archive into the node's containerd, unpacked for its snapshotter,
// under the fully qualified name kubelet asks for (Ref): pods name it Repository:Tag with
// imagePullPolicy Never or IfNotPresent.
func (c *Cluster) ImportImage(ctx context.Context, img Image) error {
	if _, err := os.Stat(img.Archive); err != nil {
		return fmt.Errorf("image archive: %w", err)
	}
	if _, err := c.ctr(ctx, "images", "import", img.Archive); err != nil {
		return err
	}
	// The archive names the image as hack/images does (Repository:Tag); kubelet looks it up
	// normalized, with the registry and path a bare name stands for.
	if short := img.Repository + ":" + img.Tag; short != img.Ref {
		if _, err := c.ctr(ctx, "images", "tag", "--force", short, img.Ref); err != nil {
			return err
		}
	}
	return nil
}

// ImportImages imports each of imgs.
func (c *Cluster) ImportImages(ctx context.Context, imgs ...Image) error {
	for _, img := range imgs {
		if err := c.ImportImage(ctx, img); err != nil {
			return fmt.Errorf("import %s: %w", img.Ref, err)
		}
	}
	return nil
}
