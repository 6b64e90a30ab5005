package propagation

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Objects is what the webhook reads of the cluster for one pod. Each method returns an error
// wrapping ErrNotFound when the object does not exist; StorageClass returns nil, nil then, since a
// class named by a claim may be gone without harm.
type Objects interface {
	Namespace(ctx context.Context, name string) (*corev1.Namespace, error)
	Claim(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error)
	PersistentVolume(ctx context.Context, name string) (*corev1.PersistentVolume, error)
	StorageClass(name string) (*storagev1.StorageClass, error)
	// CSIDriver reports whether a CSIDriver object of that name exists: a claim not bound yet
	// will be a CSI volume when its StorageClass's provisioner is one.
	CSIDriver(name string) (bool, error)
}

// Caches reads Objects from the controller's informer caches. A claim, PersistentVolume or
// namespace the caches miss is read from the API server once, when Client is set: a
// StatefulSet creates a pod a moment after its claim, before the claim's watch event may have
// reached the cache.
type Caches struct {
	// Namespaces, Claims and Volumes are keyed by namespace/name or name, as informers key them.
	// Required.
	Namespaces, Claims, Volumes cache.Store
	// StorageClasses and CSIDrivers are keyed by name. Required.
	StorageClasses, CSIDrivers cache.Store
	// ClaimFrom and VolumeFrom turn what Claims and Volumes hold into API objects (the
	// controller's caches hold compact records). Default: the objects themselves.
	ClaimFrom  func(any) *corev1.PersistentVolumeClaim
	VolumeFrom func(any) *corev1.PersistentVolume
	// Client reads what the caches miss. Default nil: a miss is not found.
	Client kubernetes.Interface
}

var _ Objects = (*Caches)(nil)

// get looks key up in store, then, on a miss, with read; absent when neither has it.
func get[T any](ctx context.Context, store cache.Store, key string, from func(any) *T, read func(context.Context) (*T, error)) (*T, error) {
	obj, ok, err := store.GetByKey(key)
	if err != nil {
		return nil, err
	}
	if ok {
		if o := from(obj); o != nil {
			return o, nil
		}
		return nil, fmt.Errorf("the cache holds a %T for %s", obj, key)
	}
	if read == nil {
		return nil, ErrNotFound
	}
	o, err := read(ctx)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w (read from the API server after a cache miss)", ErrNotFound)
	}
	return o, err
}

func asIs[T any](obj any) *T {
	o, _ := obj.(*T)
	return o
}

// Namespace implements Objects.
func (c *Caches) Namespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	var read func(context.Context) (*corev1.Namespace, error)
	if c.Client != nil {
		read = func(ctx context.Context) (*corev1.Namespace, error) {
			return c.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		}
	}
	ns, err := get(ctx, c.Namespaces, name, asIs[corev1.Namespace], read)
	if err != nil {
		return nil, fmt.Errorf("Namespace %s: %w", name, err)
	}
	return ns, nil
}

// Claim implements Objects.
func (c *Caches) Claim(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	from := c.ClaimFrom
	if from == nil {
		from = asIs[corev1.PersistentVolumeClaim]
	}
	var read func(context.Context) (*corev1.PersistentVolumeClaim, error)
	if c.Client != nil {
		read = func(ctx context.Context) (*corev1.PersistentVolumeClaim, error) {
			return c.Client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		}
	}
	pvc, err := get(ctx, c.Claims, namespace+"/"+name, from, read)
	if err != nil {
		return nil, fmt.Errorf("PersistentVolumeClaim %s/%s: %w", namespace, name, err)
	}
	return pvc, nil
}

// PersistentVolume implements Objects.
func (c *Caches) PersistentVolume(ctx context.Context, name string) (*corev1.PersistentVolume, error) {
	from := c.VolumeFrom
	if from == nil {
		from = asIs[corev1.PersistentVolume]
	}
	var read func(context.Context) (*corev1.PersistentVolume, error)
	if c.Client != nil {
		read = func(ctx context.Context) (*corev1.PersistentVolume, error) {
			return c.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		}
	}
	pv, err := get(ctx, c.Volumes, name, from, read)
	if err != nil {
		return nil, fmt.Errorf("PersistentVolume %s: %w", name, err)
	}
	return pv, nil
}

// StorageClass implements Objects.
func (c *Caches) StorageClass(name string) (*storagev1.StorageClass, error) {
	sc, err := get(context.Background(), c.StorageClasses, name, asIs[storagev1.StorageClass], nil)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("StorageClass %s: %w", name, err)
	}
	return sc, nil
}

// CSIDriver implements Objects.
func (c *Caches) CSIDriver(name string) (bool, error) {
	_, ok, err := c.CSIDrivers.GetByKey(name)
	if err != nil {
		return false, fmt.Errorf("CSIDriver %s: %w", name, err)
	}
	return ok, nil
}
