package main

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/volume-healer/volume-healer/test/harness"
)

// TestContainerSetUp runs a shell through the built program in a mount namespace of its own, as
// StartContainer does, and checks what the shell sees: the ServiceAccount files where
// rest.InClusterConfig reads them, read-only; the device nodes; a termination log that ends up in
// the host file. The host's /run and /dev stay as they were.
func TestContainerSetUp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds test/container; run without -short")
	}
	harness.RequireContainers(t)
	bin, err := harness.BuildContainer()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sa := filepath.Join(dir, "serviceaccount")
	if err := os.Mkdir(sa, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"token": "the-token", "ca.crt": "the-ca", "namespace": "ceph-csi"}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(sa, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	termLog := filepath.Join(dir, "termination-log")
	if err := os.WriteFile(termLog, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	script := `set -e
d=/var/run/secrets/kubernetes.io/serviceaccount
echo "token=$(cat $d/token) ca=$(cat $d/ca.crt) namespace=$(cat $d/namespace)"
if touch $d/extra 2>/dev/null; then echo "writable"; else echo "read-only"; fi
for dev in null zero full random urandom; do [ -c /dev/$dev ] && echo "device $dev"; done
head -c 4 /dev/zero | wc -c
echo "Lost connection, exiting" > /dev/termination-log
`
	cmd := exec.Command(bin, "-serviceaccount", sa, "-termination-log", termLog, "--", "sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("container: %v\n%s", err, out)
	}
	for _, want := range []string{
		"token=the-token ca=the-ca namespace=ceph-csi", "read-only",
		"device null", "device zero", "device full", "device random", "device urandom", "\n4\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the program's output lacks %q:\n%s", want, out)
		}
	}
	if got, err := os.ReadFile(termLog); err != nil || string(got) != "Lost connection, exiting\n" {
		t.Errorf("the termination log holds %q (%v), want what the program wrote", got, err)
	}
	// The test may itself run in a pod, whose files are there: what the container saw must not be.
	for host, theirs := range map[string]string{
		"/run/secrets/kubernetes.io/serviceaccount/token": "the-token",
		"/dev/termination-log":                            "Lost connection, exiting\n",
	} {
		got, err := os.ReadFile(host)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("read %s on the host: %v", host, err)
		}
		if string(got) == theirs {
			t.Errorf("%s on the host holds what the container wrote there", host)
		}
	}
}
