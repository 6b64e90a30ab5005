package realcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/test/harness"
)

// appsNS holds the workloads; it opts in to pod restarts by the built-in policy.
const appsNS = "apps"

// Workload is a pod controller whose pods write and read their volume every 100ms
// (test/Workload) and print one JSON line per try.
type Workload struct {
	e    *Env
	name string
	// propagation is the mount propagation of the volume in the container.
	propagation corev1.MountPropagationMode
	// selector finds its pods.
	selector labels.Selector
	// claims are its PVCs, one per pod of a StatefulSet.
	claims []string
	// statefulSet is true for a StatefulSet, whose pods keep their names when replaced.
	statefulSet bool
	// mode is test/workload's -mode; empty for its default (open, write, close at each try).
	mode string
}

func (e *Env) container(w *Workload) corev1.Container {
	img := e.assets.Images["healer-test-workload"]
	args := []string{"-dir", "/data", "-interval", "100ms", "-name", w.name}
	if w.mode != "" {
		args = append(args, "-mode", w.mode)
	}
	return corev1.Container{
		Name: "writer", Image: img.Repository + ":" + img.Tag, ImagePullPolicy: corev1.PullNever,
		Args:         args,
		VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data", MountPropagation: ptr.To(w.propagation)}},
	}
}

func pvcSpec(class string) corev1.PersistentVolumeClaimSpec {
	return corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		StorageClassName: ptr.To(class),
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}
}

// StatefulSet creates a StatefulSet of replicas pods, each with its own volume of the reference
// driver's StorageClass from the claim template (data-<name>-<ordinal>). Its pods start in
// parallel.
func (e *Env) StatefulSet(name string, propagation corev1.MountPropagationMode, replicas int) *Workload {
	e.t.Helper()
	return e.StatefulSetOf(storageClass, name, propagation, replicas)
}

// StatefulSetOf creates a StatefulSet as StatefulSet does, with volumes of the StorageClass class.
func (e *Env) StatefulSetOf(class, name string, propagation corev1.MountPropagationMode, replicas int) *Workload {
	e.t.Helper()
	w := &Workload{e: e, name: name, propagation: propagation, selector: labels.SelectorFromSet(labels.Set{"app": name}), statefulSet: true}
	for i := range replicas {
		w.claims = append(w.claims, fmt.Sprintf("data-%s-%d", name, i))
	}
	e.createStatefulSet(name, replicas, e.container(w), []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}, Spec: pvcSpec(class)}})
	return w
}

// createStatefulSet creates the StatefulSet name of replicas pods labelled app=<name>, started
// in parallel, each running c with a volume of each claim template.
func (e *Env) createStatefulSet(name string, replicas int, c corev1.Container, templates []corev1.PersistentVolumeClaim) {
	e.t.Helper()
	ss := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appsNS},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(int32(replicas)),
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{c}, TerminationGracePeriodSeconds: ptr.To[int64](1)},
			},
			VolumeClaimTemplates: templates,
		},
	}
	if _, err := e.c.Clientset.AppsV1().StatefulSets(appsNS).Create(e.t.Context(), ss, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("%v", err)
	}
}

// deployment creates a PVC and a one-replica Deployment that uses it.
func (e *Env) Deployment(name string, propagation corev1.MountPropagationMode) *Workload {
	e.t.Helper()
	ctx := e.t.Context()
	w := &Workload{e: e, name: name, propagation: propagation, selector: labels.SelectorFromSet(labels.Set{"app": name}), claims: []string{name}}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appsNS}, Spec: pvcSpec(storageClass)}
	if _, err := e.c.Clientset.CoreV1().PersistentVolumeClaims(appsNS).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("%v", err)
	}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appsNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec: corev1.PodSpec{
					Containers:                    []corev1.Container{e.container(w)},
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
						PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
				},
			},
		},
	}
	if _, err := e.c.Clientset.AppsV1().Deployments(appsNS).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("%v", err)
	}
	return w
}

// pod returns the workload's running pod (the newest, if a replacement is starting).
func (w *Workload) pod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := w.Pods(ctx)
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("no running pod of %s", w.name)
	}
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return b.CreationTimestamp.Compare(a.CreationTimestamp.Time) })
	return &pods[0], nil
}

// Pods returns the workload's running pods that are not being deleted, by name.
func (w *Workload) Pods(ctx context.Context) ([]corev1.Pod, error) {
	list, err := w.e.c.Clientset.CoreV1().Pods(appsNS).List(ctx, metav1.ListOptions{LabelSelector: w.selector.String()})
	if err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			pods = append(pods, p)
		}
	}
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return pods, nil
}

// try is one line of the workload's output.
type try struct {
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"`
	OK   bool      `json:"ok"`
	Op   string    `json:"op"`
	Err  string    `json:"err"`
	// Took is how long the try's system calls took, in seconds.
	Took float64 `json:"took"`
	// Dir is the try's folder, where the workload writes several volumes (-dir given more
	// than once).
	Dir string `json:"dir"`
}

// tries reads the tries of pod's writer through the API server and kubelet (as kubectl logs).
func (w *Workload) tries(ctx context.Context, pod string) ([]try, error) {
	return podTries(ctx, w.e.c.Clientset, appsNS, pod, "writer")
}

// podTries reads the tries a workload container printed, through the API server and kubelet.
func podTries(ctx context.Context, cs kubernetes.Interface, namespace, pod, container string) ([]try, error) {
	raw, err := cs.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return parseTries(raw), nil
}

// parseTries reads the tries in a workload container's output; other lines are skipped.
func parseTries(raw []byte) []try {
	var out []try
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	for sc.Scan() {
		var r try
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Seq > 0 {
			out = append(out, r)
		}
	}
	return out
}

// WaitWriting waits until the workload's running pod, other than the pod replaced (when not
// nil), has written and read its volume successfully after since, and returns that pod.
func (w *Workload) WaitWriting(t harness.TB, since time.Time, timeout time.Duration, replaced *corev1.Pod) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	what := w.name + " to write and read its volume"
	if replaced != nil {
		what = w.name + " to replace pod " + replaced.Name + " by one that writes and reads its volume"
	}
	harness.Eventually(t, timeout, what, func() (bool, string) {
		p, err := w.pod(t.Context())
		if err != nil {
			return false, err.Error()
		}
		if replaced != nil && p.UID == replaced.UID {
			tries, _ := w.tries(t.Context(), p.Name)
			return false, fmt.Sprintf("pod %s still runs; its last try: %s", p.Name, lastTry(tries))
		}
		tries, err := w.tries(t.Context(), p.Name)
		if err != nil {
			return false, err.Error()
		}
		for _, r := range tries {
			if r.OK && r.Time.After(since) {
				pod = p
				return true, ""
			}
		}
		return false, fmt.Sprintf("pod %s: %d tries, none successful after %s; last: %s", p.Name, len(tries), since.Format(time.TimeOnly), lastTry(tries))
	})
	return pod
}

func lastTry(tries []try) string {
	if len(tries) == 0 {
		return "none"
	}
	r := tries[len(tries)-1]
	if r.OK {
		return fmt.Sprintf("#%d ok at %s", r.Seq, r.Time.Format(time.TimeOnly))
	}
	return fmt.Sprintf("#%d %s failed at %s: %s", r.Seq, r.Op, r.Time.Format(time.TimeOnly), r.Err)
}

// WaitAllWriting waits until every pod of the workload (one per claim) runs and has written and
// read its volume successfully.
func (w *Workload) WaitAllWriting(t harness.TB, timeout time.Duration) {
	t.Helper()
	harness.Eventually(t, timeout, fmt.Sprintf("the %d pods of %s to write and read their volumes", len(w.claims), w.name), func() (bool, string) {
		pods, err := w.Pods(t.Context())
		if err != nil {
			return false, err.Error()
		}
		writing := 0
		for _, p := range pods {
			if ok, _, _ := w.PodState(t.Context(), p.Name); ok {
				writing++
			}
		}
		return writing >= len(w.claims), fmt.Sprintf("%d pods running, %d writing", len(pods), writing)
	})
}

// PodState says whether the latest try of pod succeeded, and how it failed when it did not
// ("starting" when the pod has not tried yet); an error when its output cannot be read.
func (w *Workload) PodState(ctx context.Context, pod string) (writing bool, failure string, err error) {
	tries, err := w.tries(ctx, pod)
	if err != nil {
		return false, "", err
	}
	if len(tries) == 0 {
		return false, "starting", nil
	}
	r := tries[len(tries)-1]
	if r.OK {
		return true, "", nil
	}
	return false, r.Op + ": " + r.Err, nil
}

// FirstWrite returns the time of pod's first successful try after since, zero while there is none.
func (w *Workload) FirstWrite(ctx context.Context, pod string, since time.Time) (time.Time, error) {
	tries, err := w.tries(ctx, pod)
	if err != nil {
		return time.Time{}, err
	}
	for _, r := range tries {
		if r.OK && r.Time.After(since) {
			return r.Time, nil
		}
	}
	return time.Time{}, nil
}

// Outage is what one pod saw of a disruption.
type Outage struct {
	// FirstFailure is the time of its first failed try after the disruption began, Resumed that
	// of its first successful try after that; each zero while there is none.
	FirstFailure, Resumed time.Time
	// Failure says how the first failed try failed.
	Failure string
}

// Outage reads what pod saw since the disruption began at since.
func (w *Workload) Outage(ctx context.Context, pod string, since time.Time) (Outage, error) {
	o, err := w.outageOf(ctx, pod, since)
	if err != nil {
		return Outage{}, err
	}
	var out Outage
	if o.firstFailure != nil {
		out.FirstFailure, out.Failure = o.firstFailure.Time, o.firstFailure.Op+": "+o.firstFailure.Err
	}
	if o.resumed != nil {
		out.Resumed = o.resumed.Time
	}
	return out, nil
}

// outage is what one pod saw of a disruption: its first failed try after it began, and its
// first successful try after that.
type outage struct {
	firstFailure, resumed *try
}

// outageOf reads the tries of pod after since.
func (w *Workload) outageOf(ctx context.Context, pod string, since time.Time) (outage, error) {
	tries, err := w.tries(ctx, pod)
	if err != nil {
		return outage{}, err
	}
	var o outage
	for i := range tries {
		r := &tries[i]
		if r.Time.Before(since) {
			continue
		}
		if o.firstFailure == nil {
			if !r.OK {
				o.firstFailure = r
			}
			continue
		}
		if r.OK {
			o.resumed = r
			break
		}
	}
	return o, nil
}

// OptInToPodRestarts creates the workloads' namespace with the label that lets the built-in
// policy evict controller-owned pods left on a dead mount.
func (e *Env) OptInToPodRestarts() {
	e.namespace(appsNS, map[string]string{annotations.EvictPodsLabel: "true"})
}

// Name is the workload's name.
func (w *Workload) Name() string { return w.name }

// Claims are the names of the workload's PVCs in its namespace, one per pod of a StatefulSet.
func (w *Workload) Claims() []string { return slices.Clone(w.claims) }

// Namespace is the namespace of the workloads and their claims.
func (w *Workload) Namespace() string { return appsNS }

// State says in a few words what the workload's running pod does now: its name and the outcome
// of its latest try, or "" when it cannot be read.
func (w *Workload) State(ctx context.Context) string {
	p, err := w.pod(ctx)
	if err != nil {
		return "no running pod"
	}
	tries, err := w.tries(ctx, p.Name)
	if err != nil || len(tries) == 0 {
		return "pod " + p.Name + ": starting"
	}
	r := tries[len(tries)-1]
	if r.OK {
		return "pod " + p.Name + ": writes and reads"
	}
	return fmt.Sprintf("pod %s: %s fails: %s", p.Name, r.Op, r.Err)
}
