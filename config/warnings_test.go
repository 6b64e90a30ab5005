package config

import (
	"strings"
	"testing"
)

// TestWarningsNameWhatTurnsNodeBindingOff loads configurations that start but leave a sidecar free
// to answer for another node: each must yield a warning naming the key and what it turns off.
func TestWarningsNameWhatTurnsNodeBindingOff(t *testing.T) {
	tests := map[string]struct {
		env  map[string]string
		want []string // one substring per expected warning, in order
	}{
		"empty serverName": {
			want: []string{"sidecar.tls.serverName is empty: node binding is off"},
		},
		"insecureSkipVerify": {
			env:  map[string]string{"VOLUME_HEALER_SIDECAR_TLS_SERVER_NAME": "healer.example.com", "VOLUME_HEALER_SIDECAR_TLS_INSECURE_SKIP_VERIFY": "true"},
			want: []string{"sidecar.tls.insecureSkipVerify is true: the sidecars' certificates are not verified"},
		},
		"TLS off": {
			env:  map[string]string{"VOLUME_HEALER_SIDECAR_TLS_SERVER_NAME": "healer.example.com", "VOLUME_HEALER_SIDECAR_TLS_ENABLED": "false"},
			want: []string{"sidecar.tls.enabled is false"},
		},
		"signer allowing no requester": {
			env: map[string]string{"VOLUME_HEALER_SIDECAR_TLS_SERVER_NAME": "healer.example.com", "VOLUME_HEALER_SIDECAR_TLS_SIGNER_ENABLED": "true",
				"VOLUME_HEALER_SIDECAR_TLS_SIGNER_CA_SECRET": "volume-healer/sidecar-ca"},
			want: []string{"sidecar.tls.signer.requesters is empty: the signer denies every sidecar's certificate request"},
		},
		"signer with a requester": {
			env: map[string]string{"VOLUME_HEALER_SIDECAR_TLS_SERVER_NAME": "healer.example.com", "VOLUME_HEALER_SIDECAR_TLS_SIGNER_ENABLED": "true",
				"VOLUME_HEALER_SIDECAR_TLS_SIGNER_CA_SECRET": "volume-healer/sidecar-ca", "VOLUME_HEALER_SIDECAR_TLS_SIGNER_REQUESTERS": "system:serviceaccount:csi:node"},
		},
		"serverName set and verified": {
			env: map[string]string{"VOLUME_HEALER_SIDECAR_TLS_SERVER_NAME": "healer.example.com"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := load(t, "", tc.env)
			if err != nil {
				t.Fatal(err)
			}
			got := cfg.Warnings()
			if len(got) != len(tc.want) {
				t.Fatalf("warnings %q, want %d", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i].String(), w) {
					t.Errorf("warning %d = %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}
