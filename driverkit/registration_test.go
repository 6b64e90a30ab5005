package driverkit_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/volume-healer/volume-healer/driverkit"
)

// shortDir returns a new folder with a short path: a UNIX socket path must fit in 108 bytes,
// and t.TempDir's carry the test's name.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// regLogLines collects what a logger wrote.
type regLogLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *regLogLines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, prefix+" "+args)
}

func (l *regLogLines) find(substrs ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.lines, func(line string) bool {
		for _, s := range substrs {
			if !strings.Contains(line, s) {
				return false
			}
		}
		return true
	})
}

// registrar is a running KubeletRegistrar and a client that plays kubelet's plugin watcher.
type registrar struct {
	r       *driverkit.KubeletRegistrar
	client  registerapi.RegistrationClient
	cancel  context.CancelFunc
	done    chan error
	logs    *regLogLines
	reports chan driverkit.RegistrationStatus
}

func startRegistrar(t *testing.T, opts driverkit.KubeletRegistration) *registrar {
	t.Helper()
	reg := &registrar{logs: &regLogLines{}, done: make(chan error, 1), reports: make(chan driverkit.RegistrationStatus, 8)}
	opts.Logger = funcr.New(reg.logs.add, funcr.Options{Verbosity: 2})
	opts.OnStatus = func(s driverkit.RegistrationStatus) { reg.reports <- s }
	r, err := driverkit.NewKubeletRegistrar(opts)
	if err != nil {
		t.Fatalf("NewKubeletRegistrar: %v", err)
	}
	reg.r = r
	ctx, cancel := context.WithCancel(context.Background())
	reg.cancel = cancel
	go func() { reg.done <- r.Start(ctx) }()
	t.Cleanup(func() { reg.stop(t) })

	// As kubelet's plugin watcher does: dial the socket file it found in the folder.
	conn, err := grpc.NewClient("unix://"+r.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	reg.client = registerapi.NewRegistrationClient(conn)
	return reg
}

// stop ends the registrar's context and waits for Start to return.
func (reg *registrar) stop(t *testing.T) {
	t.Helper()
	reg.cancel()
	select {
	case err, ok := <-reg.done:
		if ok && err != nil {
			t.Errorf("Start returned %v after its context ended, want nil", err)
		}
		if ok {
			close(reg.done)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return within 10s of its context ending")
	}
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestKubeletRegistrationGetInfo(t *testing.T) {
	tests := map[string]struct {
		versions     []string
		wantVersions []string
	}{
		"versions default to CSI 1.0.0": {wantVersions: []string{"1.0.0"}},
		"versions given are reported":   {versions: []string{"1.0.0", "1.13.0"}, wantVersions: []string{"1.0.0", "1.13.0"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := shortDir(t)
			reg := startRegistrar(t, driverkit.KubeletRegistration{
				Dir:        dir,
				DriverName: "healer.example.com",
				Endpoint:   "/var/lib/kubelet/plugins/healer.example.com/csi.sock",
				Versions:   tc.versions,
			})
			if want := filepath.Join(dir, "healer.example.com-reg.sock"); reg.r.SocketPath() != want {
				t.Errorf("socket path %s, want %s", reg.r.SocketPath(), want)
			}
			info, err := reg.client.GetInfo(callCtx(t), &registerapi.InfoRequest{})
			if err != nil {
				t.Fatalf("GetInfo: %v", err)
			}
			if info.GetType() != registerapi.CSIPlugin {
				t.Errorf("type %q, want %q", info.GetType(), registerapi.CSIPlugin)
			}
			if info.GetName() != "healer.example.com" {
				t.Errorf("name %q, want healer.example.com", info.GetName())
			}
			if info.GetEndpoint() != "/var/lib/kubelet/plugins/healer.example.com/csi.sock" {
				t.Errorf("endpoint %q, want the CSI socket as kubelet sees it", info.GetEndpoint())
			}
			if !slices.Equal(info.GetSupportedVersions(), tc.wantVersions) {
				t.Errorf("versions %q, want %q", info.GetSupportedVersions(), tc.wantVersions)
			}
			if _, ok := reg.r.Status(); ok {
				t.Error("Status reports a registration status before kubelet sent one")
			}
		})
	}
}

func TestKubeletRegistrationStatus(t *testing.T) {
	tests := map[string]struct {
		status  *registerapi.RegistrationStatus
		wantLog []string
	}{
		"a registration kubelet accepted is logged": {
			status:  &registerapi.RegistrationStatus{PluginRegistered: true},
			wantLog: []string{"Registered with kubelet", "healer.example.com"},
		},
		"a registration kubelet refused is logged as an error with its reason": {
			status:  &registerapi.RegistrationStatus{PluginRegistered: false, Error: "no supported CSI version"},
			wantLog: []string{"Kubelet refused the driver's registration", "no supported CSI version"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			reg := startRegistrar(t, driverkit.KubeletRegistration{
				Dir:        shortDir(t),
				DriverName: "healer.example.com",
				Endpoint:   "/var/lib/kubelet/plugins/healer.example.com/csi.sock",
			})
			if _, err := reg.client.NotifyRegistrationStatus(callCtx(t), tc.status); err != nil {
				t.Fatalf("NotifyRegistrationStatus: %v", err)
			}
			want := driverkit.RegistrationStatus{Registered: tc.status.GetPluginRegistered(), Error: tc.status.GetError()}
			select {
			case got := <-reg.reports:
				if got.Registered != want.Registered || got.Error != want.Error || got.At.IsZero() {
					t.Errorf("OnStatus got %+v, want %+v with a time", got, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("OnStatus was not called")
			}
			got, ok := reg.r.Status()
			if !ok || got.Registered != want.Registered || got.Error != want.Error {
				t.Errorf("Status() = %+v, %v; want %+v, true", got, ok, want)
			}
			if !reg.logs.find(tc.wantLog...) {
				t.Errorf("no log line with %q in:\n%s", tc.wantLog, strings.Join(reg.logs.lines, "\n"))
			}
		})
	}
}

func TestKubeletRegistrationSocketRemovedWhenDone(t *testing.T) {
	reg := startRegistrar(t, driverkit.KubeletRegistration{
		Dir:        shortDir(t),
		DriverName: "healer.example.com",
		Endpoint:   "/var/lib/kubelet/plugins/healer.example.com/csi.sock",
	})
	if _, err := reg.client.GetInfo(callCtx(t), &registerapi.InfoRequest{}); err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	reg.stop(t)
	if _, err := os.Lstat(reg.r.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the registration socket is still there after the context ended (kubelet keeps the driver registered): %v", err)
	}
}

func TestKubeletRegistrationReplacesStaleSocket(t *testing.T) {
	dir := shortDir(t)
	opts := driverkit.KubeletRegistration{
		Dir:        dir,
		DriverName: "healer.example.com",
		Endpoint:   "/var/lib/kubelet/plugins/healer.example.com/csi.sock",
	}
	// A socket file nobody serves, as an instance killed with SIGKILL leaves it.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: opts.SocketPath(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	_ = stale.Close()
	if _, err := os.Lstat(opts.SocketPath()); err != nil {
		t.Fatalf("the stale socket is not there: %v", err)
	}

	reg := startRegistrar(t, opts)
	info, err := reg.client.GetInfo(callCtx(t), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo through the replaced socket: %v", err)
	}
	if info.GetName() != "healer.example.com" {
		t.Errorf("name %q, want healer.example.com", info.GetName())
	}
	if !reg.logs.find("Replaced a stale registration socket") {
		t.Errorf("replacing the stale socket was not logged:\n%s", strings.Join(reg.logs.lines, "\n"))
	}
}

func TestKubeletRegistrationLeavesAnotherInstancesSocket(t *testing.T) {
	dir := shortDir(t)
	opts := driverkit.KubeletRegistration{
		Dir:        dir,
		DriverName: "healer.example.com",
		Endpoint:   "/var/lib/kubelet/plugins/healer.example.com/csi.sock",
	}
	old := startRegistrar(t, opts)
	// A new instance starts before the old one stopped, as a pod replaced in a rollout may.
	cur := startRegistrar(t, opts)
	old.stop(t)
	if _, err := os.Lstat(opts.SocketPath()); err != nil {
		t.Fatalf("the old instance removed the new instance's socket: %v", err)
	}
	if _, err := cur.client.GetInfo(callCtx(t), &registerapi.InfoRequest{}); err != nil {
		t.Errorf("GetInfo from the new instance: %v", err)
	}
}

func TestKubeletRegistrationRefusesBadOptions(t *testing.T) {
	dir := shortDir(t)
	notSocket := driverkit.KubeletRegistration{Dir: dir, DriverName: "plain.example.com", Endpoint: "/csi.sock"}
	if err := os.WriteFile(notSocket.SocketPath(), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		opts        driverkit.KubeletRegistration
		wantInvalid bool
		wantMsg     string
	}{
		"no driver name":              {opts: driverkit.KubeletRegistration{Dir: dir, Endpoint: "/csi.sock"}, wantInvalid: true, wantMsg: "DriverName is required"},
		"a slash in the name":         {opts: driverkit.KubeletRegistration{Dir: dir, DriverName: "a/b", Endpoint: "/csi.sock"}, wantInvalid: true, wantMsg: "not a CSI driver name"},
		"no endpoint":                 {opts: driverkit.KubeletRegistration{Dir: dir, DriverName: "healer.example.com"}, wantInvalid: true, wantMsg: "Endpoint is required"},
		"an endpoint URL":             {opts: driverkit.KubeletRegistration{Dir: dir, DriverName: "healer.example.com", Endpoint: "unix:///csi.sock"}, wantInvalid: true, wantMsg: "absolute path"},
		"a socket path too long":      {opts: driverkit.KubeletRegistration{Dir: filepath.Join(dir, strings.Repeat("d", 100)), DriverName: "healer.example.com", Endpoint: "/csi.sock"}, wantInvalid: true, wantMsg: "shorter Dir"},
		"a file that is not a socket": {opts: notSocket, wantMsg: "is not a socket"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := driverkit.NewKubeletRegistrar(tc.opts)
			if err == nil {
				t.Fatal("NewKubeletRegistrar succeeded")
			}
			if errors.Is(err, driverkit.ErrInvalidOptions) != tc.wantInvalid {
				t.Errorf("errors.Is(%v, ErrInvalidOptions) = %v, want %v", err, !tc.wantInvalid, tc.wantInvalid)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantMsg)
			}
		})
	}
	if b, err := os.ReadFile(notSocket.SocketPath()); err != nil || string(b) != "x" {
		t.Errorf("the file that is not a socket was changed: %q, %v", b, err)
	}
}
