package control_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
	"github.com/volume-healer/volume-healer/refdriver/control"
)

// volume is the fake backend's volume.
type volume struct {
	ID        string            `json:"id"`
	Condition control.Condition `json:"condition"`
	Staged    bool              `json:"staged"`
}

// backend fails every call on a volume with the error its ID names, and answers the others.
type backend struct{}

var failures = map[string]error{
	"missing": control.ErrVolumeNotFound,
	"taken":   control.ErrVolumeExists,
	"invalid": control.ErrInvalidRequest,
	"busy":    control.ErrBusy,
	"broken":  errors.New("disk on fire"),
}

func (backend) Volumes(context.Context) ([]volume, error) {
	return []volume{{ID: "vol-1", Condition: control.Healthy, Staged: true}}, nil
}

func (backend) Volume(_ context.Context, id string) (volume, error) {
	if err := failures[id]; err != nil {
		return volume{}, fmt.Errorf("%w: %q", err, id)
	}
	return volume{ID: id, Condition: control.Healthy, Staged: true}, nil
}

func (b backend) SetCondition(ctx context.Context, id string, c control.Condition, _ time.Duration) (volume, error) {
	v, err := b.Volume(ctx, id)
	v.Condition = c
	return v, err
}

func (b backend) SetStaged(ctx context.Context, id string, staged bool) (volume, error) {
	v, err := b.Volume(ctx, id)
	v.Staged = staged
	return v, err
}

// serve serves the control interface over backend and rec on a socket, as a driver does.
func serve(t *testing.T, rec *control.Recorder) *control.Client[volume] {
	t.Helper()
	dir, err := os.MkdirTemp("", "control")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	endpoint := "unix://" + filepath.Join(dir, "control.sock")
	srv, err := control.NewServer(control.ServerOptions{
		Endpoint:        "unix://" + filepath.Join(dir, "csi-addons.sock"),
		ControlEndpoint: endpoint,
	}, control.Handler(backend{}, rec))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	c, err := control.NewClient[volume](endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestErrorsTravelAsStatusesAndBack(t *testing.T) {
	c := serve(t, control.NewRecorder())
	tests := map[string]struct {
		id     string
		status int
		want   error
	}{
		"an unknown volume":      {"missing", http.StatusNotFound, control.ErrVolumeNotFound},
		"a volume that exists":   {"taken", http.StatusConflict, control.ErrVolumeExists},
		"a request it cannot do": {"invalid", http.StatusBadRequest, control.ErrInvalidRequest},
		"a volume that was busy": {"busy", http.StatusServiceUnavailable, control.ErrBusy},
		"any other failure":      {"broken", http.StatusInternalServerError, sanity.ErrControl},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := c.SetCondition(context.Background(), tt.id, control.Gone, 0)
			var se *sanity.StatusError
			if !errors.Is(err, tt.want) || !errors.As(err, &se) || se.Code != tt.status {
				t.Fatalf("SetCondition(%s) = %v, want %v with HTTP %d", tt.id, err, tt.want, tt.status)
			}
			if want := failures[tt.id].Error(); se.Message != fmt.Sprintf("%s: %q", want, tt.id) {
				t.Errorf("error body %q, want the backend's error", se.Message)
			}
		})
	}
}

func TestHandlerServesTheBackend(t *testing.T) {
	rec := control.NewRecorder()
	c := serve(t, rec)
	ctx := context.Background()

	v, err := c.SetCondition(ctx, "vol-2", control.ReadOnly, 0)
	if err != nil || v != (volume{ID: "vol-2", Condition: control.ReadOnly, Staged: true}) {
		t.Errorf("SetCondition = %+v, %v; want vol-2 read-only", v, err)
	}
	if v, err = c.SetStaged(ctx, "vol-2", false); err != nil || v.Staged {
		t.Errorf("SetStaged(false) = %+v, %v; want vol-2 not staged", v, err)
	}
	if vols, err := c.Volumes(ctx); err != nil || len(vols) != 1 || vols[0].ID != "vol-1" {
		t.Errorf("Volumes = %+v, %v; want vol-1", vols, err)
	}

	// A body with a field the interface does not know is refused, not half read.
	err = c.Do(ctx, http.MethodPut, sanity.VolumePath("vol-1", "staged"), map[string]any{"staged": true, "force": true}, nil)
	if !errors.Is(err, control.ErrInvalidRequest) {
		t.Errorf("a body with an unknown field: %v, want ErrInvalidRequest", err)
	}
	// Paths a mode does not serve are refused as the mux refuses them.
	var se *sanity.StatusError
	if err := c.Do(ctx, http.MethodPost, "/volumes", map[string]string{"id": "vol-9"}, nil); !errors.As(err, &se) || se.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /volumes = %v, want HTTP 405", err)
	}

	leave := rec.Enter(ctx, "ProbeVolume", "vol-1")
	rec.Count("ProbeVolume")
	counters, err := c.Counters(ctx)
	if err != nil || counters.InFlight != 1 || counters.Calls["ProbeVolume"] != 1 {
		t.Errorf("Counters = %+v, %v; want one ProbeVolume in flight", counters, err)
	}
	leave()
	if err := c.ResetCounters(ctx); err != nil {
		t.Fatal(err)
	}
	if calls, err := c.Calls(ctx); err != nil || len(calls) != 0 {
		t.Errorf("Calls after ResetCounters = %+v, %v; want none", calls, err)
	}
}

func TestServerWantsAnEndpoint(t *testing.T) {
	tests := map[string]control.ServerOptions{
		"no endpoint":          {},
		"a TCP endpoint":       {Endpoint: "tcp://127.0.0.1:9000"},
		"an empty socket path": {Endpoint: "unix://"},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := control.NewServer(opts, http.NotFoundHandler()); !errors.Is(err, control.ErrInvalidOptions) {
				t.Errorf("NewServer(%+v) = %v, want ErrInvalidOptions", opts, err)
			}
		})
	}
}
