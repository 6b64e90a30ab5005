package realcluster

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-healer/volume-healer/test/harness"
)

// ControllerMetrics reads the /metrics of the controller's running pod through the API server's
// pod proxy, as an administrator can without a port of the pod reachable from outside.
func (e *Env) ControllerMetrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	pods, err := e.c.Clientset.CoreV1().Pods(healerNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
			continue
		}
		for _, c := range p.Spec.Containers {
			for _, port := range c.Ports {
				if port.Name != "metrics" {
					continue
				}
				raw, err := e.c.Clientset.CoreV1().Pods(healerNS).ProxyGet("http", p.Name, strconv.Itoa(int(port.ContainerPort)), "metrics", nil).DoRaw(ctx)
				if err != nil {
					return nil, fmt.Errorf("the metrics of pod %s/%s: %w", healerNS, p.Name, err)
				}
				return harness.ParseMetrics(bytes.NewReader(raw))
			}
		}
	}
	return nil, fmt.Errorf("no running pod in %s with a port named metrics", healerNS)
}
