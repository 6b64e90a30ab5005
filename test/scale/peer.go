package scale

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// listEverything does what a node plugin that heals at its own start does today (ceph-csi's
// in-driver healer): one LIST of every VolumeAttachment in the cluster, then for each attachment
// of its driver on its node a GET of the PersistentVolume, of the VolumeAttachment and of the
// node-stage Secret, one goroutine per volume, at most peerConcurrency at once (above that the
// harness's own client times out its TLS handshakes on two shared cores, and a real node plugin
// would meet the same). It returns the number of volumes it found on the node. The requests go
// through a client counted into stats.
func (c *cluster) listEverything(ctx context.Context, stats *requestStats, node string) (int, time.Duration, error) {
	// client-go's default JSON, as the peer uses it; no rate limit, so that the count is not
	// spread over minutes (the default limit is computed in the report instead).
	kube, err := kubernetes.NewForConfig(c.restConfig(stats, nil, nil))
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	vas, err := kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, fmt.Errorf("list VolumeAttachments: %w", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	slots := make(chan struct{}, peerConcurrency)
	var firstErr error
	found := 0
	for i := range vas.Items {
		va := &vas.Items[i]
		if va.Spec.Attacher != driverName || va.Spec.NodeName != node || va.Spec.Source.PersistentVolumeName == nil {
			continue
		}
		found++
		pvName, vaName := *va.Spec.Source.PersistentVolumeName, va.Name
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			err := func() error {
				pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if _, err := kube.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{}); err != nil {
					return err
				}
				if ref := pv.Spec.CSI.NodeStageSecretRef; ref != nil {
					if _, err := kube.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{}); err != nil {
						return err
					}
				}
				return nil
			}()
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return found, time.Since(start), firstErr
}

// peerConcurrency bounds the list-everything approach's GETs in flight: as many as a node of
// figure 1's first size has volumes, so that its figure is the unbounded one there.
const peerConcurrency = 1000

// defaultRateLimitSeconds is how long n requests take under client-go's default client-side
// rate limit (5 per second after a burst of 10), which a client that does not raise it gets.
func defaultRateLimitSeconds(n int64) float64 {
	const qps, burst = 5, 10
	if n <= burst {
		return 0
	}
	return float64(n-burst) / qps
}
