package evict

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// BenchmarkPodCacheFootprint measures what a cache of every pod of the cluster would keep per
// pod, the alternative to the per-node LIST that findPods makes (docs/performance.md): typical
// Deployment pods (one container, a claim, the service account token, running), decoded from
// JSON as an informer decodes them, kept whole (with managed fields stripped, as a transform
// would) or as metadata only, measured as the live heap after a collection.
//
//	go test -run '^$' -bench PodCacheFootprint -benchtime 1x ./healer/evict/
func BenchmarkPodCacheFootprint(b *testing.B) {
	const pods = 20000
	raw := make([][]byte, pods)
	for i := range raw {
		data, err := json.Marshal(typicalPod(i))
		if err != nil {
			b.Fatal(err)
		}
		raw[i] = data
	}
	for _, shape := range []struct {
		name   string
		decode func([]byte) (any, error)
	}{
		{"pod", func(data []byte) (any, error) {
			var p corev1.Pod
			err := json.Unmarshal(data, &p)
			p.ManagedFields = nil
			return &p, err
		}},
		{"metadata", func(data []byte) (any, error) {
			var m metav1.PartialObjectMetadata
			err := json.Unmarshal(data, &m)
			m.ManagedFields = nil
			return &m, err
		}},
	} {
		b.Run(shape.name, func(b *testing.B) {
			for range b.N {
				before := liveHeap()
				kept := make([]any, 0, pods)
				for _, data := range raw {
					obj, err := shape.decode(data)
					if err != nil {
						b.Fatal(err)
					}
					kept = append(kept, obj)
				}
				after := liveHeap()
				runtime.KeepAlive(kept)
				perPod := float64(after-before) / pods
				b.ReportMetric(perPod, "bytes/pod")
				b.ReportMetric(perPod*150000/(1<<20), "MiB@150k-pods")
			}
		})
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// typicalPod is pod i of a Deployment, running, with a claim and the usual injected parts.
func typicalPod(i int) *corev1.Pod {
	isController := true
	created := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	name := fmt.Sprintf("web-7d9f8b6c4d-%05d", i)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: fmt.Sprintf("team-%d", i%200), UID: types.UID(fmt.Sprintf("2f0c5a8e-0000-4000-8000-%012d", i)),
			ResourceVersion: fmt.Sprint(100000 + i), CreationTimestamp: created, GenerateName: "web-7d9f8b6c4d-",
			Labels:      map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/instance": "web", "pod-template-hash": "7d9f8b6c4d"},
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9f8b6c4d",
				UID: "9a1b2c3d-0000-4000-8000-000000000001", Controller: &isController, BlockOwnerDeletion: &isController}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "v1", Time: &created, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:containers":{}}}`)}},
		},
		Spec: corev1.PodSpec{
			NodeName:           fmt.Sprintf("node-%d", i%1000),
			ServiceAccountName: "default",
			Containers: []corev1.Container{{
				Name: "web", Image: "registry.example.com/team/web:1.42.0",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Env:   []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "DATA_DIR", Value: "/data"}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "data", MountPath: "/data"},
					{Name: "kube-api-access-abcde", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
				},
				ReadinessProbe:           &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}, PeriodSeconds: 10},
				TerminationMessagePath:   "/dev/termination-log",
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				ImagePullPolicy:          corev1.PullIfNotPresent,
			}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-" + name}}},
				{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr(int64(3607))}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				}}}},
			},
			RestartPolicy: corev1.RestartPolicyAlways, DNSPolicy: corev1.DNSClusterFirst, SchedulerName: "default-scheduler",
			Tolerations: []corev1.Toleration{
				{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
			},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: "10.0.3.17", PodIP: fmt.Sprintf("10.244.%d.%d", i/250%250, i%250), StartTime: &created, QOSClass: corev1.PodQOSBurstable,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: created},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: created},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: created},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: created},
			},
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "web", Ready: true, Image: "registry.example.com/team/web:1.42.0",
				ImageID:     "registry.example.com/team/web@sha256:4b3c2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b",
				ContainerID: fmt.Sprintf("containerd://%064d", i), Started: ptr(true),
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: created}},
			}},
		},
	}
}

func ptr[T any](v T) *T { return &v }
