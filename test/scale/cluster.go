package scale

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/test/fixtures"
	"github.com/volume-healer/volume-healer/test/harness"
)

// Names shared by the harness's objects.
const (
	driverName      = "rbd.csi.ceph.com"
	pluginNamespace = "csi-rbd"
	secretNamespace = "rook-ceph"
	secretName      = "rook-csi-rbd-node"
	// nodeLabel on each PersistentVolume names the node it is attached to, as some
	// provisioners' labels do.
	nodeLabel = "scale.volume-healer.io/node"
	// appNamespaces is how many namespaces the claims spread over.
	appNamespaces = 20
)

// clientQPS lifts client-go's default rate limit (5 requests per second) off the harness's
// clients: the apiserver's own flow control is the limit that matters here.
const clientQPS = 1e6

// apiserverArgs let the apiserver take the harness's concurrent writes. Every client here (the
// harness, the controller through its proxy, the sidecars) reaches the apiserver as its
// administrator, whose requests priority and fairness exempts.
var apiserverArgs = map[string]string{
	"max-requests-inflight":          "1600",
	"max-mutating-requests-inflight": "800",
}

// etcdArgs let etcd hold 300,000 volumes and their history: its default backend quota, 2 GiB,
// is about what they take.
var etcdArgs = map[string]string{
	"quota-backend-bytes": strconv.Itoa(8 << 30),
}

// cluster is the harness's cluster with the objects every run needs, and clients whose requests are
// counted.
type cluster struct {
	env *harness.Cluster
	dir string
	// base reaches the apiserver as its administrator; every client of the harness and of the
	// simulated sidecars wraps it.
	base http.RoundTripper
	// harness counts the harness's own requests (object creation, the peer approach excepted).
	harness *requestStats
	kube    kubernetes.Interface
	crc     client.Client
	*shapes
}

func startCluster(ctx context.Context, dir string) (*cluster, error) {
	env, err := harness.StartCluster(ctx, harness.ClusterOptions{Dir: dir, APIServerArgs: apiserverArgs, EtcdArgs: etcdArgs})
	if err != nil {
		return nil, err
	}
	c := &cluster{env: env, dir: dir, harness: newRequestStats()}
	if err := c.init(ctx); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return c, nil
}

func (c *cluster) stop() error { return c.env.Stop() }

// restConfig returns a configuration that reaches the apiserver as its administrator through the
// shared transport, counting into stats, without a client-side rate limit.
func (c *cluster) restConfig(stats *requestStats, narrow func(*http.Request, requestKey) *http.Request, observe func(requestKey, *http.Response, error)) *rest.Config {
	return &rest.Config{
		Host:      c.env.Config.Host,
		Transport: &countingTransport{base: c.base, stats: stats, narrow: narrow, observe: observe},
		QPS:       clientQPS,
		Burst:     int(clientQPS),
		UserAgent: "volume-healer-scale",
	}
}

func (c *cluster) init(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	base, err := rest.TransportFor(c.env.Config)
	if err != nil {
		return fmt.Errorf("apiserver transport: %w", err)
	}
	c.base = base
	cfg := c.restConfig(c.harness, nil, nil)
	// Protobuf halves the apiserver's decoding work for the many creates.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	if c.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if c.crc, err = client.New(c.restConfig(c.harness, nil, nil), client.Options{Scheme: c.env.Scheme}); err != nil {
		return err
	}

	if c.shapes, err = newShapes(); err != nil {
		return err
	}
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pluginNamespace}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretNamespace}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: secretName},
			Data: map[string][]byte{"userID": []byte("csi-rbd-node"), "userKey": []byte("AQBvA1xnAAAAABAAUnh0bFBhbGFjZWhvbGRlcktleT09")}},
		c.driver.DeepCopy(),
	}
	for i := range appNamespaces {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNamespace(i)}})
	}
	for _, sc := range c.storageClasses {
		objs = append(objs, sc.DeepCopy())
	}
	for _, obj := range objs {
		if err := c.crc.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %T %s: %w", obj, obj.GetName(), err)
		}
	}
	return nil
}

// createNodes creates the Node objects.
func (c *cluster) createNodes(ctx context.Context, names []string) error {
	return forEach(ctx, len(names), 16, func(ctx context.Context, i int) error {
		_, err := c.kube.CoreV1().Nodes().Create(ctx, nodeObject(names[i], i), metav1.CreateOptions{})
		return ignoreExists(err)
	})
}

// createVolumes creates each volume's objects as provisioning, binding and attaching leave them,
// with workers requests at a time. Each volume costs six writes: create and status update of
// the PV, the PVC and the VolumeAttachment. progress, when set, is called with the number done.
func (c *cluster) createVolumes(ctx context.Context, vols []volume, workers int, progress func(int)) error {
	var done atomic.Int64
	err := forEach(ctx, len(vols), workers, func(ctx context.Context, i int) error {
		if err := c.createVolume(ctx, vols[i]); err != nil {
			return fmt.Errorf("volume %s: %w", vols[i].pv, err)
		}
		if n := done.Add(1); progress != nil && n%1000 == 0 {
			progress(int(n))
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The attach/detach controller lists each attached volume in its Node's status: one update
	// per node here.
	byNode := map[string][]string{}
	var nodes []string
	for _, v := range vols {
		if _, ok := byNode[v.node]; !ok {
			nodes = append(nodes, v.node)
		}
		byNode[v.node] = append(byNode[v.node], v.handle)
	}
	return forEach(ctx, len(nodes), workers, func(ctx context.Context, i int) error {
		return fixtures.ReportAttached(ctx, c.kube, nodes[i], driverName, byNode[nodes[i]]...)
	})
}

func (c *cluster) createVolume(ctx context.Context, v volume) error {
	pv, pvc, va := c.objects(v)
	created, err := c.kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Status = pv.Status
	if _, err := c.kube.CoreV1().PersistentVolumes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	createdPVC, err := c.kube.CoreV1().PersistentVolumeClaims(v.namespace).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	createdPVC.Status = pvc.Status
	if _, err := c.kube.CoreV1().PersistentVolumeClaims(v.namespace).UpdateStatus(ctx, createdPVC, metav1.UpdateOptions{}); err != nil {
		return err
	}
	createdVA, err := c.kube.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	createdVA.Status = va.Status
	_, err = c.kube.StorageV1().VolumeAttachments().UpdateStatus(ctx, createdVA, metav1.UpdateOptions{})
	return err
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// forEach calls f for 0..n-1 with at most workers calls at a time, and returns the first error;
// after an error no new call starts.
func forEach(parent context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range min(workers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return parent.Err()
}
