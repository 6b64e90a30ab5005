package harness

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// Proxy relays TCP connections from a loopback port to a target address, and can cut them: a
// process that reaches the API server through it can be cut off from the API server alone, while
// it still reaches everything else. A cut resets the connections in relay and every new one, so
// the process's requests fail at once, as they do when a network partition is reported to it.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartProxy relays a free loopback port to target (host:port) until Close.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy to %s: %w", target, err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut resets every connection in relay, and every new one until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore relays new connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Close stops the proxy and its connections, and waits for its goroutines.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

// track registers c, or closes it when the proxy is cut.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	_ = c.Close()
}

// relay copies between the client c and a new connection to the target until either side ends.
func (p *Proxy) relay(c net.Conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	up, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	// One direction ended: end both, which ends the other copy.
	_ = c.Close()
	_ = up.Close()
	<-done
}

// ProxiedKubeconfig writes to path a copy of the kubeconfig file at src whose clusters are reached
// through the proxy, and returns the proxy. Servers must all be the same host:port.
func ProxiedKubeconfig(src, path string) (*Proxy, error) {
	kc, err := clientcmd.LoadFromFile(src)
	if err != nil {
		return nil, err
	}
	var target string
	for name, cluster := range kc.Clusters {
		u, err := url.Parse(cluster.Server)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: cluster %s: server %q: %w", src, name, cluster.Server, err)
		}
		if target != "" && target != u.Host {
			return nil, fmt.Errorf("kubeconfig %s: clusters at %s and %s; want one server", src, target, u.Host)
		}
		target = u.Host
	}
	if target == "" {
		return nil, errors.New("kubeconfig " + src + " names no cluster")
	}
	p, err := StartProxy(target)
	if err != nil {
		return nil, err
	}
	for _, cluster := range kc.Clusters {
		u, _ := url.Parse(cluster.Server)
		u.Host = p.Addr()
		cluster.Server = u.String()
		// The API server's certificate names the loopback address, not the port: it still fits.
	}
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}
