package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/test/controlplane"
)

// TestSweepRequestsAndWaits runs `healerctl sweep --wait` against a real apiserver, with this test
// playing the controller: it sees the request, marks it handled and records the outcome Event.
func TestSweepRequestsAndWaits(t *testing.T) {
	env := controlplane.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gold"}, Provisioner: "rbd.csi.ceph.com"}
	if err := env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}

	go func() {
		for ctx.Err() == nil {
			var got storagev1.StorageClass
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), &got); err == nil {
				if req := got.Annotations[annotations.SweepRequest]; req != "" {
					_ = env.Client.Create(ctx, &corev1.Event{
						ObjectMeta:     metav1.ObjectMeta{Namespace: "default", Name: "gold.sweep"},
						InvolvedObject: corev1.ObjectReference{Kind: "StorageClass", Name: "gold"},
						Reason:         "ManualSweepFinished", Type: corev1.EventTypeNormal,
						Message: "Requested sweep \"" + req + "\" finished: 3 volumes: 3 probed, 0 healed",
					})
					got.Annotations[annotations.SweepHandled] = req
					_ = env.Client.Update(ctx, &got)
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	var out bytes.Buffer
	cmd := newRootCommand("healerctl")
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"sweep", "--kubeconfig", env.Kubeconfig, "--storage-class", "gold", "--wait", "--timeout", "30s"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("healerctl sweep: %v\n%s", err, out.String())
	}
	for _, want := range []string{"requested on StorageClass gold", "3 volumes: 3 probed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	// Bad requests name the problem.
	for args, want := range map[string]string{
		"--storage-class gold --pvc a/b": "exactly one",
		"--driver rbd":                   "exactly one",
		"--pvc nobody":                   "PVC default/nobody", // a bare name is in the context's namespace
		"--pvc shop/":                    "NAMESPACE/NAME",
		"--storage-class missing":        "StorageClass missing",
		"--driver rbd --node n1":         "no CSIAddonsNode for driver rbd on node n1",
	} {
		cmd := newRootCommand("healerctl")
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetArgs(append([]string{"sweep", "--kubeconfig", env.Kubeconfig}, strings.Fields(args)...))
		if err := cmd.ExecuteContext(ctx); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sweep %s: error %v, want one mentioning %q", args, err, want)
		}
	}
}
