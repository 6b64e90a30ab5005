package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// ContainersUnavailable says why this machine cannot run a program as a pod's container ("" when
// it can): StartContainer gives it a mount namespace of its own, which needs root.
func ContainersUnavailable() string {
	if os.Geteuid() != 0 {
		return "a program run as a pod's container needs root (a mount namespace of its own)"
	}
	return ""
}

// RequireContainers skips the test on a machine where StartContainer cannot work, except in CI
// (CI=true), where the machine runs as root and the lack fails the test instead of hiding it.
func RequireContainers(t testing.TB) {
	t.Helper()
	why := ContainersUnavailable()
	switch {
	case why == "":
	case os.Getenv("CI") == "true":
		t.Fatalf("%s, and CI (CI=true) must run these tests", why)
	default:
		t.Skip(why)
	}
}

// BuildCSIAddonsSidecar builds the real csi-addons sidecar of the kubernetes-csi-addons version
// go.mod requires with hack/csi-addons-sidecar.sh, from the Go module proxy (a few minutes the
// first time on a machine, then cached under .cache/bin), and returns its path.
func BuildCSIAddonsSidecar() (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(root, "hack", "csi-addons-sidecar.sh"))
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/csi-addons-sidecar.sh: %w\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	path := lines[len(lines)-1]
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("hack/csi-addons-sidecar.sh printed %q, which is no binary: %w", path, err)
	}
	return path, nil
}

// ContainerOptions describe a program run as a container of a pod.
type ContainerOptions struct {
	// Name names the process in messages. Required.
	Name string
	// Runner is the path of test/container (BuildContainer). Required.
	Runner string
	// Binary and Args are the program and its arguments. Binary is required.
	Binary string
	Args   []string
	// Namespace and ServiceAccount are the pod's; the container gets a token of the
	// ServiceAccount, which must exist. Required.
	Namespace, ServiceAccount string
	// Dir is the container's folder on this machine, which StartContainer creates: the
	// ServiceAccount files and the termination log. Required.
	Dir string
	// LogPath receives the program's standard output and error. Required.
	LogPath string
}

// Container is a program running as a pod's container.
type Container struct {
	*Process
	termLog string
}

// containerTokenTTL is how long a container's token lasts: longer than any run.
const containerTokenTTL = 24 * time.Hour

// StartContainer runs a program as a container of a pod that reaches the API server from inside
// the cluster: through test/container, in a mount namespace of its own, with a token of the
// pod's ServiceAccount, the apiserver's CA certificate and the namespace at
// /var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST and
// KUBERNETES_SERVICE_PORT naming the apiserver, and a /dev/termination-log of its own, empty at
// each start. A program that only knows rest.InClusterConfig thus runs against this cluster
// unchanged. It needs root (RequireContainers). The process belongs to ps.
func (c *Cluster) StartContainer(ctx context.Context, ps *Processes, o ContainerOptions) (*Container, error) {
	if why := ContainersUnavailable(); why != "" {
		return nil, errors.New(why)
	}
	u, err := url.Parse(c.Config.Host)
	if err != nil {
		return nil, fmt.Errorf("the apiserver's address %q: %w", c.Config.Host, err)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("the apiserver's address %q: %w", c.Config.Host, err)
	}
	saDir := filepath.Join(o.Dir, "serviceaccount")
	if err := os.MkdirAll(saDir, 0o755); err != nil {
		return nil, err
	}
	if err := controlplane.WriteServiceAccountToken(ctx, c.Clientset, o.Namespace, o.ServiceAccount, containerTokenTTL, filepath.Join(saDir, "token")); err != nil {
		return nil, fmt.Errorf("%s: %w", o.Name, err)
	}
	for name, data := range map[string][]byte{"ca.crt": c.Config.CAData, "namespace": []byte(o.Namespace)} {
		if err := os.WriteFile(filepath.Join(saDir, name), data, 0o644); err != nil {
			return nil, err
		}
	}
	// Kubelet gives each start of a container a termination log of its own.
	termLog := filepath.Join(o.Dir, "termination-log")
	if err := os.WriteFile(termLog, nil, 0o644); err != nil {
		return nil, err
	}
	args := append([]string{"-serviceaccount", saDir, "-termination-log", termLog, "--", o.Binary}, o.Args...)
	env := append(os.Environ(), "KUBERNETES_SERVICE_HOST="+host, "KUBERNETES_SERVICE_PORT="+port)
	p, err := ps.start(o.Name, o.Runner, args, env, o.LogPath, syscall.CLONE_NEWNS)
	if err != nil {
		return nil, err
	}
	return &Container{Process: p, termLog: termLog}, nil
}

// TerminationMessage returns what the program wrote to /dev/termination-log, which kubelet reports
// as the message of the container's last termination.
func (c *Container) TerminationMessage() string {
	data, err := os.ReadFile(c.termLog)
	if err != nil {
		return err.Error()
	}
	return string(data)
}
