package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/logging"
	"github.com/volume-healer/volume-healer/logging/loggingtest"
)

func TestParseVolumes(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    []string
		wantErr bool
	}{
		"empty keeps the driver's default set": {in: "", want: nil},
		"a count names vol-1 to vol-N":         {in: "3", want: []string{"vol-1", "vol-2", "vol-3"}},
		"a list is taken as is":                {in: "pvc-a, pvc-b,,", want: []string{"pvc-a", "pvc-b"}},
		"zero creates none":                    {in: "0", want: []string{}},
		"a negative count is an error":         {in: "-2", wantErr: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseVolumes(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseVolumes(%q) error = %v, want error %t", tt.in, err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
				t.Errorf("parseVolumes(%q) = %#v, want %#v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseCapabilities(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    []healerv1alpha1.HealerCapability_RPC_Type
		wantErr bool
	}{
		"all three": {in: "probe,heal,list", want: []healerv1alpha1.HealerCapability_RPC_Type{
			healerv1alpha1.HealerCapability_RPC_PROBE, healerv1alpha1.HealerCapability_RPC_HEAL, healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES,
		}},
		"probe only": {in: "probe", want: []healerv1alpha1.HealerCapability_RPC_Type{healerv1alpha1.HealerCapability_RPC_PROBE}},
		"a typo":     {in: "probe,heel", wantErr: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseCapabilities(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseCapabilities(%q) error = %v, want error %t", tt.in, err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("parseCapabilities(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseVolumeKeeping(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    []healerv1alpha1.HealerCapability_VolumeKeeping_Type
		wantErr bool
	}{
		"none":  {in: ""},
		"both":  {in: "plugin-restart, mounter-restart", want: []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART, healerv1alpha1.HealerCapability_VolumeKeeping_MOUNTER_RESTART}},
		"twice": {in: "plugin-restart,plugin-restart", wantErr: true},
		"typo":  {in: "plugin-restarts", wantErr: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseVolumeKeeping(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseVolumeKeeping(%q) error = %v, want error %t", tt.in, err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("parseVolumeKeeping(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestRunRejectsFlags(t *testing.T) {
	base := []string{"--endpoint", "unix:///nonexistent/refdriver.sock", "--state-dir", "/nonexistent/refdriver-state"}
	tests := map[string]struct {
		args []string
		want []string
	}{
		"real mode has no seed volumes": {
			args: append([]string{"--volumes", "3"}, base...),
			want: []string{"--volumes", "real mode"},
		},
		"real mode names every meaningless flag": {
			args: append([]string{"--mode", "real", "--heal-mounters", "fuse", "--default-hang", "1s", "--staging-root", "/x"}, base...),
			want: []string{"--staging-root", "--heal-mounters", "--default-hang", "real mode"},
		},
		"real mode has no simulated keeping": {
			args: append([]string{"--mode", "real", "--volume-keeping", "plugin-restart", "--keep-mounters", "fuse"}, base...),
			want: []string{"--volume-keeping", "--keep-mounters", "real mode"},
		},
		"simulated mode keeps no volume without the capability": {
			args: append([]string{"--mode", "simulated", "--keep-mounters", "fuse"}, base...),
			want: []string{"--keep-mounters needs --volume-keeping"},
		},
		"simulated mode has no CSI socket": {
			args: append([]string{"--mode", "simulated", "--csi-endpoint", "unix:///nonexistent/csi.sock"}, base...),
			want: []string{"--csi-endpoint", "simulated mode"},
		},
		"simulated mode stats nothing": {
			args: append([]string{"--mode", "simulated", "--stat-timeout", "1s"}, base...),
			want: []string{"--stat-timeout", "simulated mode"},
		},
		"simulated mode registers with no kubelet": {
			args: append([]string{"--mode", "simulated", "--kubelet-registration-dir", "/registration", "--kubelet-csi-endpoint", "/csi.sock"}, base...),
			want: []string{"--kubelet-registration-dir", "--kubelet-csi-endpoint", "simulated mode"},
		},
		"a kubelet endpoint without a registration": {
			args: append([]string{"--kubelet-csi-endpoint", "/var/lib/kubelet/plugins/x/csi.sock"}, base...),
			want: []string{"--kubelet-csi-endpoint", "--kubelet-registration-dir"},
		},
		"a kubelet endpoint that is not a path": {
			args: append([]string{"--kubelet-registration-dir", "/nonexistent/registration", "--kubelet-csi-endpoint", "csi.sock"}, base...),
			want: []string{"--kubelet-csi-endpoint", "unix:///path"},
		},
		"an unknown mode": {
			args: append([]string{"--mode", "fake"}, base...),
			want: []string{`"fake"`, "real, stock or simulated"},
		},
		"capabilities for a stock driver": {
			args: append([]string{"--mode", "stock", "--capabilities", "probe"}, base...),
			want: []string{"--capabilities", "stock mode"},
		},
		"the start-up clean-up for a Healer driver": {
			args: append([]string{"--unmount-dead-targets-on-start"}, base...),
			want: []string{"--unmount-dead-targets-on-start", "real mode"},
		},
		"a mounter for the simulated mode": {
			args: append([]string{"--mode", "simulated", "--mounter", "rclone"}, base...),
			want: []string{"--mounter", "simulated mode"},
		},
		"an unknown mounter": {
			args: append([]string{"--mode", "stock", "--mounter", "sshfs"}, base...),
			want: []string{"--mounter", `"sshfs"`, "refdriver or rclone"},
		},
		"no endpoint": {
			args: []string{"--state-dir", "/nonexistent"},
			want: []string{"--endpoint and --state-dir are required"},
		},
		"a stray argument": {
			args: append(slices.Clone(base), "mount"),
			want: []string{"unexpected arguments", "mounter"},
		},
		"a supervisor for a stock driver": {
			args: append([]string{"--mode", "stock", "--supervisor-socket", "/nonexistent/supervisor.sock"}, base...),
			want: []string{"--supervisor-socket", "stock mode"},
		},
		"a supervised rclone mounter": {
			args: append([]string{"--mounter", "rclone", "--supervisor-socket", "/nonexistent/supervisor.sock"}, base...),
			want: []string{"SupervisorSocket", "refdriver mounter only, not rclone"},
		},
		"a supervisor without a socket": {
			args: []string{"supervisor", "--state-dir", "/nonexistent"},
			want: []string{"--socket and --state-dir are required"},
		},
		"a supervisor with a stray argument": {
			args: []string{"supervisor", "--socket", "/x.sock", "--state-dir", "/x", "now"},
			want: []string{"unexpected arguments", `"status"`},
		},
		"a supervisor status without a socket": {
			args: []string{"supervisor", "status"},
			want: []string{"--socket is required"},
		},
		"a supervisor status of nobody": {
			args: []string{"supervisor", "status", "--socket", "/nonexistent/supervisor.sock"},
			want: []string{"supervisor unavailable", "/nonexistent/supervisor.sock"},
		},
		"a readiness check without an instance": {
			args: []string{"supervisor", "status", "--socket", "/nonexistent/supervisor.sock", "--ready", "--instance", ""},
			want: []string{"--ready needs --instance"},
		},
		"a mounter without a source": {
			args: []string{"mounter", "--target", "/nonexistent"},
			want: []string{"--source and --target are required"},
		},
		"a kept mounter without a state directory": {
			args: []string{"mounter", "--source", "/nonexistent", "--fuse-fd", "3"},
			want: []string{"--fuse-fd needs --state-dir"},
		},
		"a kept mounter with a target": {
			args: []string{"mounter", "--source", "/nonexistent", "--fuse-fd", "3", "--state-dir", "/x", "--target", "/y"},
			want: []string{"--target and --fuse-fd exclude each other"},
		},
		"a takeover without a FUSE descriptor": {
			args: []string{"mounter", "--source", "/nonexistent", "--target", "/y", "--takeover"},
			want: []string{"--state-dir and --takeover", "only with --fuse-fd"},
		},
		"a kept mounter on standard input": {
			args: []string{"mounter", "--source", "/nonexistent", "--fuse-fd", "0", "--state-dir", "/x"},
			want: []string{"--fuse-fd 0", "3 or above"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			err := run(t, tt.args, io.Discard)
			if err == nil {
				t.Fatalf("Run(%q) = nil, want an error", tt.args)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Run(%q) = %q, want it to mention %q", tt.args, err, w)
				}
			}
		})
	}
}

func TestRunVersionNeedsNoOtherFlag(t *testing.T) {
	if err := run(t, []string{"--version"}, io.Discard); err != nil {
		t.Errorf("Run(--version) = %v, want nil", err)
	}
}

// TestRunRegistersWithKubelet runs real mode with a registration folder and plays kubelet's
// plugin watcher: the registration socket reports the driver and its CSI socket as kubelet
// sees it, and goes when the driver stops.
func TestRunRegistersWithKubelet(t *testing.T) {
	tests := map[string]struct {
		kubeletEndpoint []string
		wantEndpoint    func(csiSock string) string
	}{
		"the CSI socket by default": {
			wantEndpoint: func(csiSock string) string { return csiSock },
		},
		"the path kubelet sees when given": {
			kubeletEndpoint: []string{"--kubelet-csi-endpoint", "/var/lib/kubelet/plugins/healer.example.com/csi.sock"},
			wantEndpoint:    func(string) string { return "/var/lib/kubelet/plugins/healer.example.com/csi.sock" },
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "rdreg") // short: socket paths must fit in 108 bytes
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			csiSock := filepath.Join(dir, "csi.sock")
			regDir := filepath.Join(dir, "registry")
			args := append([]string{
				"--endpoint", "unix://" + filepath.Join(dir, "addons.sock"), "--csi-endpoint", "unix://" + csiSock,
				"--state-dir", filepath.Join(dir, "state"), "--kubelet-registration-dir", regDir,
			}, tc.kubeletEndpoint...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			t.Cleanup(func() {
				if err := logging.ResetForTest(); err != nil {
					t.Error(err)
				}
			})
			go func() { done <- Run(ctx, args, io.Discard, io.Discard) }()

			regSock := filepath.Join(regDir, "healer.example.com-reg.sock")
			conn, err := grpc.NewClient("unix://"+regSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			client := registerapi.NewRegistrationClient(conn)
			var info *registerapi.PluginInfo
			deadline := time.Now().Add(20 * time.Second)
			for {
				callCtx, callCancel := context.WithTimeout(ctx, time.Second)
				info, err = client.GetInfo(callCtx, &registerapi.InfoRequest{})
				callCancel()
				if err == nil {
					break
				}
				select {
				case err := <-done:
					t.Fatalf("refdriver stopped before it registered: %v", err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("GetInfo on %s: %v", regSock, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if info.GetType() != registerapi.CSIPlugin || info.GetName() != "healer.example.com" || info.GetEndpoint() != tc.wantEndpoint(csiSock) {
				t.Errorf("GetInfo = %v, want a CSIPlugin healer.example.com at %s", info, tc.wantEndpoint(csiSock))
			}
			// What kubelet does next: call the driver on the endpoint it was given. Here that is
			// the CSI socket itself unless a path kubelet sees was given.
			if info.GetEndpoint() == csiSock {
				csiConn, err := grpc.NewClient("unix://"+info.GetEndpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = csiConn.Close() }()
				callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
				plugin, err := csi.NewIdentityClient(csiConn).GetPluginInfo(callCtx, &csi.GetPluginInfoRequest{})
				callCancel()
				if err != nil || plugin.GetName() != "healer.example.com" {
					t.Errorf("GetPluginInfo on the registered endpoint: %v, %v", plugin, err)
				}
			} else if _, err := os.Stat(csiSock); err != nil {
				t.Errorf("the CSI socket is not there while the driver is registered: %v", err)
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run after its context ended: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return within 20s of its context ending")
			}
			if _, err := os.Lstat(regSock); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the registration socket stays after the driver stopped: %v", err)
			}
		})
	}
}

// run runs Run with args, logging to stderr, and undoes its logging flags when the test ends.
func run(t *testing.T, args []string, stderr io.Writer) error {
	t.Helper()
	t.Cleanup(func() {
		if err := logging.ResetForTest(); err != nil {
			t.Error(err)
		}
	})
	return Run(context.Background(), args, io.Discard, stderr)
}

func TestLoggingFlags(t *testing.T) {
	base := []string{"--endpoint", "unix:///nonexistent/refdriver.sock", "--state-dir", "/nonexistent/refdriver-state"}
	tests := map[string]struct {
		args []string
		// wantErr are words of the error Run returns.
		wantErr []string
		// wantJSON: every line logged is a JSON object, and one of them is the start line.
		wantJSON bool
	}{
		"--logging-format json": {
			// An unknown mode is found after the start line.
			args:     append([]string{"--mode", "fake", "--logging-format", "json", "-v", "2"}, base...),
			wantErr:  []string{`"fake"`},
			wantJSON: true,
		},
		"unknown format": {
			args:    append([]string{"--logging-format", "yaml"}, base...),
			wantErr: []string{"--logging-format", `"yaml"`, "text, json"},
		},
		"mounter: unknown format": {
			args:    []string{"mounter", "--source", "/nonexistent/a", "--target", "/nonexistent/b", "--logging-format", "yaml"},
			wantErr: []string{"mounter", "--logging-format", `"yaml"`, "text, json"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(t, tc.args, &stderr)
			if err == nil {
				t.Fatalf("Run(%q) = nil, want an error", tc.args)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
			if tc.wantJSON {
				loggingtest.AssertJSONLines(t, stderr.String(), "Starting")
			}
		})
	}
}
