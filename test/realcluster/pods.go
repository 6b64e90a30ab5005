package realcluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-healer/volume-healer/test/cluster"
	"github.com/volume-healer/volume-healer/test/harness"
)

// RunsPods runs a pod from a locally built image with an emptyDir that writes and reads a file
// every 100ms, and reads its output through the API server and kubelet (as kubectl logs does).
func RunsPods(t harness.TB, c *cluster.Cluster, assets cluster.Assets) {
	ctx := context.Background()
	img := assets.Images["healer-test-workload"]
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "writer", Namespace: "default"},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(true),
			Containers: []corev1.Container{{
				Name: "writer", Image: img.Repository + ":" + img.Tag, ImagePullPolicy: corev1.PullNever,
				Args:         []string{"-dir", "/data", "-interval", "100ms"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
	if _, err := c.Clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("%v", err)
	}
	harness.Eventually(t, 2*time.Minute, "pod writer to run", func() (bool, string) {
		p, err := c.Clientset.CoreV1().Pods("default").Get(ctx, "writer", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, fmt.Sprintf("phase %s, %s", p.Status.Phase, containerStates(p))
	})
	harness.Eventually(t, time.Minute, "the writer's successful writes in its log", func() (bool, string) {
		tries, err := podTries(ctx, c.Clientset, "default", "writer", "writer")
		if err != nil {
			return false, err.Error()
		}
		ok := 0
		for _, r := range tries {
			if r.OK {
				ok++
			}
		}
		return ok >= 5, fmt.Sprintf("%d successful writes, last: %s", ok, lastTry(tries))
	})
}

func containerStates(p *corev1.Pod) string {
	var parts []string
	for _, s := range p.Status.ContainerStatuses {
		switch {
		case s.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s waiting: %s %s", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message))
		case s.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("%s terminated: %s", s.Name, s.State.Terminated.Reason))
		default:
			parts = append(parts, s.Name+" running")
		}
	}
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue && cond.Message != "" {
			parts = append(parts, fmt.Sprintf("%s: %s", cond.Type, cond.Message))
		}
	}
	return strings.Join(parts, "; ")
}
