package deploy

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// pluginWithContainerRestart renders the ceph-csi-rbd example with the component that gives the
// healer sidecar the container runtime's socket.
func pluginWithContainerRestart(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	return kustomizeWith(t, func(dir string) string {
		rel := func(elem ...string) string {
			r, err := filepath.Rel(dir, path(t, elem...))
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		return fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
components:
  - %s
`, rel("deploy", "examples", "ceph-csi-rbd"), rel("deploy", "components", "container-restart"))
	})
}

// runtimeAccess is what a rendered node plugin gives its healer sidecar of the container
// runtime: the endpoint it is told (flag or environment), and the host path of the socket it
// mounts there.
type runtimeAccess struct {
	endpoint string
	// hostPath and hostPathType are those of the volume mounted at the endpoint's path.
	hostPath     string
	hostPathType corev1.HostPathType
	// others are the other containers that mount that volume.
	others []string
}

func runtimeAccessOf(t *testing.T, spec corev1.PodSpec) runtimeAccess {
	t.Helper()
	side := container(t, spec, "healer-sidecar")
	var a runtimeAccess
	for _, arg := range side.Args {
		if v, ok := strings.CutPrefix(arg, "--container-runtime-endpoint="); ok {
			a.endpoint = v
		}
	}
	for _, e := range side.Env {
		if e.Name == "CONTAINER_RUNTIME_ENDPOINT" {
			if a.endpoint != "" {
				t.Errorf("the runtime endpoint is given twice: --container-runtime-endpoint=%s and CONTAINER_RUNTIME_ENDPOINT=%s", a.endpoint, e.Value)
			}
			a.endpoint = e.Value
		}
	}
	if a.endpoint == "" {
		return a
	}
	socket := strings.TrimPrefix(a.endpoint, "unix://")
	name := ""
	for _, m := range side.VolumeMounts {
		if m.MountPath == socket {
			name = m.Name
		}
	}
	if name == "" {
		t.Fatalf("the sidecar is told the runtime is at %s, and mounts nothing there", a.endpoint)
	}
	v := volumeNamed(t, spec, name)
	if v.HostPath != nil {
		a.hostPath = v.HostPath.Path
		if v.HostPath.Type != nil {
			a.hostPathType = *v.HostPath.Type
		}
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if _, ok := mountOf(c, name); ok && c.Name != "healer-sidecar" {
			a.others = append(a.others, c.Name)
		}
	}
	return a
}

// TestContainerRuntimeAccess: no rendering gives the sidecar the container runtime's socket unless
// asked to; asked to, the sidecar, and it alone, mounts the socket (a hostPath that must be a
// socket) where its endpoint says.
func TestContainerRuntimeAccess(t *testing.T) {
	tool(t, "kustomize")
	tool(t, "helm")
	daemonSet := func(objs []*unstructured.Unstructured) corev1.PodSpec {
		t.Helper()
		ds := ofKind(objs, "DaemonSet")
		if len(ds) != 1 {
			t.Fatalf("%d DaemonSets rendered, want one", len(ds))
		}
		var d appsv1.DaemonSet
		convert(t, ds[0], &d)
		return d.Spec.Template.Spec
	}
	for name, tc := range map[string]struct {
		objs   []*unstructured.Unstructured
		socket string
	}{
		"kustomize deploy/examples/ceph-csi-rbd": {objs: kustomize(t, "deploy/examples/ceph-csi-rbd")},
		"kustomize deploy/examples/ceph-csi-rbd with container-restart": {
			objs: pluginWithContainerRestart(t), socket: "/run/containerd/containerd.sock"},
		"helm template healer-refdriver, default values": {objs: refdriverTemplate(t, "rd", refdriverNamespace)},
		"helm template healer-refdriver, containerRuntime.enabled": {
			objs:   refdriverTemplate(t, "rd", refdriverNamespace, "healerSidecar.containerRuntime.enabled=true"),
			socket: "/run/containerd/containerd.sock"},
		"helm template healer-refdriver, containerRuntime at CRI-O's socket": {
			objs: refdriverTemplate(t, "rd", refdriverNamespace, "healerSidecar.containerRuntime.enabled=true",
				"healerSidecar.containerRuntime.socketPath=/run/crio/crio.sock"),
			socket: "/run/crio/crio.sock"},
	} {
		t.Run(name, func(t *testing.T) {
			spec := daemonSet(tc.objs)
			a := runtimeAccessOf(t, spec)
			if tc.socket == "" {
				if a.endpoint != "" {
					t.Fatalf("the sidecar is given the container runtime at %s by default", a.endpoint)
				}
				for _, v := range spec.Volumes {
					if v.HostPath != nil && (strings.HasSuffix(v.HostPath.Path, ".sock") && !strings.Contains(v.HostPath.Path, "csi") ||
						v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathSocket) {
						t.Errorf("volume %s mounts the socket %s by default", v.Name, v.HostPath.Path)
					}
				}
				return
			}
			if a.endpoint != "unix://"+tc.socket {
				t.Errorf("runtime endpoint %q, want unix://%s", a.endpoint, tc.socket)
			}
			if a.hostPath != tc.socket || a.hostPathType != corev1.HostPathSocket {
				t.Errorf("the runtime's volume is hostPath %q of type %q, want %s of type Socket", a.hostPath, a.hostPathType, tc.socket)
			}
			if len(a.others) > 0 {
				t.Errorf("containers %v mount the runtime's socket too", a.others)
			}
			side := container(t, spec, "healer-sidecar")
			// What the sidecar had keeps: its downward API environment and its other mounts.
			env := map[string]bool{}
			for _, e := range side.Env {
				env[e.Name] = true
			}
			for _, want := range []string{"NODE_NAME", "POD_NAMESPACE", "POD_UID", "POD_IP"} {
				if !env[want] {
					t.Errorf("the sidecar lost $%s", want)
				}
			}
			if _, ok := mountOf(side, "socket-dir"); !ok {
				t.Error("the sidecar lost the driver's socket folder")
			}
			if sc := side.SecurityContext; sc == nil || sc.Privileged != nil && *sc.Privileged || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
				t.Errorf("the sidecar's security context %+v: with the runtime's socket too it keeps no capability and no privilege", sc)
			}
		})
	}
}
