package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/prometheus/procfs"

	"github.com/volume-healer/volume-healer/test/harness"
)

// Stop stops every component and removes what the node left on the machine: the pods'
// processes and cgroups, every mount under kubelet's root, containerd's folders and the pods'
// network namespaces, the bridge, kube-proxy's iptables chains; it writes back the sysctls the
// components changed, then removes Dir but its logs. It returns what it could not undo.
func (c *Cluster) Stop() error {
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// kubelet first, so that it restarts no container; the control plane last, so that the
	// others shut down cleanly.
	for _, name := range []string{"kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager"} {
		note(c.stopProcess(name))
	}
	note(killCgroups("kubepods"))
	note(c.killShims())
	note(c.stopProcess("containerd"))
	note(c.stopProcess("kube-apiserver"))
	note(c.stopProcess("etcd"))
	c.procs.KillAll()
	note(harness.KillProcessesUnder(c.dirs.root))

	note(c.cleanupIPTables())
	note(unmountUnder(c.mountRoots()...))
	note(removeCgroups("kubepods"))
	if c.made.bridge && linkExists(bridgeName) {
		note(ipCmd("link", "del", bridgeName))
	}
	note(restoreSysctls(c.sysctls))
	if c.made.runNetns {
		note(os.RemoveAll("/run/netns"))
	} else {
		note(removeGlob("/run/netns/cni-*"))
	}
	if c.made.runContainerd {
		note(os.RemoveAll("/run/containerd"))
	}
	if c.made.kubeletRoot {
		note(os.RemoveAll(KubeletRootDir))
	}
	// Everything in Dir but the logs.
	if entries, err := os.ReadDir(c.dirs.root); err == nil {
		for _, e := range entries {
			if e.Name() != "logs" {
				note(os.RemoveAll(filepath.Join(c.dirs.root, e.Name())))
			}
		}
	}
	if err := c.Leftovers(); err != nil {
		note(err)
	}
	if c.lock != nil {
		_ = c.lock.Close()
		c.lock = nil
	}
	return errors.Join(errs...)
}

// stopProcess ends a component: SIGTERM, and SIGKILL after a grace period.
func (c *Cluster) stopProcess(name string) error {
	p := c.running[name]
	if p == nil || !p.Running() {
		return nil
	}
	if err := p.Stop(15 * time.Second); err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	return nil
}

// mountRoots are the folders every mount below which belongs to the node.
func (c *Cluster) mountRoots() []string {
	roots := []string{c.dirs.root, "/run/containerd/io.containerd", "/run/netns/cni-"}
	if c.made.kubeletRoot {
		roots = append(roots, KubeletRootDir)
	}
	if c.made.runContainerd {
		roots = append(roots, "/run/containerd")
	}
	return roots
}

// killShims kills the runc shims of the node's containerd: they outlive containerd by design.
func (c *Cluster) killShims() error {
	shim := filepath.Join(c.opts.NodeBin, "containerd-shim-runc-v2")
	var errs []error
	for _, pid := range processesRunning(shim) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill shim %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// nodeProcesses lists the processes of this node still running, as "pid command": those whose
// command line names the node's folder (every component's does: its configuration, certificates
// or data are there) and the runc shims.
func (c *Cluster) nodeProcesses() []string {
	pids := append(harness.ProcessesUnder(c.dirs.root), processesRunning(filepath.Join(c.opts.NodeBin, "containerd-shim-runc-v2"))...)
	out := make([]string, 0, len(pids))
	for _, pid := range slices.Compact(slices.Sorted(slices.Values(pids))) {
		out = append(out, fmt.Sprintf("%d %s", pid, strings.Join(harness.CommandLine(pid), " ")))
	}
	return out
}

// processesRunning lists the processes whose executable is exe.
func processesRunning(exe string) []int {
	return harness.ProcessesWhere(func(pid int) bool {
		p, err := procfs.NewProc(pid)
		if err != nil {
			return false
		}
		target, err := p.Executable()
		return err == nil && strings.TrimSuffix(target, " (deleted)") == exe
	})
}

// cgroupDirs lists every cgroup folder named name directly below a hierarchy's root, and what is
// below them, deepest first.
func cgroupDirs(name string) []string {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/" + name)
	if unified, err := os.Stat("/sys/fs/cgroup/" + name); err == nil && unified.IsDir() {
		roots = append(roots, "/sys/fs/cgroup/"+name)
	}
	var dirs []string
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	// Deepest first.
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return dirs
}

// killCgroups kills every process in the cgroups named name, until none is left.
func killCgroups(name string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		var pids []int
		for _, d := range cgroupDirs(name) {
			pids = append(pids, cgroupProcs(d)...)
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes still in the %s cgroups: %v", name, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func cgroupProcs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeCgroups removes the cgroups named name, deepest first.
func removeCgroups(name string) error {
	var errs []error
	for _, d := range cgroupDirs(name) {
		var err error
		for try := 0; try < 50; try++ {
			if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
				err = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points below any of roots (a root ending in "-" is a name
// prefix), deepest first, from this process's mount table.
func mountsUnder(roots ...string) []string {
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil
	}
	var points []string
	for _, m := range infos {
		point := m.Mountpoint
		for _, root := range roots {
			if point == root || strings.HasPrefix(point, strings.TrimSuffix(root, "/")+"/") ||
				(strings.HasSuffix(root, "-") && strings.HasPrefix(point, root)) {
				points = append(points, point)
				break
			}
		}
	}
	slices.SortFunc(points, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return slices.Compact(points)
}

// unmountUnder detaches every mount below roots, deepest first, until none is left.
func unmountUnder(roots ...string) error {
	for try := 0; try < 10; try++ {
		points := mountsUnder(roots...)
		if len(points) == 0 {
			return nil
		}
		for _, p := range points {
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
		}
	}
	if left := mountsUnder(roots...); len(left) > 0 {
		return fmt.Errorf("mounts left: %s", strings.Join(left, ", "))
	}
	return nil
}

func removeGlob(pattern string) error {
	matches, _ := filepath.Glob(pattern)
	var errs []error
	for _, m := range matches {
		if err := os.RemoveAll(m); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanupIPTables removes kube-proxy's rules and chains (kube-proxy --cleanup), then the chains
// kubelet made (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...) and the rules that jump to them: every
// KUBE- or CNI- chain that did not exist before Start.
func (c *Cluster) cleanupIPTables() error {
	if !c.made.bridge {
		return nil
	}
	var errs []error
	out, err := exec.Command(filepath.Join(c.opts.NodeBin, "kube-proxy"), "--cleanup").CombinedOutput()
	if err != nil {
		errs = append(errs, fmt.Errorf("kube-proxy --cleanup: %w: %s", err, strings.TrimSpace(string(out))))
	}
	made := map[string]bool{}
	for _, ch := range iptablesChains() {
		if !slices.Contains(c.chains, ch) {
			made[ch] = true
		}
	}
	for _, table := range []string{"filter", "nat", "mangle"} {
		dump, err := exec.Command("iptables-save", "-t", table).Output()
		if err != nil {
			continue
		}
		// Rules that jump to a chain of the node, in chains that stay.
		for _, line := range strings.Split(string(dump), "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || f[0] != "-A" || made[table+"/"+f[1]] {
				continue
			}
			if i := slices.Index(f, "-j"); i > 0 && i+1 < len(f) && made[table+"/"+f[i+1]] {
				args := append([]string{"-t", table, "-D"}, f[1:]...)
				if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, out))
				}
			}
		}
		for ch := range made {
			if t, name, _ := strings.Cut(ch, "/"); t == table {
				_ = exec.Command("iptables", "-t", table, "-F", name).Run()
			}
		}
		for ch := range made {
			if t, name, _ := strings.Cut(ch, "/"); t == table {
				if out, err := exec.Command("iptables", "-t", table, "-X", name).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("iptables -t %s -X %s: %w: %s", table, name, err, out))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// iptablesChains lists the KUBE- and CNI- chains in the filter and nat tables.
func iptablesChains() []string {
	var chains []string
	for _, table := range []string{"filter", "nat", "mangle"} {
		out, err := exec.Command("iptables-save", "-t", table).Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, ":KUBE-") || strings.HasPrefix(line, ":CNI-") {
				chains = append(chains, table+"/"+strings.Fields(line[1:])[0])
			}
		}
	}
	return chains
}

// Leftovers says what of the node is still on the machine: processes of its binaries, mounts,
// cgroups, the bridge, iptables chains, changed sysctls.
func (c *Cluster) Leftovers() error {
	var left []string
	if pids := c.nodeProcesses(); len(pids) > 0 {
		left = append(left, fmt.Sprintf("processes: %v", pids))
	}
	if m := mountsUnder(c.mountRoots()...); len(m) > 0 {
		left = append(left, "mounts: "+strings.Join(m, ", "))
	}
	if cg := cgroupDirs("kubepods"); len(cg) > 0 {
		left = append(left, "cgroups: "+strings.Join(cg, ", "))
	}
	if linkExists(bridgeName) {
		left = append(left, "network device "+bridgeName)
	}
	if ch := slices.DeleteFunc(iptablesChains(), func(ch string) bool { return slices.Contains(c.chains, ch) }); len(ch) > 0 {
		left = append(left, "iptables chains: "+strings.Join(ch, ", "))
	}
	if s := changedSysctls(c.sysctls); len(s) > 0 {
		left = append(left, "sysctls: "+strings.Join(s, ", "))
	}
	if c.made.kubeletRoot {
		if _, err := os.Stat(KubeletRootDir); err == nil {
			left = append(left, KubeletRootDir)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("the node left: %s", strings.Join(left, "; "))
	}
	return nil
}
