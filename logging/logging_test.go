package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

func TestApply(t *testing.T) {
	tests := map[string]struct {
		args []string
		// check looks at what one Info call at verbosity 0 and one at 3 wrote.
		check func(t *testing.T, out string)
	}{
		"text by default, verbosity 0": {
			check: func(t *testing.T, out string) {
				if !strings.Contains(out, `"shown" key="value"`) || strings.Contains(out, "hidden") {
					t.Errorf("want one klog text line at verbosity 0, got:\n%s", out)
				}
			},
		},
		"json at -v=3": {
			args: []string{"--logging-format=json", "-v=3"},
			check: func(t *testing.T, out string) {
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if len(lines) != 2 {
					t.Fatalf("want 2 lines, got:\n%s", out)
				}
				for _, l := range lines {
					var m map[string]any
					if err := json.Unmarshal([]byte(l), &m); err != nil {
						t.Fatalf("line %q is not JSON: %v", l, err)
					}
					if m["key"] != "value" {
						t.Errorf("line %q lacks key=value", l)
					}
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := NewOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := o.Apply(&out, &out); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := ResetForTest(); err != nil {
					t.Error(err)
				}
			})
			klog.Background().Info("shown", "key", "value")
			klog.Background().V(3).Info("hidden", "key", "value")
			klog.Flush()
			tc.check(t, out.String())
		})
	}
}

func TestValidate(t *testing.T) {
	tests := map[string]struct {
		args []string
		want []string
	}{
		"unknown format": {
			args: []string{"--logging-format=yaml"},
			want: []string{"--logging-format", `"yaml"`, "text, json"},
		},
		"vmodule with json": {
			args: []string{"--logging-format=json", "--vmodule=run=4"},
			want: []string{"--vmodule", "text"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := NewOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
		})
	}
}

func TestDefaultYieldsToFlags(t *testing.T) {
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--logging-format=json"}); err != nil {
		t.Fatal(err)
	}
	o.Default(4, "text")
	if o.Format() != "json" || o.config.Verbosity != 4 {
		t.Errorf("format %q verbosity %d, want json (the flag) and 4 (the default, -v not given)", o.Format(), o.config.Verbosity)
	}
}
