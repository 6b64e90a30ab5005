package cli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// TestKubectlFlags runs healerctl with the flags users type to kubectl against a real apiserver:
// -n names a claim's namespace, --as impersonates (and the apiserver then refuses a user with no
// rights), and a namespace that contradicts another, or that a command cannot use, is refused.
func TestKubectlFlags(t *testing.T) {
	env := controlplane.Start(t)
	c := statusCluster{t: t, env: env}
	c.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	c.create(&corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			VolumeName:  "pv-data",
		},
	})
	kube := []string{"--kubeconfig", env.Kubeconfig}
	empty := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		args    []string
		want    string
		wantErr string
	}{
		"-n names the claim's namespace": {
			args: []string{"sweep", "-n", "shop", "--pvc", "data"},
			want: "requested on PersistentVolumeClaim shop/data",
		},
		"NAMESPACE/NAME as before": {
			args: []string{"sweep", "--pvc", "shop/data"},
			want: "requested on PersistentVolumeClaim shop/data",
		},
		"--as impersonates": {
			args:    []string{"sweep", "-n", "shop", "--pvc", "data", "--as", "someone", "--as-group", "readers"},
			wantErr: `User "someone" cannot get resource "persistentvolumeclaims"`,
		},
		"-n and NAMESPACE/NAME disagree": {
			args:    []string{"sweep", "-n", "other", "--pvc", "shop/data"},
			wantErr: "--pvc shop/data is in namespace shop, but -n says other",
		},
		"status reads every namespace": {
			args:    []string{"status", "-n", "shop"},
			wantErr: "-n/--namespace: status reads every namespace",
		},
		"--server and --token": {
			// A kubeconfig with nothing in it: the server and the credentials come from the flags.
			args: []string{"sweep", "-n", "shop", "--pvc", "data", "--kubeconfig", empty,
				"--server", env.Config.Host, "--token", "not-a-token", "--insecure-skip-tls-verify"},
			wantErr: "the server has asked for the client to provide credentials",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// The case's own --kubeconfig, given later, wins.
			out, err := healerctl(t, append(slices.Clone(kube), tc.args...)...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("healerctl %s: %v, want an error containing %q\n%s", strings.Join(tc.args, " "), err, tc.wantErr, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("healerctl %s: %v\n%s", strings.Join(tc.args, " "), err, out)
			}
			mustContain(t, out, tc.want)
		})
	}
}

// TestCompletion checks that healerctl writes the completion script of each shell it documents.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{
		"bash": "bash completion V2 for healerctl",
		"zsh":  "#compdef healerctl",
		"fish": "fish completion for healerctl",
	} {
		t.Run(shell, func(t *testing.T) {
			out, err := healerctl(t, "completion", shell)
			if err != nil {
				t.Fatal(err)
			}
			mustContain(t, out, want)
		})
	}
}
