package plugin

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/volume-healer/volume-healer/refdriver/driver"
)

// The control interface applies real faults to the plugin's volumes, for tests and the demo.
// It speaks the simulated driver's paths and bodies (package driver's control.go), so that
// driver.ControlClient and `healerctl sanity --control` drive both modes alike:
//
//	GET    /volumes                    every volume, checked now       200 []VolumeStatus
//	GET    /volumes/{id}               one volume, checked now         200 VolumeStatus
//	PUT    /volumes/{id}/condition     apply a fault, or repair        200 VolumeStatus
//	                                   body {"condition": "hung", "hang": "5s"}
//	PUT    /volumes/{id}/staged        unstage, or stage again         200 VolumeStatus
//	                                   body {"staged": false}
//	GET    /counters                   call counters                   200 driver.Counters
//	GET    /calls                      the call log, oldest first      200 []driver.Call
//	DELETE /counters                   reset counters and the log      204
//
// Volumes are created and deleted through CSI (CreateVolume, DeleteVolume), not here. Errors
// answer 400 (bad body or value, a fault the volume cannot take), 404 (unknown volume), 503
// (the volume stayed busy) or 500, with the body {"error": "..."}.

// ControlHandler returns the HTTP handler of the control interface.
func (p *Plugin) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /volumes", func(w http.ResponseWriter, r *http.Request) {
		vols, err := p.Volumes(r.Context())
		reply(w, vols, err)
	})
	mux.HandleFunc("GET /volumes/{id}", func(w http.ResponseWriter, r *http.Request) {
		vs, err := p.VolumeStatus(r.Context(), r.PathValue("id"))
		reply(w, vs, err)
	})
	mux.HandleFunc("PUT /volumes/{id}/condition", func(w http.ResponseWriter, r *http.Request) {
		var req driver.ConditionRequest
		if !readBody(w, r, &req) {
			return
		}
		vs, err := p.SetCondition(r.Context(), r.PathValue("id"), req.Condition, time.Duration(req.Hang))
		reply(w, vs, err)
	})
	mux.HandleFunc("PUT /volumes/{id}/staged", func(w http.ResponseWriter, r *http.Request) {
		var req driver.StagedRequest
		if !readBody(w, r, &req) {
			return
		}
		vs, err := p.SetStaged(r.Context(), r.PathValue("id"), req.Staged)
		reply(w, vs, err)
	})
	mux.HandleFunc("GET /counters", func(w http.ResponseWriter, _ *http.Request) {
		writeReply(w, http.StatusOK, p.counters.snapshot())
	})
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, _ *http.Request) {
		writeReply(w, http.StatusOK, p.counters.log())
	})
	mux.HandleFunc("DELETE /counters", func(w http.ResponseWriter, _ *http.Request) {
		p.counters.reset()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

type errorBody struct {
	Error string `json:"error"`
}

func readBody(w http.ResponseWriter, r *http.Request, into any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		writeReply(w, http.StatusBadRequest, errorBody{Error: "invalid request body: " + err.Error()})
		return false
	}
	return true
}

func reply(w http.ResponseWriter, body any, err error) {
	switch {
	case err == nil:
		writeReply(w, http.StatusOK, body)
	case errors.Is(err, ErrVolumeNotFound):
		writeReply(w, http.StatusNotFound, errorBody{Error: err.Error()})
	case errors.Is(err, ErrInvalidRequest):
		writeReply(w, http.StatusBadRequest, errorBody{Error: err.Error()})
	case errors.Is(err, ErrBusy):
		writeReply(w, http.StatusServiceUnavailable, errorBody{Error: err.Error()})
	default:
		writeReply(w, http.StatusInternalServerError, errorBody{Error: err.Error()})
	}
}

func writeReply(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
