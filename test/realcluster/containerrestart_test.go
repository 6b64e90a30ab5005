package realcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/test/cluster"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestRealNodeRestartsContainersInPlace: on the real node, with the healer sidecar given the
// node's containerd socket, a pod whose volume is mounted with propagation None keeps its dead
// mount after the volume is healed; RestartContainers, called as the controller calls the
// sidecar (its ServiceAccount's token for the node, over TLS checked against the node's name),
// stops its container, kubelet starts it again in the same pod with the repaired mount, and its
// writes succeed again. Another pod on the node is left alone. The controller's remediation is
// off, so that no eviction replaces the pod meanwhile.
func TestRealNodeRestartsContainersInPlace(t *testing.T) {
	c, assets := cluster.StartForTest(t)
	e := InstallWith(t, c, assets, InstallOptions{ContainerRestart: true, NoRemediation: true})
	// Without the label that opts the namespace in to pod restarts: nothing but the call below
	// may restart the pod.
	e.namespace(appsNS, nil)
	private := e.Deployment("private", corev1.MountPropagationNone)
	other := e.Deployment("other", corev1.MountPropagationNone)
	ctx := t.Context()
	pod := private.WaitWriting(t, time.Time{}, 3*time.Minute, nil)
	otherPod := other.WaitWriting(t, time.Time{}, 3*time.Minute, nil)

	client := e.nodeHealer(t)
	harness.Eventually(t, time.Minute, "the sidecar to say it restarts containers", func() (bool, string) {
		caps, err := client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
		if err != nil {
			return false, err.Error()
		}
		return caps.GetContainerRestart(), fmt.Sprintf("container_restart=%t", caps.GetContainerRestart())
	})

	at := time.Now()
	e.KillMounter(t, private)
	// The periodic sweep heals the node's mount; the pod, with propagation None, keeps the dead
	// one, and the driver's probe after the heal says so.
	e.expectEvent(t, "PersistentVolumeClaim", private.claim(), healer.ReasonVolumePodsMustRestart, at)
	harness.Eventually(t, time.Minute, "the private pod's writes to fail on its dead mount after the heal", func() (bool, string) {
		writing, failure, err := private.PodState(ctx, pod.Name)
		if err != nil {
			return false, err.Error()
		}
		return !writing && failure != "starting", failure
	})
	time.Sleep(2 * time.Second)
	if writing, failure, err := private.PodState(ctx, pod.Name); err != nil || writing {
		t.Fatalf("the private pod writes again after the heal without a restart (%v, %s): its mount propagation is not None", err, failure)
	}
	before := restartCount(t, e, pod, "writer")
	otherBefore := restartCount(t, e, otherPod, "writer")

	pv := e.pvOf(t, private.claim())
	called := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := client.RestartContainers(cctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: string(pod.UID)})
	if err != nil {
		t.Fatalf("RestartContainers(%s, pod %s): %v", pv, pod.Name, err)
	}
	if !slices.Equal(resp.GetContainers(), []string{"writer"}) {
		t.Errorf("RestartContainers stopped %q, want [writer]", resp.GetContainers())
	}
	t.Logf("RestartContainers answered in %s: %q", time.Since(called).Round(time.Millisecond), resp.GetContainers())

	now := private.WaitWriting(t, called, 2*time.Minute, nil)
	if now.UID != pod.UID {
		t.Fatalf("the private workload's pod was replaced (%s -> %s); the container must restart in place", pod.Name, now.Name)
	}
	if got := restartCount(t, e, now, "writer"); got != before+1 {
		t.Errorf("writer's restartCount = %d, want %d", got, before+1)
	}
	if got := restartCount(t, e, otherPod, "writer"); got != otherBefore {
		t.Errorf("the other pod's writer restarted (%d -> %d): it does not mount the volume", otherBefore, got)
	}
	first, err := private.FirstWrite(ctx, now.Name, called)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the private pod %s writes again in a restarted container, %s after the call, %s after the mounter was killed",
		now.Name, first.Sub(called).Round(time.Millisecond), first.Sub(at).Round(time.Millisecond))

	// Its container no longer runs with the dead mount, and the new one is not stopped again by
	// a call for another pod.
	if _, err := client.RestartContainers(cctx, &healerv1alpha1.NodeRestartContainersRequest{PvName: pv, PodUid: string(otherPod.UID)}); err == nil {
		t.Error("RestartContainers for a pod that does not use the volume succeeded")
	}
}

// restartCount is the restart count of the pod's container name, as kubelet reports it.
func restartCount(t *testing.T, e *Env, pod *corev1.Pod, name string) int32 {
	t.Helper()
	p, err := e.c.Clientset.CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == name {
			return s.RestartCount
		}
	}
	t.Fatalf("pod %s has no container %s", pod.Name, name)
	return 0
}

// pvOf is the PersistentVolume bound to claim in the workloads' namespace.
func (e *Env) pvOf(t *testing.T, claim string) string {
	t.Helper()
	pvc, err := e.c.Clientset.CoreV1().PersistentVolumeClaims(appsNS).Get(t.Context(), claim, metav1.GetOptions{})
	if err != nil || pvc.Spec.VolumeName == "" {
		t.Fatalf("claim %s: %v, bound to %q", claim, err, pvc.Spec.VolumeName)
	}
	return pvc.Spec.VolumeName
}

// nodeHealer connects to the node plugin's healer sidecar as the controller does: TLS checked
// against the node's sidecar name, and the controller's ServiceAccount token for this node's
// audience on every call.
func (e *Env) nodeHealer(t *testing.T) healerv1alpha1.NodeHealerClient {
	t.Helper()
	ctx := t.Context()
	pods, err := e.c.Clientset.CoreV1().Pods(driverNS).List(ctx, metav1.ListOptions{LabelSelector: nodePluginPods})
	if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.PodIP == "" {
		t.Fatalf("the node plugin pod: %v (%d pods)", err, len(pods.Items))
	}
	tok, err := e.c.Clientset.CoreV1().ServiceAccounts(healerNS).CreateToken(ctx, controllerDep, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{healerv1alpha1.NodeTokenAudience(healerv1alpha1.DefaultTokenAudience, e.c.NodeName())}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of the controller's ServiceAccount: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.sidecarCA)
	creds := credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: e.c.NodeName() + ".healer-sidecar", MinVersion: tls.VersionTLS12})
	bearer := "Bearer " + tok.Status.Token
	conn, err := grpc.NewClient(net.JoinHostPort(pods.Items[0].Status.PodIP, strconv.Itoa(9072)), grpc.WithTransportCredentials(creds),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(metadata.AppendToOutgoingContext(ctx, "authorization", bearer), method, req, reply, cc, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healerv1alpha1.NewNodeHealerClient(conn)
}
