package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestNewSubnet(t *testing.T) {
	s, err := newSubnet("10.213.77.0/24")
	if err != nil {
		t.Fatal(err)
	}
	if s.nodeIP != "10.213.77.1" || s.prefix != 24 || s.cidr != "10.213.77.0/24" {
		t.Errorf("got %+v", s)
	}
	for _, bad := range []string{"", "10.213.77.1", "fd00::/64", "nonsense"} {
		if _, err := newSubnet(bad); err == nil || !strings.Contains(err.Error(), "node subnet") {
			t.Errorf("newSubnet(%q) = %v, want an error naming the node subnet", bad, err)
		}
	}
}

// TestContainerdConfig checks the settings this machine kind needs (see containerdConfig).
func TestContainerdConfig(t *testing.T) {
	conf := containerdConfig(newDirs("/tmp/n"), "/usr/sbin/runc", "docker.io/library/healer-test-pause:v1")
	for _, want := range []string{
		"version = 3", "restrict_oom_score_adj = true", "disable_apparmor = true", "SystemdCgroup = false",
		`sandbox = "docker.io/library/healer-test-pause:v1"`, `BinaryName = "/usr/sbin/runc"`,
		`address = "/tmp/n/containerd/containerd.sock"`, "netns_mounts_under_state_dir = true",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("containerd's configuration lacks %q:\n%s", want, conf)
		}
	}
}

// TestUnmountUnder mounts two layers of tmpfs and a mount beside them, and checks that
// unmountUnder removes exactly the two below its root.
func TestUnmountUnder(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root, and CI (CI=true) must run it")
		}
		t.Skip("needs root to mount")
	}
	dir := t.TempDir()
	inner, outer, beside := filepath.Join(dir, "root", "a"), filepath.Join(dir, "root"), filepath.Join(dir, "beside")
	for _, d := range []string{outer, beside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mount := func(p string) {
		if err := syscall.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
	}
	mount(outer)
	if err := os.MkdirAll(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	mount(inner)
	mount(beside)
	t.Cleanup(func() { _ = syscall.Unmount(beside, syscall.MNT_DETACH) })
	if got := mountsUnder(outer); len(got) != 2 || got[0] != inner {
		t.Fatalf("mountsUnder(%s) = %v, want %s first, then %s", outer, got, inner, outer)
	}
	if err := unmountUnder(outer); err != nil {
		t.Fatal(err)
	}
	if got := mountsUnder(outer); len(got) != 0 {
		t.Errorf("left: %v", got)
	}
	if got := mountsUnder(beside); len(got) != 1 {
		t.Errorf("the mount beside the root was touched: %v", got)
	}
}

// TestPackagesMatchNodeScript checks that every program Check may find missing has the Debian
// package that hack/node.sh installs for it, so that the demo's advice (make node) installs what
// Check asks for.
func TestPackagesMatchNodeScript(t *testing.T) {
	script, err := os.ReadFile("../../hack/node.sh")
	if err != nil {
		t.Fatal(err)
	}
	all := Machine{Installable: []string{"runc", "ip", "iptables", "CNI bridge plugin"}}
	pkgs := all.Packages()
	if len(pkgs) != len(all.Installable) {
		t.Fatalf("Packages() = %v for %v: a program without its package", pkgs, all.Installable)
	}
	for _, pkg := range pkgs {
		if !strings.Contains(string(script), "need+=("+pkg+")") {
			t.Errorf("hack/node.sh does not install %s (no need+=(%s))", pkg, pkg)
		}
	}
}
