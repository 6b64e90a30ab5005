// Command container runs a program as a container of a pod, as far as a program that reaches the
// Kubernetes API from inside its pod can tell. test/harness's StartContainer starts it in a new
// mount namespace (clone with CLONE_NEWNS); it sets that namespace up as kubelet and the
// container runtime set up a container's, then replaces itself with the program:
//
//   - the pod's ServiceAccount token, the cluster's CA certificate and the pod's namespace at
//     /var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace}, copied from the
//     folder -serviceaccount into a /run of the container's own (a tmpfs, as /run is in a
//     container image); client-go's rest.InClusterConfig reads them there and nowhere else;
//   - a /dev of the container's own (a tmpfs with the device nodes a runtime creates), with
//     /dev/termination-log bound to the file -termination-log, where kubelet reads the message
//     a container leaves when it exits.
//
// The environment passes through unchanged: the caller sets KUBERNETES_SERVICE_HOST and
// KUBERNETES_SERVICE_PORT, as kubelet does for every container.
//
//	container -serviceaccount DIR -termination-log FILE -- PROGRAM [ARG...]
//
// Set-up failures go to standard error, and the command exits with status 1. Nothing it mounts
// outlives the program: the mounts belong to its namespace, which ends with it.
//
// It owns the container's view (the ServiceAccount files, /dev, the termination log) and nothing
// of the program it runs. Of volume-healer it imports only test/mountns (the check that it runs in
// a mount namespace of its own, shared with test/workload) and must import nothing else: the
// programs it runs (the healer sidecar among them) must find what a real container gives them,
// not a shortcut in the project's code. test/harness builds it (BuildContainer); only its test imports the harness.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/volume-healer/volume-healer/test/mountns"
)

// serviceAccountDir is where rest.InClusterConfig reads the token and the CA certificate.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// serviceAccountFiles are the files kubelet's projected ServiceAccount volume holds.
var serviceAccountFiles = []string{"token", "ca.crt", "namespace"}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "container: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("container", flag.ContinueOnError)
	saDir := fs.String("serviceaccount", "", "`folder` holding token, ca.crt and namespace of the pod's ServiceAccount (required)")
	termLog := fs.String("termination-log", "", "host `file` bound at /dev/termination-log (required; it must exist)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if *saDir == "" || *termLog == "" || fs.NArg() == 0 {
		return errors.New("usage: container -serviceaccount DIR -termination-log FILE -- PROGRAM [ARG...]")
	}
	program, err := exec.LookPath(fs.Arg(0))
	if err != nil {
		return err
	}
	if err := mountns.RequireOwn("test/harness's StartContainer"); err != nil {
		return err
	}
	// Read before /run is replaced: the folder may be anywhere.
	files := map[string][]byte{}
	for _, name := range serviceAccountFiles {
		data, err := os.ReadFile(filepath.Join(*saDir, name))
		if err != nil {
			return fmt.Errorf("the pod's ServiceAccount: %w", err)
		}
		files[name] = data
	}
	// No mount made here may reach the host's namespace, as runc's prepareRoot makes "/" rslave.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / rslave: %w", err)
	}
	if err := setUpRun(files); err != nil {
		return err
	}
	if err := setUpDev(*termLog); err != nil {
		return err
	}
	return syscall.Exec(program, fs.Args(), os.Environ())
}

// setUpRun mounts a tmpfs at /run (/var/run links to it) holding the ServiceAccount files,
// read-only as kubelet mounts the projected volume.
func setUpRun(files map[string][]byte) error {
	if err := syscall.Mount("tmpfs", "/run", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount a tmpfs at /run: %w", err)
	}
	// Resolved through /var/run, which is /run or a link to it.
	dir := serviceAccountDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := syscall.Mount("", dir, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", dir, err)
	}
	return nil
}

// device is a node a container runtime creates in a container's /dev.
type device struct {
	name         string
	major, minor uint32
}

// devices are the character devices runc creates in every container (its AllowedDevices that
// have a path), /dev/tty aside: the program has no terminal.
var devices = []device{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}}

// setUpDev mounts a tmpfs at /dev with the device nodes, the links and the termination log file
// that a container's /dev has.
func setUpDev(termLog string) error {
	if _, err := os.Stat(termLog); err != nil {
		return fmt.Errorf("the termination log: %w", err)
	}
	// Open before /dev is replaced, in case the file is under it.
	logFile, err := os.Open(termLog)
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }()
	if err := syscall.Mount("tmpfs", "/dev", "tmpfs", syscall.MS_NOSUID, "mode=0755"); err != nil {
		return fmt.Errorf("mount a tmpfs at /dev: %w", err)
	}
	for _, d := range devices {
		dev := int(d.major<<8 | d.minor)
		if err := syscall.Mknod("/dev/"+d.name, syscall.S_IFCHR|0o666, dev); err != nil {
			return fmt.Errorf("create /dev/%s: %w", d.name, err)
		}
		// The umask narrowed the mode given to mknod.
		if err := os.Chmod("/dev/"+d.name, 0o666); err != nil {
			return err
		}
	}
	for link, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, "/dev/"+link); err != nil {
			return err
		}
	}
	if err := os.WriteFile("/dev/termination-log", nil, 0o644); err != nil {
		return err
	}
	// The file opened above, through /proc: its host path is hidden if it lies under /dev.
	src := fmt.Sprintf("/proc/self/fd/%d", logFile.Fd())
	if err := syscall.Mount(src, "/dev/termination-log", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s at /dev/termination-log: %w", termLog, err)
	}
	return nil
}
