package integration

import (
	"testing"

	"github.com/volume-healer/volume-healer/test/harness"
)

// fixture is one test's corner of the cluster (see harness.Fixture), with the suite it runs in.
type fixture struct {
	*harness.Fixture
	t *testing.T
	s *harness.Suite
}

// newFixture creates the driver's CSIDriver, the namespaces and the stage Secret. name must be a
// short DNS label: it prefixes every object of the test.
func newFixture(t *testing.T, name string) *fixture {
	t.Helper()
	s := harness.Require(t)
	return &fixture{Fixture: harness.NewFixture(t, s.Env, harness.FixtureOptions{Name: name}), t: t, s: s}
}

// volume is one test volume: its API objects and the reference driver's record of it.
type volume = harness.Volume

// newVolumes describes n volumes of class on node p, named <fixture>-<tag>-<i>, and gives them to
// its driver. mounter is the driver's: "rbd-nbd" or "krbd".
func (f *fixture) newVolumes(p *plugin, class, mounter, tag string, n int) []*volume {
	vols := f.NewVolumes(p.Node(), p.Control(), class, mounter, tag, n)
	p.AddVolumes(harness.Specs(vols)...)
	p.volumes = append(p.volumes, vols...)
	return vols
}

// startController starts a controller with the suite's test settings, overridden by env
// (VOLUME_HEALER_* names without the prefix), and waits until it reports ready. It is stopped
// when the test ends; a failed test shows the end of its log.
func startController(t *testing.T, name string, env map[string]string) *harness.TestController {
	t.Helper()
	return harness.Require(t).StartController(t, name, env)
}
