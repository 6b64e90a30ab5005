package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/volume-healer/volume-healer/logging"
	"github.com/volume-healer/volume-healer/logging/loggingtest"
	"github.com/volume-healer/volume-healer/version"
)

func execute(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	cmd := newCommand(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	out, err := execute(t, nil, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"--config", "--kubeconfig", "--leader-election-enabled", "--metrics-bind-address",
		"--health-bind-address", "--policy-namespace", "--policy-label-selector", "--policy-evaluation-timeout",
		"--schedule-default", "--schedule-storage-classes", "--schedule-stagger", "--restart-debounce",
		"--budgets-global", "--budgets-per-driver", "--budgets-per-node", "--timeouts-probe", "--timeouts-heal",
		"--backoff-base", "--backoff-max", "--dry-run", "--sidecar-tls-ca-file", "--sidecar-auth-token-file"} {
		if !strings.Contains(out, flag) {
			t.Errorf("--help does not document %s", flag)
		}
	}
}

func TestConfigPrint(t *testing.T) {
	tests := map[string]struct {
		env     map[string]string
		args    []string
		want    []string
		wantErr []string
	}{
		"flags and environment merged": {
			env:  map[string]string{"VOLUME_HEALER_BUDGETS_GLOBAL": "12"},
			args: []string{"--budgets-per-node=3", "--budgets-per-driver=6", "--sidecar-tls-enabled=false"},
			want: []string{"global: 12", "perNode: 3", "perDriver: 6"},
		},
		"negative budget": {
			args:    []string{"--budgets-per-node=-1", "--sidecar-tls-enabled=false"},
			wantErr: []string{"budgets.perNode", "-1", ">= 1"},
		},
		"bad cron spec": {
			args:    []string{"--schedule-default=every day", "--sidecar-tls-enabled=false"},
			wantErr: []string{"schedule.default", "every day"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := execute(t, tc.env, append([]string{"config", "print"}, tc.args...)...)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("config print succeeded, want an error; output:\n%s", out)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not contain %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestVersion(t *testing.T) {
	out, err := execute(t, nil, "--version")
	if err != nil {
		t.Fatal(err)
	}
	if want := version.Line("volume-healer") + "\n"; out != want {
		t.Errorf("--version printed %q, want %q", out, want)
	}
}

func TestLoggingFlags(t *testing.T) {
	tests := map[string]struct {
		env  map[string]string
		args []string
		// wantErr are words of the error the command returns.
		wantErr []string
		// wantJSON: every line logged is a JSON object, and one of them is the start line.
		wantJSON bool
	}{
		"--logging-format json": {
			args:     []string{"--logging-format=json", "-v=2"},
			wantErr:  []string{"/nonexistent/kubeconfig"},
			wantJSON: true,
		},
		"log.format json from the environment": {
			env:      map[string]string{"VOLUME_HEALER_LOG_FORMAT": "json"},
			wantErr:  []string{"/nonexistent/kubeconfig"},
			wantJSON: true,
		},
		"the flag wins over log.format": {
			env:     map[string]string{"VOLUME_HEALER_LOG_FORMAT": "json"},
			args:    []string{"--logging-format=yaml"},
			wantErr: []string{"--logging-format", `"yaml"`, "text, json"},
		},
		"unknown format": {
			args:    []string{"--logging-format=yaml"},
			wantErr: []string{"--logging-format", `"yaml"`, "text, json"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"--kubeconfig=/nonexistent/kubeconfig", "--sidecar-tls-enabled=false"}, tc.args...)
			out, err := execute(t, tc.env, args...)
			t.Cleanup(func() {
				if err := logging.ResetForTest(); err != nil {
					t.Error(err)
				}
			})
			if err == nil {
				t.Fatal("the controller started without a cluster")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
			if tc.wantJSON {
				loggingtest.AssertJSONLines(t, out, "Starting")
			}
		})
	}
}
