package control

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
)

// Backend is the driver whose volumes the control interface serves, in either mode; V is the
// mode's volume as the interface reports it. Errors wrap the sentinels of this package
// (ErrVolumeNotFound, ErrInvalidRequest, ...), which decide the answer's status.
type Backend[V any] interface {
	// Volumes returns every volume, sorted by ID.
	Volumes(ctx context.Context) ([]V, error)
	// Volume returns one volume.
	Volume(ctx context.Context, id string) (V, error)
	// SetCondition breaks or restores a volume; hang applies to Hung, zero meaning the mode's
	// default.
	SetCondition(ctx context.Context, id string, c Condition, hang time.Duration) (V, error)
	// SetStaged stages or unstages a volume on the driver's node.
	SetStaged(ctx context.Context, id string, staged bool) (V, error)
}

// Handler returns the control interface over b, with the counters and call log of rec. A mode
// that serves more paths adds them to the returned mux, with Decode and Reply.
func Handler[V any](b Backend[V], rec *Recorder) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /volumes", func(w http.ResponseWriter, r *http.Request) {
		vols, err := b.Volumes(r.Context())
		Reply(w, http.StatusOK, vols, err)
	})
	mux.HandleFunc("GET /volumes/{id}", func(w http.ResponseWriter, r *http.Request) {
		v, err := b.Volume(r.Context(), r.PathValue("id"))
		Reply(w, http.StatusOK, v, err)
	})
	mux.HandleFunc("PUT /volumes/{id}/condition", func(w http.ResponseWriter, r *http.Request) {
		var req sanity.ConditionRequest
		if !Decode(w, r, &req) {
			return
		}
		v, err := b.SetCondition(r.Context(), r.PathValue("id"), Condition(req.Condition), time.Duration(req.Hang))
		Reply(w, http.StatusOK, v, err)
	})
	mux.HandleFunc("PUT /volumes/{id}/staged", func(w http.ResponseWriter, r *http.Request) {
		var req sanity.StagedRequest
		if !Decode(w, r, &req) {
			return
		}
		v, err := b.SetStaged(r.Context(), r.PathValue("id"), req.Staged)
		Reply(w, http.StatusOK, v, err)
	})
	mux.HandleFunc("GET /counters", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, rec.Counters())
	})
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, rec.Calls())
	})
	mux.HandleFunc("DELETE /counters", func(w http.ResponseWriter, _ *http.Request) {
		rec.Reset()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// Decode reads the request's JSON body into into. A body that does not decode, or carries a
// field into does not have, is answered 400 here, and Decode returns false.
func Decode(w http.ResponseWriter, r *http.Request, into any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		writeJSON(w, http.StatusBadRequest, sanity.ErrorBody{Error: "invalid request body: " + err.Error()})
		return false
	}
	return true
}

// Reply answers a request: okStatus with body as JSON when err is nil (no body for 204), else
// the status of err's sentinel (500 for none) with the error body.
func Reply(w http.ResponseWriter, okStatus int, body any, err error) {
	switch {
	case err == nil && okStatus == http.StatusNoContent:
		w.WriteHeader(okStatus)
	case err == nil:
		writeJSON(w, okStatus, body)
	default:
		code := http.StatusInternalServerError
		for _, s := range httpStatus {
			if errors.Is(err, s.err) {
				code = s.status
				break
			}
		}
		writeJSON(w, code, sanity.ErrorBody{Error: err.Error()})
	}
}

// httpStatus is the answer's status for an error of a Backend.
var httpStatus = []struct {
	err    error
	status int
}{
	{ErrVolumeNotFound, http.StatusNotFound},
	{ErrVolumeExists, http.StatusConflict},
	{ErrInvalidRequest, http.StatusBadRequest},
	{ErrBusy, http.StatusServiceUnavailable},
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
