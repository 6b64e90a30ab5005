package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/logging"
	"github.com/volume-healer/volume-healer/logging/loggingtest"
	"github.com/volume-healer/volume-healer/sidecar"
)

func TestParse(t *testing.T) {
	env := map[string]string{"NODE_NAME": "worker-1", "POD_NAMESPACE": "ceph-csi", "POD_UID": "0b1c", "POD_IP": "10.1.2.3"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	tests := map[string]struct {
		args []string
		// env adds to the environment.
		env   map[string]string
		check func(t *testing.T, c *config)
	}{
		"defaults and the downward API": {
			check: func(t *testing.T, c *config) {
				o := c.opts
				if o.NodeName != "worker-1" || o.Namespace != "ceph-csi" || o.PodUID != "0b1c" || o.PodIP != "10.1.2.3" {
					t.Errorf("downward API values not taken: %+v", o)
				}
				if o.DriverEndpoint != sidecar.DefaultDriverEndpoint || o.ListenAddress != ":9072" || o.MetricsAddress != ":9071" ||
					o.DriverTimeout != 30*time.Second || o.ShutdownTimeout != 10*time.Second ||
					!slices.Equal(o.AllowedIdentities, []string{sidecar.DefaultAllowedIdentity}) {
					t.Errorf("defaults = %+v", o)
				}
				if o.ContainerRuntimeEndpoint != "" {
					t.Errorf("container runtime endpoint %q by default, want none", o.ContainerRuntimeEndpoint)
				}
			},
		},
		"a driver without a CSI-Addons socket": {
			args: []string{"--csi-endpoint=unix:///csi/csi.sock", "--driver-name=rclone.csi.example.com"},
			check: func(t *testing.T, c *config) {
				if c.opts.DriverEndpoint != "" || c.opts.CSIEndpoint != "unix:///csi/csi.sock" || c.opts.DriverName != "rclone.csi.example.com" {
					t.Errorf("want no CSI-Addons socket, the CSI socket and the name: %q, %q, %q", c.opts.DriverEndpoint, c.opts.CSIEndpoint, c.opts.DriverName)
				}
			},
		},
		"a CSI-Addons socket given beside --driver-name is kept, for the options to refuse": {
			args: []string{"--driver-endpoint=unix:///csi/csi-addons.sock", "--driver-name=rclone.csi.example.com"},
			check: func(t *testing.T, c *config) {
				if c.opts.DriverEndpoint != "unix:///csi/csi-addons.sock" {
					t.Errorf("driver endpoint %q, want the one given", c.opts.DriverEndpoint)
				}
			},
		},
		"container runtime access": {
			args: []string{"--container-runtime-endpoint=unix:///run/containerd/containerd.sock", "--container-stop-grace-period=20s"},
			check: func(t *testing.T, c *config) {
				if c.opts.ContainerRuntimeEndpoint != "unix:///run/containerd/containerd.sock" || c.opts.ContainerStopGracePeriod != 20*time.Second {
					t.Errorf("container runtime flags not applied: %q, %s", c.opts.ContainerRuntimeEndpoint, c.opts.ContainerStopGracePeriod)
				}
			},
		},
		"container runtime access from the environment": {
			env: map[string]string{"CONTAINER_RUNTIME_ENDPOINT": "unix:///run/k3s/containerd/containerd.sock"},
			check: func(t *testing.T, c *config) {
				if c.opts.ContainerRuntimeEndpoint != "unix:///run/k3s/containerd/containerd.sock" {
					t.Errorf("container runtime endpoint %q, want $CONTAINER_RUNTIME_ENDPOINT", c.opts.ContainerRuntimeEndpoint)
				}
			},
		},
		"--version": {
			args: []string{"--version"},
			check: func(t *testing.T, c *config) {
				if !c.showVersion {
					t.Error("--version not taken")
				}
			},
		},
		"flags win over the environment": {
			args: []string{"--node-name=worker-2", "--namespace=csi", "--driver-endpoint=unix:///plugin/addons.sock",
				"--listen=[::]:9443", "--allowed-identities=a,b", "--driver-timeout=5s", "--insecure", "--token-audience=healer",
				"--csiaddonsnode-name=n1", "--advertise-address=node.example:9443", "--max-message-size=1024", "-v=4"},
			check: func(t *testing.T, c *config) {
				o := c.opts
				if o.NodeName != "worker-2" || o.Namespace != "csi" || o.DriverEndpoint != "unix:///plugin/addons.sock" ||
					o.ListenAddress != "[::]:9443" || !slices.Equal(o.AllowedIdentities, []string{"a", "b"}) ||
					o.DriverTimeout != 5*time.Second || !o.Insecure || o.TokenAudience != "healer" ||
					o.CSIAddonsNodeName != "n1" || o.AdvertiseAddress != "node.example:9443" || o.MaxMessageSize != 1024 {
					t.Errorf("flags not applied: %+v", o)
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := parse(tc.args, func(k string) (string, bool) {
				if v, ok := tc.env[k]; ok {
					return v, true
				}
				return lookup(k)
			})
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
	if _, err := parse([]string{"--no-such-flag"}, lookup); err == nil {
		t.Error("an unknown flag was accepted")
	}
	if _, err := parse([]string{"stray"}, lookup); err == nil {
		t.Error("a stray argument was accepted")
	}
}

func TestLoggingFlags(t *testing.T) {
	lookup := func(string) (string, bool) { return "", false }
	tests := map[string]struct {
		args []string
		// wantErr are words of the error run returns.
		wantErr []string
		// wantJSON: every line on stderr is a JSON object, and one of them is the start line.
		wantJSON bool
	}{
		"json": {
			args:     []string{"--logging-format=json", "-v=2"},
			wantErr:  []string{"/nonexistent/kubeconfig"},
			wantJSON: true,
		},
		"unknown format": {
			args:    []string{"--logging-format=yaml"},
			wantErr: []string{"--logging-format", `"yaml"`, "text, json"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"--node-name=worker-1", "--kubeconfig=/nonexistent/kubeconfig"}, tc.args...)
			err := run(context.Background(), args, lookup, &stdout, &stderr)
			t.Cleanup(func() {
				if err := logging.ResetForTest(); err != nil {
					t.Error(err)
				}
			})
			if err == nil {
				t.Fatal("run succeeded without a cluster")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
			if !tc.wantJSON {
				return
			}
			loggingtest.AssertJSONLines(t, stderr.String(), "Starting")
		})
	}
}
