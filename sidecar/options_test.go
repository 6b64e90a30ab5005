package sidecar

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

func validOptions() Options {
	return Options{KubeConfig: &rest.Config{Host: "https://127.0.0.1:6443"}, NodeName: "node-a", Namespace: "csi", Insecure: true}
}

func TestOptionsDefaults(t *testing.T) {
	o := validOptions()
	if err := o.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if o.DriverEndpoint != DefaultDriverEndpoint || o.ListenAddress != ":9072" || o.MetricsAddress != ":9071" ||
		o.DriverTimeout != 30*time.Second || o.ShutdownTimeout != 10*time.Second || o.MaxMessageSize != 4<<20 ||
		o.KubeletDir != "/var/lib/kubelet" || len(o.AllowedIdentities) != 1 || o.AllowedIdentities[0] != DefaultAllowedIdentity {
		t.Errorf("defaults = %+v", o)
	}
	// No access to the container runtime unless asked for.
	if o.ContainerRuntimeEndpoint != "" || o.ContainerStopGracePeriod != 10*time.Second {
		t.Errorf("container runtime endpoint %q, stop grace period %s; want none and 10s", o.ContainerRuntimeEndpoint, o.ContainerStopGracePeriod)
	}
	// Without a flag the sidecar still accepts only tokens for its own node's audience, never the
	// API server's own tokens.
	if o.TokenAudience != "volume-healer-sidecar" {
		t.Errorf("TokenAudience defaults to %q, want volume-healer-sidecar", o.TokenAudience)
	}
}

// TestOptionsWithoutCSIAddonsSocket: a driver named, or reached on its CSI socket, has no
// CSI-Addons socket: none is dialled by default.
func TestOptionsWithoutCSIAddonsSocket(t *testing.T) {
	tests := map[string]struct {
		csi, name, wantCSI string
	}{
		"CSI socket":          {csi: "/csi/csi.sock", wantCSI: "unix:///csi/csi.sock"},
		"CSI socket and name": {csi: "unix:///csi/csi.sock", name: "rclone.csi.example.com", wantCSI: "unix:///csi/csi.sock"},
		"name alone":          {name: "rclone.csi.example.com"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := validOptions()
			o.CSIEndpoint, o.DriverName = tc.csi, tc.name
			if err := o.setDefaults(); err != nil {
				t.Fatal(err)
			}
			if o.DriverEndpoint != "" || o.CSIEndpoint != tc.wantCSI || o.DriverName != tc.name {
				t.Errorf("driver endpoint %q, CSI endpoint %q, name %q; want no CSI-Addons socket, %q, %q", o.DriverEndpoint, o.CSIEndpoint, o.DriverName, tc.wantCSI, tc.name)
			}
		})
	}
}

func TestOptionsInvalid(t *testing.T) {
	tests := map[string]func(*Options){
		"no kubeconfig":               func(o *Options) { o.KubeConfig = nil },
		"no node name":                func(o *Options) { o.NodeName = "" },
		"no namespace":                func(o *Options) { o.Namespace = "" },
		"no TLS and not insecure":     func(o *Options) { o.Insecure = false },
		"TLS and insecure":            func(o *Options) { o.TLSCertFile, o.TLSKeyFile = "c", "k" },
		"client CA and insecure":      func(o *Options) { o.ClientCAFile = "ca.crt" },
		"tcp driver endpoint":         func(o *Options) { o.DriverEndpoint = "tcp://10.0.0.1:50051" },
		"relative driver socket":      func(o *Options) { o.DriverEndpoint = "unix://csi.sock" },
		"listen address without port": func(o *Options) { o.ListenAddress = "0.0.0.0" },
		"negative driver timeout":     func(o *Options) { o.DriverTimeout = -time.Second },
		"empty allowed identity":      func(o *Options) { o.AllowedIdentities = []string{"a", " "} },
		"relative kubelet dir":        func(o *Options) { o.KubeletDir = "var/lib/kubelet" },
		"negative message size":       func(o *Options) { o.MaxMessageSize = -1 },
		"tcp runtime endpoint":        func(o *Options) { o.ContainerRuntimeEndpoint = "tcp://127.0.0.1:1234" },
		"relative runtime socket":     func(o *Options) { o.ContainerRuntimeEndpoint = "run/containerd/containerd.sock" },
		"sub-second stop grace":       func(o *Options) { o.ContainerStopGracePeriod = 500 * time.Millisecond },
		"negative stop grace":         func(o *Options) { o.ContainerStopGracePeriod = -time.Second },
		"CSI-Addons and CSI sockets":  func(o *Options) { o.DriverEndpoint, o.CSIEndpoint = DefaultDriverEndpoint, "unix:///csi/csi.sock" },
		"CSI-Addons socket and name":  func(o *Options) { o.DriverEndpoint, o.DriverName = DefaultDriverEndpoint, "rclone.csi.example.com" },
		"relative CSI socket":         func(o *Options) { o.CSIEndpoint = "csi/csi.sock" },
		"driver name with a slash":    func(o *Options) { o.DriverName = "rclone/csi" },
		"driver name too long":        func(o *Options) { o.DriverName = strings.Repeat("a", 60) + ".com" },
		"negative csi-addons wait":    func(o *Options) { o.CSIAddonsNodeName, o.PodUID, o.CSIAddonsSidecarWait = "n", "u", -time.Second },
		"csi-addons wait, no name":    func(o *Options) { o.PodUID, o.CSIAddonsSidecarWait = "u", time.Second },
		"csi-addons wait, no pod UID": func(o *Options) { o.CSIAddonsNodeName, o.PodUID, o.CSIAddonsSidecarWait = "n", "", time.Second },
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			o := validOptions()
			mutate(&o)
			if err := o.setDefaults(); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("setDefaults: %v, want ErrInvalidOptions", err)
			}
		})
	}
}

func TestUnixTarget(t *testing.T) {
	tests := map[string]struct{ in, want string }{
		"unix URL":  {in: "unix:///csi/csi-addons.sock", want: "unix:///csi/csi-addons.sock"},
		"bare path": {in: "/csi/csi-addons.sock", want: "unix:///csi/csi-addons.sock"},
		"runtime":   {in: "/run/containerd/containerd.sock", want: "unix:///run/containerd/containerd.sock"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := unixTarget("driver endpoint", tc.in, "unix:///csi/csi-addons.sock")
			if err != nil || got != tc.want {
				t.Errorf("unixTarget(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestAdvertiseAddress(t *testing.T) {
	listened := &net.TCPAddr{IP: net.IPv6unspecified, Port: 9070}
	tests := map[string]struct {
		listen, advertise, podIP string
		want                     string
		wantErr                  bool
	}{
		"pod IP and the listening port":   {listen: ":9070", podIP: "10.1.2.3", want: "10.1.2.3:9070"},
		"IPv6 pod IP gets brackets":       {listen: ":9070", podIP: "fd00::5", want: "[fd00::5]:9070"},
		"advertise address with a port":   {listen: ":9070", advertise: "node-a.example:443", podIP: "10.1.2.3", want: "node-a.example:443"},
		"advertise host alone":            {listen: ":9070", advertise: "10.9.9.9", want: "10.9.9.9:9070"},
		"advertise IPv6 host alone":       {listen: ":9070", advertise: "[fd00::9]", want: "[fd00::9]:9070"},
		"listening on one address":        {listen: "192.168.1.5:9070", want: "192.168.1.5:9070"},
		"listening everywhere, no pod IP": {listen: "[::]:9070", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := &Options{ListenAddress: tc.listen, AdvertiseAddress: tc.advertise, PodIP: tc.podIP}
			got, err := advertiseAddress(o, listened)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("advertiseAddress = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
