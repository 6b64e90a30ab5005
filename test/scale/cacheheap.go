package scale

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/volume-healer/volume-healer/scheduler/planner"
)

// cacheHeap is the live heap of the controller's storage informers, built in this process the
// way cmd/volume-healer builds them (same informers, same indexes, same transform), measured
// after a garbage collection: what the caches keep, without the garbage of filling them.
type cacheHeap struct {
	Name           string   `json:"name"`
	Volumes        int      `json:"volumes"`
	LiveBytes      int64    `json:"liveBytes"`
	BytesPerVolume float64  `json:"bytesPerVolume"`
	ProfileTop     []string `json:"profileTop,omitempty"`
}

// stripManagedFields is the transform the controller used before planner.CacheTransform:
// API objects without their managed fields. It is measured beside the shipped one.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// measureCacheHeap fills the controller's storage informers in this process with transform and
// returns their live heap. With profile set it writes a heap profile there and keeps its top.
func (c *cluster) measureCacheHeap(ctx context.Context, name string, transform toolscache.TransformFunc, volumes int, profile string) (cacheHeap, error) {
	out := cacheHeap{Name: name, Volumes: volumes}
	cfg := c.restConfig(newRequestStats(), nil, nil)
	// As the controller's informers read them.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return out, err
	}
	runtime.GC()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	factory := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(transform))
	if _, err := planner.InformerCaches(factory); err != nil {
		return out, err
	}
	return c.fillAndMeasure(ctx, factory, &before, out, profile)
}

// fillAndMeasure starts the informers of factory, waits for them, and measures what they keep
// beyond before.
func (c *cluster) fillAndMeasure(ctx context.Context, factory informers.SharedInformerFactory, before *runtime.MemStats, out cacheHeap, profile string) (cacheHeap, error) {
	var after runtime.MemStats
	stop := make(chan struct{})
	defer func() {
		close(stop)
		factory.Shutdown()
	}()
	factory.Start(stop)
	syncCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for typ, ok := range factory.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			return out, fmt.Errorf("%v informer did not sync", typ)
		}
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	out.LiveBytes = int64(after.HeapAlloc) - int64(before.HeapAlloc)
	out.BytesPerVolume = float64(out.LiveBytes) / float64(out.Volumes)
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return out, err
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			_ = f.Close()
			return out, err
		}
		if err := f.Close(); err != nil {
			return out, err
		}
		if out.ProfileTop, err = pprofTop(profile, 15, "-sample_index=inuse_space"); err != nil {
			return out, err
		}
	}
	runtime.KeepAlive(factory)
	return out, nil
}

// measureDecodedCacheHeap fills stores with the planner's indexes with volumes objects, each
// encoded and decoded with the protobuf the API server answers LIST and WATCH with (so every
// string is an allocation of its own, as in the controller) and passed through transform, and
// returns what they keep after a garbage collection. Without an API server to fill, it reaches
// the goal's size in seconds; the informers' own bookkeeping beyond the store is not included.
func (s *shapes) measureDecodedCacheHeap(name string, transform toolscache.TransformFunc, volumes int) (cacheHeap, error) {
	out := cacheHeap{Name: name, Volumes: volumes}
	runtime.GC()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	caches, err := s.decodedCaches(transform, volumes)
	if err != nil {
		return out, err
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	out.LiveBytes = int64(after.HeapAlloc) - int64(before.HeapAlloc)
	out.BytesPerVolume = float64(out.LiveBytes) / float64(volumes)
	runtime.KeepAlive(caches)
	return out, nil
}

// decodedCaches returns stores with the planner's indexes holding volumes (100 to a node), each
// object encoded as the API server sends it and decoded and transformed as an informer does.
func (s *shapes) decodedCaches(transform toolscache.TransformFunc, volumes int) (planner.Caches, error) {
	codec := protobuf.NewSerializer(clientgoscheme.Scheme, clientgoscheme.Scheme)
	decoded := func(obj kruntime.Object) (any, error) {
		kinds, _, err := clientgoscheme.Scheme.ObjectKinds(obj)
		if err != nil {
			return nil, err
		}
		obj.GetObjectKind().SetGroupVersionKind(kinds[0])
		raw, err := kruntime.Encode(codec, obj)
		if err != nil {
			return nil, err
		}
		back, _, err := codec.Decode(raw, nil, nil)
		if err != nil {
			return nil, err
		}
		return transform(back)
	}
	caches := planner.NewLocalCaches()
	pvs, vas, pvcs, nodes := caches.PVs, caches.VolumeAttachments, caches.PVCs, caches.Nodes
	const perNode = 100
	for n := 0; n*perNode < volumes; n++ {
		node := fmt.Sprintf("node-%05d", n)
		obj, err := decoded(nodeObject(node, n))
		if err != nil {
			return caches, err
		}
		if err := nodes.Add(obj); err != nil {
			return caches, err
		}
		for _, v := range s.newVolumes(node, min(perNode, volumes-n*perNode)) {
			pv, pvc, va := s.objects(v)
			for _, put := range []struct {
				store toolscache.Store
				obj   kruntime.Object
			}{{pvs, pv}, {pvcs, pvc}, {vas, va}} {
				obj, err := decoded(put.obj)
				if err != nil {
					return caches, err
				}
				if err := put.store.Add(obj); err != nil {
					return caches, err
				}
			}
		}
	}
	return caches, nil
}
