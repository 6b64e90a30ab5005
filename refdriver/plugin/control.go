package plugin

import (
	"context"
	"net/http"

	"github.com/volume-healer/volume-healer/refdriver/control"
)

// The control interface (package control) applies real faults to the plugin's volumes, for
// tests and the demo. It serves the paths every mode serves, with VolumeStatus as the volume;
// volumes are created and deleted through CSI (CreateVolume, DeleteVolume), not here. A fault
// the volume cannot take answers 400, a volume that stayed busy 503.

// ControlHandler returns the HTTP handler of the control interface.
func (p *Plugin) ControlHandler() http.Handler {
	return control.Handler(controlBackend{p}, p.counters)
}

// controlBackend is the Plugin as the control interface's backend.
type controlBackend struct{ *Plugin }

var _ control.Backend[VolumeStatus] = controlBackend{}

// Volume reports one volume with the condition its checks observe now.
func (b controlBackend) Volume(ctx context.Context, id string) (VolumeStatus, error) {
	return b.VolumeStatus(ctx, id)
}
