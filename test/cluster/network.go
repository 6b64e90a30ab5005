package cluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The node's network: a bridge of its own with the node's address, on which the CNI bridge
// plugin plugs every pod. The API server listens on the node's address, so that pods reach it
// through the kubernetes Service (kube-proxy) as they would in any cluster.
const (
	// bridgeName is the Linux bridge the node makes and removes.
	bridgeName = "vhcluster0"
	// serviceCIDR is the Services' range; the kubernetes Service takes its first address.
	serviceCIDR = "10.97.0.0/24"
	// kubernetesServiceIP is the first address of serviceCIDR.
	kubernetesServiceIP = "10.97.0.1"
)

// subnet is the node's private range: the node takes .1, pods the rest.
type subnet struct {
	cidr   string // 10.213.77.0/24
	nodeIP string // 10.213.77.1
	prefix int
}

func newSubnet(cidr string) (subnet, error) {
	ip, n, err := net.ParseCIDR(cidr)
	if err != nil || ip.To4() == nil {
		return subnet{}, fmt.Errorf("node subnet %q: want an IPv4 CIDR such as 10.213.77.0/24", cidr)
	}
	ones, _ := n.Mask.Size()
	node := n.IP.To4()
	node = net.IPv4(node[0], node[1], node[2], node[3]+1)
	return subnet{cidr: n.String(), nodeIP: node.String(), prefix: ones}, nil
}

// sysctls the node's programs change (kubelet: overcommit and panics; the CNI bridge plugin and
// kube-proxy: forwarding and bridge filtering, route_localnet), saved at the start and written
// back at the end.
var sysctls = []string{
	"vm/overcommit_memory",
	"kernel/panic",
	"kernel/panic_on_oops",
	"net/ipv4/ip_forward",
	"net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables",
	"net/bridge/bridge-nf-call-ip6tables",
}

// saveSysctls reads the current value of each of sysctls that exists.
func saveSysctls() map[string]string {
	saved := map[string]string{}
	for _, name := range sysctls {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", name)); err == nil {
			saved[name] = strings.TrimSpace(string(b))
		}
	}
	return saved
}

// restoreSysctls writes the saved values back and returns what it could not restore.
func restoreSysctls(saved map[string]string) error {
	var errs []error
	for name, value := range saved {
		path := filepath.Join("/proc/sys", name)
		if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == value {
			continue
		}
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", name, value, err))
		}
	}
	return errors.Join(errs...)
}

// changedSysctls lists the sysctls whose value differs from saved.
func changedSysctls(saved map[string]string) []string {
	var changed []string
	for name, value := range saved {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", name)); err == nil && strings.TrimSpace(string(b)) != value {
			changed = append(changed, fmt.Sprintf("%s=%s (was %s)", name, strings.TrimSpace(string(b)), value))
		}
	}
	return changed
}

// ipCmd runs ip with args.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// linkExists tells whether the network device name exists.
func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// createBridge makes the node's bridge with the node's address on it.
func createBridge(s subnet) error {
	if linkExists(bridgeName) {
		return fmt.Errorf("network device %s exists already: another node runs here, or one was not cleaned up (ip link del %s)", bridgeName, bridgeName)
	}
	if err := ipCmd("link", "add", bridgeName, "type", "bridge"); err != nil {
		return err
	}
	if err := ipCmd("addr", "add", fmt.Sprintf("%s/%d", s.nodeIP, s.prefix), "dev", bridgeName); err != nil {
		return err
	}
	return ipCmd("link", "set", bridgeName, "up")
}

// writeCNIConfig writes the bridge plugin's configuration: pods on the node's bridge, addresses
// from host-local (its state under dir), the node as their gateway. No masquerading: pods talk to
// the node only.
func writeCNIConfig(confDir, stateDir string, s subnet) error {
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return err
	}
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "volume-healer-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`, bridgeName, stateDir, s.cidr, s.nodeIP)
	return os.WriteFile(filepath.Join(confDir, "10-volume-healer.conflist"), []byte(conf), 0o644)
}
