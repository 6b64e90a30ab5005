package sanity_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
)

// request is one request a control endpoint received.
type request struct {
	method, path, body string
}

// serveControl serves a control endpoint on a UNIX socket that records every request and
// answers each with status and answer.
func serveControl(t *testing.T, status int, answer string) (endpoint string, got chan request) {
	t.Helper()
	path := filepath.Join(socketDir(t), "control.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	got = make(chan request, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- request{method: r.Method, path: r.URL.EscapedPath(), body: string(b)}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, answer)
	}), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "unix://" + path, got
}

func TestHTTPControlSpeaksTheControlEndpoint(t *testing.T) {
	tests := map[string]struct {
		call func(context.Context, *sanity.HTTPControl) error
		want request
	}{
		"a hung volume": {
			call: func(ctx context.Context, c *sanity.HTTPControl) error {
				return c.SetFault(ctx, "pvc/a b", sanity.Hung, 2500*time.Millisecond)
			},
			want: request{http.MethodPut, "/volumes/pvc%2Fa%20b/condition", `{"condition":"hung","hang":"2.5s"}`},
		},
		"a restored volume": {
			call: func(ctx context.Context, c *sanity.HTTPControl) error {
				return c.SetFault(ctx, "vol-1", sanity.Healthy, 0)
			},
			want: request{http.MethodPut, "/volumes/vol-1/condition", `{"condition":"healthy"}`},
		},
		"an unstaged volume": {
			call: func(ctx context.Context, c *sanity.HTTPControl) error { return c.SetStaged(ctx, "vol-1", false) },
			want: request{http.MethodPut, "/volumes/vol-1/staged", `{"staged":false}`},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			endpoint, got := serveControl(t, http.StatusOK, `{"id":"ignored"}`)
			c, err := sanity.NewHTTPControl(endpoint)
			if err != nil {
				t.Fatal(err)
			}
			if err := tt.call(context.Background(), c); err != nil {
				t.Fatalf("call: %v", err)
			}
			if r := <-got; r != tt.want {
				t.Errorf("the endpoint got %+v, want %+v", r, tt.want)
			}
		})
	}
}

func TestHTTPControlReportsTheEndpointsError(t *testing.T) {
	endpoint, _ := serveControl(t, http.StatusNotFound, `{"error":"volume not found: \"vol-9\""}`)
	c, err := sanity.NewHTTPControl(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	err = c.SetFault(context.Background(), "vol-9", sanity.Gone, 0)
	var se *sanity.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusNotFound || !errors.Is(err, sanity.ErrControl) {
		t.Fatalf("SetFault = %v, want a StatusError 404 that is ErrControl", err)
	}
	if msg := err.Error(); !strings.Contains(msg, `volume not found: "vol-9"`) || !strings.Contains(msg, "/volumes/vol-9/condition") {
		t.Errorf("error %q does not name the request and the endpoint's reason", msg)
	}
}

func TestNewHTTPControlWantsAUNIXSocket(t *testing.T) {
	tests := map[string]string{
		"no endpoint":     "",
		"no socket path":  "unix://",
		"a TCP address":   "tcp://127.0.0.1:80",
		"a relative path": "relative/control.sock",
	}
	for name, endpoint := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := sanity.NewHTTPControl(endpoint); !errors.Is(err, sanity.ErrInvalidOptions) {
				t.Errorf("NewHTTPControl(%q) = %v, want ErrInvalidOptions", endpoint, err)
			}
		})
	}
}
