package scale

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/harness"
)

var (
	memorySmall = flag.Int("sidecar-memory-small", 1000, "volumes in the cluster at the first sidecar memory point")
	memoryLarge = flag.Int("sidecar-memory-large", 40000, "volumes in the cluster at the second sidecar memory point")
	memoryBin   = flag.String("sidecar-memory-binary", "", "measure this healer-sidecar binary (an older build, to compare) instead of the tree's")
)

// Limits of TestSidecarMemoryFollowsItsNode: the resident set at the large point may exceed the
// one at the small point by this share, or by this many bytes, whichever is more. A sidecar that
// held a view of every PersistentVolume grew by about 2 KB per PV of the cluster.
const (
	sidecarMemoryShare = 0.15
	sidecarMemoryBytes = 4 << 20
)

// sidecarVolumes is how many volumes the measured sidecar's node holds at both points.
const sidecarVolumes = 100

// TestSidecarMemoryFollowsItsNode runs the real sidecar binary for a node with 100 volumes, once
// in a cluster of -sidecar-memory-small volumes (1,000) and once in a cluster of
// -sidecar-memory-large (40,000), and probes every volume of its node each time: its resident
// set must be the same within sidecarMemoryShare or sidecarMemoryBytes, since a sidecar must cost
// what its node holds, not what the cluster holds. The other volumes are PersistentVolumes and
// VolumeAttachments of other nodes, as realistic as the scale harness's. docs/performance.md
// reports the figures (-v shows them).
func TestSidecarMemoryFollowsItsNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver and etcd and creates tens of thousands of objects; run without -short")
	}
	if *memorySmall < sidecarVolumes || *memoryLarge <= *memorySmall {
		t.Fatalf("-sidecar-memory-small=%d, -sidecar-memory-large=%d: want %d <= small < large", *memorySmall, *memoryLarge, sidecarVolumes)
	}
	ctx := t.Context()
	dir := t.TempDir()
	c, err := startCluster(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.stop() })
	bin := *memoryBin
	if bin == "" {
		bins, err := harness.Build(harness.BuildOptions{NodePlugin: true})
		if err != nil {
			t.Fatal(err)
		}
		bin = bins.Sidecar
	}
	procs := harness.NewProcesses()
	t.Cleanup(procs.KillAll)

	const node = "node-measured"
	mine := c.newVolumes(node, sidecarVolumes)
	if err := c.createNodes(ctx, []string{node}); err != nil {
		t.Fatal(err)
	}
	if err := c.createVolumes(ctx, mine, 32, nil); err != nil {
		t.Fatal(err)
	}
	endpoint := startMeasuredDriver(t, mine)

	others := 0
	grow := func(total int) {
		t.Helper()
		start := time.Now()
		var vols []volume
		for sidecarVolumes+others+len(vols) < total {
			name := fmt.Sprintf("node-other-%04d", (others+len(vols))/100)
			vols = append(vols, c.newVolumes(name, min(100, total-sidecarVolumes-others-len(vols)))...)
		}
		if err := c.createAttachedPVs(ctx, vols, 32); err != nil {
			t.Fatal(err)
		}
		others += len(vols)
		t.Logf("%d volumes in the cluster (%d added in %s)", sidecarVolumes+others, len(vols), time.Since(start).Round(time.Second))
	}

	measure := func(point string) residentSet {
		t.Helper()
		proc, addr := startMeasuredSidecar(t, c, procs, bin, endpoint, node, filepath.Join(dir, "sidecar-"+point+".log"))
		defer func() { _ = proc.Stop(10 * time.Second) }()
		probeAll(t, c, addr, node, mine)
		// The resident set after the sweep, settled: the median of samples a second apart.
		var samples []residentSet
		for range 5 {
			time.Sleep(time.Second)
			rs, err := processMemory(proc.Pid())
			if err != nil {
				t.Fatal(err)
			}
			samples = append(samples, rs)
		}
		slices.SortFunc(samples, func(a, b residentSet) int { return int(a.Total - b.Total) })
		rs := samples[len(samples)/2]
		t.Logf("sidecar of %s, %d volumes on its node, %d in the cluster: RSS %.1f MiB (anon %.1f MiB)",
			node, sidecarVolumes, sidecarVolumes+others, float64(rs.Total)/(1<<20), float64(rs.Anon)/(1<<20))
		return rs
	}

	grow(*memorySmall)
	small := measure("small")
	grow(*memoryLarge)
	large := measure("large")

	limit := max(int64(float64(small.Total)*(1+sidecarMemoryShare)), small.Total+sidecarMemoryBytes)
	if large.Total > limit {
		t.Errorf("the sidecar's resident set grew with the cluster: %.1f MiB at %d volumes, %.1f MiB at %d (limit %.1f MiB); "+
			"it should hold only what its node's %d volumes need",
			float64(small.Total)/(1<<20), *memorySmall, float64(large.Total)/(1<<20), *memoryLarge, float64(limit)/(1<<20), sidecarVolumes)
	}
}

// createAttachedPVs creates, for each volume, its PV and its attached VolumeAttachment, with
// workers requests at a time: what a sidecar that watched PVs or VolumeAttachments would hold.
func (c *cluster) createAttachedPVs(ctx context.Context, vols []volume, workers int) error {
	return forEach(ctx, len(vols), workers, func(ctx context.Context, i int) error {
		pv, _, va := c.objects(vols[i])
		if _, err := c.kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("PV %s: %w", pv.Name, err)
		}
		if _, err := c.kube.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("VolumeAttachment of %s: %w", pv.Name, err)
		}
		return nil
	})
}

// startMeasuredDriver serves the reference driver, in this process, with vols staged, and
// returns its socket.
func startMeasuredDriver(t *testing.T, vols []volume) string {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "vhmem")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	handles := make([]string, len(vols))
	for i, v := range vols {
		handles[i] = v.handle
	}
	d, err := simulated.New(simulated.Options{StateDir: t.TempDir(), Identity: control.Identity{DriverName: driverName}, SeedVolumes: handles})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "unix://" + filepath.Join(sockDir, "csi-addons.sock")
	srv, err := simulated.NewServer(d, simulated.ServerOptions{Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return endpoint
}

// startMeasuredSidecar starts the sidecar binary for node and returns it with the address it
// serves, once it has registered.
func startMeasuredSidecar(t *testing.T, c *cluster, procs *harness.Processes, bin, driverEndpoint, node, logPath string) (*harness.Process, string) {
	t.Helper()
	args := []string{
		"--kubeconfig", c.env.Kubeconfig,
		"--driver-endpoint", driverEndpoint,
		"--node-name", node,
		"--namespace", pluginNamespace,
		"--pod-uid", "uid-" + filepath.Base(logPath),
		"--listen", "127.0.0.1:0",
		"--insecure",
		"--metrics-address", "0",
	}
	started := time.Now()
	proc, err := procs.Start("sidecar of "+node, bin, args, nil, logPath)
	if err != nil {
		t.Fatal(err)
	}
	var addr string
	err = harness.WaitFor(t.Context(), time.Minute, "the sidecar of "+node+" to register", func() (bool, string) {
		if !proc.Running() {
			return true, "exited"
		}
		var obj csiaddonsv1alpha1.CSIAddonsNode
		key := client.ObjectKey{Namespace: pluginNamespace, Name: sidecar.DefaultCSIAddonsNodeName(node, driverName)}
		if err := c.crc.Get(t.Context(), key, &obj); err != nil {
			return false, err.Error()
		}
		at, ok := annotations.HealerRestartTime(obj.Annotations[annotations.HealerRestart])
		addr = obj.Annotations[annotations.Endpoint]
		return ok && !at.Before(started.Add(-time.Second)) && strings.HasSuffix(obj.Annotations[annotations.HealerRestart], "/uid-"+filepath.Base(logPath)), "not yet"
	})
	if err == nil && !proc.Running() {
		err = fmt.Errorf("the sidecar exited (%s):\n%s", proc.ExitStatus(), proc.LogTail(20))
	}
	if err != nil {
		t.Fatal(err)
	}
	return proc, addr
}

// probeAll probes every volume of vols at the sidecar at addr with the controller's token for
// node, as a restart sweep does.
func probeAll(t *testing.T, c *cluster, addr, node string, vols []volume) {
	t.Helper()
	tr, err := c.env.Clientset.CoreV1().ServiceAccounts(harness.ControllerNamespace).CreateToken(t.Context(), harness.ControllerAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{healerv1alpha1.NodeTokenAudience(healerv1alpha1.DefaultTokenAudience, node)},
		}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	healer := healerv1alpha1.NewNodeHealerClient(conn)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+tr.Status.Token)
	for _, v := range vols {
		if _, err := healer.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: v.pv}); err != nil {
			t.Fatalf("probe of %s at the sidecar of %s: %v", v.pv, node, err)
		}
	}
}
