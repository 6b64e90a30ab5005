package scale

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	kuuid "k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The etcd fill writes volumes' objects straight into the apiserver's etcd, as the apiserver
// stores them: the protobuf storage encoding ("k8s\x00" and a runtime.Unknown carrying the
// object), under the keys the apiserver reads, with a UID, a creation time, the status that
// binding and attaching leave, and the managed fields of the same objects created through the
// API. Through the API a 2-core machine takes about 150 volumes a second (six writes each); etcd
// takes them in batched transactions ten to twenty times faster. The apiserver sees every
// write through its watch of etcd, and every client, the controller among them, lists and
// watches them through the apiserver as it would objects created through it.

// etcdOpsPerTxn is how many puts a transaction carries: etcd's default --max-txn-ops is 128.
const etcdOpsPerTxn = 120

// etcdFiller writes objects into the apiserver's etcd.
type etcdFiller struct {
	etcd *clientv3.Client
	// core and storage encode core/v1 and storage.k8s.io/v1 objects as the apiserver stores them.
	core, storage runtime.Encoder
	// prefixes are the keys' prefixes of Nodes, PVs, PVCs and VolumeAttachments, learned from
	// objects the apiserver stored; each ends in "/".
	nodes, pvs, pvcs, vas string
	// templates are objects created through the API whose managed fields and status the written
	// objects copy: a PV of each StorageClass, a PVC, a VolumeAttachment and a Node.
	pvTemplates map[string]*corev1.PersistentVolume
	pvc         *corev1.PersistentVolumeClaim
	va          *storagev1.VolumeAttachment
	node        *corev1.Node
}

// newEtcdFiller connects to the apiserver's etcd and learns, from objects created through the
// API (the harness's first volumes and nodes), the keys and managed fields of each resource.
func (c *cluster) newEtcdFiller(ctx context.Context) (*etcdFiller, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{c.env.EtcdURL()},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	codecs := serializer.NewCodecFactory(c.env.Scheme)
	pb := protobuf.NewSerializer(c.env.Scheme, c.env.Scheme)
	f := &etcdFiller{
		etcd:        cli,
		core:        codecs.EncoderForVersion(pb, corev1.SchemeGroupVersion),
		storage:     codecs.EncoderForVersion(pb, storagev1.SchemeGroupVersion),
		pvTemplates: map[string]*corev1.PersistentVolume{},
	}
	if err := f.learn(ctx, c); err != nil {
		_ = cli.Close()
		return nil, err
	}
	return f, nil
}

func (f *etcdFiller) close() error { return f.etcd.Close() }

// learn reads one object of each kind from the apiserver and finds its key in etcd.
func (f *etcdFiller) learn(ctx context.Context, c *cluster) error {
	var pvs corev1.PersistentVolumeList
	if err := c.crc.List(ctx, &pvs, client.Limit(500)); err != nil {
		return err
	}
	for i := range pvs.Items {
		if pv := &pvs.Items[i]; f.pvTemplates[pv.Spec.StorageClassName] == nil {
			f.pvTemplates[pv.Spec.StorageClassName] = pv
		}
	}
	if f.pvTemplates[c.userspace] == nil || f.pvTemplates[c.kernel] == nil {
		return errors.New("etcd fill: the cluster has no PersistentVolume of each StorageClass to copy")
	}
	var pvcs corev1.PersistentVolumeClaimList
	var vas storagev1.VolumeAttachmentList
	var nodes corev1.NodeList
	for _, l := range []client.ObjectList{&pvcs, &vas, &nodes} {
		if err := c.crc.List(ctx, l, client.Limit(1)); err != nil {
			return err
		}
	}
	if len(pvcs.Items) == 0 || len(vas.Items) == 0 || len(nodes.Items) == 0 {
		return errors.New("etcd fill: the cluster has no PersistentVolumeClaim, VolumeAttachment or Node to copy")
	}
	f.pvc, f.va, f.node = &pvcs.Items[0], &vas.Items[0], &nodes.Items[0]

	resp, err := f.etcd.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("etcd keys: %w", err)
	}
	find := func(suffix string) (string, error) {
		var found []string
		for _, kv := range resp.Kvs {
			if k := string(kv.Key); strings.HasSuffix(k, "/"+suffix) {
				found = append(found, strings.TrimSuffix(k, suffix))
			}
		}
		if len(found) != 1 {
			return "", fmt.Errorf("etcd fill: %d keys end in /%s, want 1: %v", len(found), suffix, found)
		}
		return found[0], nil
	}
	for _, k := range []struct {
		prefix *string
		suffix string
	}{
		{&f.pvs, f.pvTemplates[c.userspace].Name},
		{&f.pvcs, f.pvc.Namespace + "/" + f.pvc.Name},
		{&f.vas, f.va.Name},
		{&f.nodes, f.node.Name},
	} {
		if *k.prefix, err = find(k.suffix); err != nil {
			return err
		}
	}
	return nil
}

// stored returns obj's metadata as the apiserver sets it on create: a new UID, the creation
// time, the managed fields of template, and no resource version (etcd's revision is).
func stored(meta *metav1.ObjectMeta, template *metav1.ObjectMeta, now metav1.Time) {
	meta.UID = kuuid.NewUUID()
	meta.CreationTimestamp = now
	meta.ManagedFields = template.ManagedFields
	meta.ResourceVersion = ""
}

// fill writes Nodes named nodes, then vols, with workers transactions at a time. progress, when
// set, is called with the number of volumes written.
func (f *etcdFiller) fill(ctx context.Context, s *shapes, nodes []string, vols []volume, workers int, progress func(int)) error {
	now := metav1.Now().Rfc3339Copy()
	var ops []clientv3.Op
	put := func(key string, enc runtime.Encoder, obj runtime.Object) error {
		b, err := runtime.Encode(enc, obj)
		if err != nil {
			return fmt.Errorf("encode %s: %w", key, err)
		}
		ops = append(ops, clientv3.OpPut(key, string(b)))
		return nil
	}
	for i, name := range nodes {
		n := nodeObject(name, i)
		stored(&n.ObjectMeta, &f.node.ObjectMeta, now)
		if err := put(f.nodes+name, f.core, n); err != nil {
			return err
		}
	}
	if err := f.commit(ctx, ops, workers); err != nil {
		return err
	}
	// Volumes go in chunks of whole volumes, so that progress counts volumes.
	const chunk = 5000
	for first := 0; first < len(vols); first += chunk {
		ops = ops[:0]
		for _, v := range vols[first:min(first+chunk, len(vols))] {
			pv, pvc, va := s.objects(v)
			tmpl := f.pvTemplates[v.class]
			stored(&pv.ObjectMeta, &tmpl.ObjectMeta, now)
			pv.Status = *tmpl.Status.DeepCopy()
			stored(&pvc.ObjectMeta, &f.pvc.ObjectMeta, now)
			stored(&va.ObjectMeta, &f.va.ObjectMeta, now)
			if err := errors.Join(
				put(f.pvs+pv.Name, f.core, pv),
				put(f.pvcs+pvc.Namespace+"/"+pvc.Name, f.core, pvc),
				put(f.vas+va.Name, f.storage, va),
			); err != nil {
				return err
			}
		}
		if err := f.commit(ctx, ops, workers); err != nil {
			return err
		}
		if progress != nil {
			progress(min(first+chunk, len(vols)))
		}
	}
	return nil
}

// commit puts ops in transactions of etcdOpsPerTxn, workers at a time. Every key must be new.
func (f *etcdFiller) commit(ctx context.Context, ops []clientv3.Op, workers int) error {
	txns := (len(ops) + etcdOpsPerTxn - 1) / etcdOpsPerTxn
	return forEach(ctx, txns, workers, func(ctx context.Context, i int) error {
		batch := ops[i*etcdOpsPerTxn : min((i+1)*etcdOpsPerTxn, len(ops))]
		// Each key must not exist yet (create revision 0), as a create through the API requires.
		conds := make([]clientv3.Cmp, len(batch))
		for j, op := range batch {
			conds[j] = clientv3.Compare(clientv3.CreateRevision(string(op.KeyBytes())), "=", 0)
		}
		resp, err := f.etcd.Txn(ctx).If(conds...).Then(batch...).Commit()
		if err != nil {
			return fmt.Errorf("etcd transaction: %w", err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("etcd transaction: one of %d keys from %s exists already", len(batch), batch[0].KeyBytes())
		}
		return nil
	})
}

// served counts the Nodes, PVs, PVCs and VolumeAttachments that the apiserver lists.
type served struct{ nodes, pvs, pvcs, vas int }

// count lists each resource through the apiserver, a page of one object with the count of the
// rest, and counts page by page where the apiserver does not say how many remain.
func (c *cluster) count(ctx context.Context) (served, error) {
	var out served
	for _, r := range []struct {
		n    *int
		list func(metav1.ListOptions) (metav1.ListInterface, int, error)
	}{
		{&out.nodes, func(o metav1.ListOptions) (metav1.ListInterface, int, error) {
			l, err := c.kube.CoreV1().Nodes().List(ctx, o)
			return l, lenOr(l, func() int { return len(l.Items) }), err
		}},
		{&out.pvs, func(o metav1.ListOptions) (metav1.ListInterface, int, error) {
			l, err := c.kube.CoreV1().PersistentVolumes().List(ctx, o)
			return l, lenOr(l, func() int { return len(l.Items) }), err
		}},
		{&out.pvcs, func(o metav1.ListOptions) (metav1.ListInterface, int, error) {
			l, err := c.kube.CoreV1().PersistentVolumeClaims("").List(ctx, o)
			return l, lenOr(l, func() int { return len(l.Items) }), err
		}},
		{&out.vas, func(o metav1.ListOptions) (metav1.ListInterface, int, error) {
			l, err := c.kube.StorageV1().VolumeAttachments().List(ctx, o)
			return l, lenOr(l, func() int { return len(l.Items) }), err
		}},
	} {
		opts := metav1.ListOptions{Limit: 1}
		for {
			l, n, err := r.list(opts)
			if err != nil {
				return out, err
			}
			*r.n += n
			if l.GetContinue() == "" {
				break
			}
			if rest := l.GetRemainingItemCount(); rest != nil {
				*r.n += int(*rest)
				break
			}
			opts = metav1.ListOptions{Limit: 5000, Continue: l.GetContinue()}
		}
	}
	return out, nil
}

// lenOr returns n() when l is set, else 0: a failed List returns a nil list.
func lenOr[T any](l *T, n func() int) int {
	if l == nil {
		return 0
	}
	return n()
}

// waitServed waits until the apiserver lists want of each resource.
func (c *cluster) waitServed(ctx context.Context, want served, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := c.count(ctx)
		if err == nil && got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the apiserver lists %+v after %s, want %+v (last error: %v)", got, timeout, want, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
