package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"k8s.io/client-go/rest"

	"github.com/volume-healer/volume-healer/cmd/healer-sidecar/sidecar"
	"github.com/volume-healer/volume-healer/cmd/refdriver/driver"
)

// plugin is one simulated CSI node plugin pod: the reference driver on a UNIX socket and the
// healer sidecar in front of it on a loopback TCP port.
type plugin struct {
	node      string
	driverDir string
	socket    string
	port      int
	kube      *rest.Config

	mu     sync.Mutex
	driver *driver.Driver
	cancel context.CancelFunc
	done   chan error
	starts int
}

func newPlugin(dir, node string, kube *rest.Config) (*plugin, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &plugin{node: node, driverDir: filepath.Join(dir, node, "driver"), socket: filepath.Join(dir, node, "csi-addons.sock"), port: port, kube: kube}
	return p, os.MkdirAll(p.driverDir, 0o755)
}

// start runs the driver and the sidecar. Each start is a node plugin (re)start: the sidecar writes
// a new restart marker on the CSIAddonsNode.
func (p *plugin) start(ctx context.Context, volumes []driver.VolumeSpec) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := driver.New(driver.Options{StateDir: p.driverDir, DriverName: driverName, NodeID: p.node, SeedVolumes: []string{}})
	if err != nil {
		return err
	}
	for _, v := range volumes {
		if _, err := d.Volume(v.ID); err == nil {
			continue // already on disk from an earlier start
		}
		if _, err := d.AddVolume(v); err != nil {
			return err
		}
	}
	srv, err := driver.NewServer(d, driver.ServerOptions{Endpoint: "unix://" + p.socket})
	if err != nil {
		return err
	}
	p.starts++
	sc, err := sidecar.New(sidecar.Options{
		KubeConfig:     p.kube,
		NodeName:       p.node,
		Namespace:      pluginNamespace,
		PodUID:         fmt.Sprintf("%s-start-%d", p.node, p.starts),
		DriverEndpoint: "unix://" + p.socket,
		ListenAddress:  fmt.Sprintf("127.0.0.1:%d", p.port),
		Insecure:       true,
		MetricsAddress: "0",
	})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- srv.Start(runCtx) }()
	go func() { done <- sc.Start(runCtx) }()
	p.driver, p.cancel, p.done = d, cancel, done
	return nil
}

// stop ends the sidecar and the driver, as a crash or an upgrade of the pod would.
func (p *plugin) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.done
	<-p.done
	p.cancel = nil
}

func (p *plugin) drv() *driver.Driver {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.driver
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
