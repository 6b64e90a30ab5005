package harness

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
)

// nextPort is where FreeAddr looks next. Ports come from below Linux's ephemeral range (32768 and
// up), so that the many outgoing connections of a run do not take a port that a node plugin or
// controller is about to listen on again.
var nextPort atomic.Int64

// FreeAddr returns a loopback address, 127.0.0.1:port, with a port that nothing listened on a
// moment ago. It is the one free-port helper of the test suites.
func FreeAddr() (string, error) {
	// Runs started at the same time on one machine start at different places.
	nextPort.CompareAndSwap(0, int64(20000+os.Getpid()%8000))
	for range 2000 {
		port := int(nextPort.Add(1))
		if port >= 32768 {
			nextPort.Store(20000)
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		_ = ln.Close()
		return addr, nil
	}
	return "", errors.New("no free loopback port between 20000 and 32767")
}
