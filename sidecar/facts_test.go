package sidecar_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
)

// apiCounter counts a sidecar's requests to the API server by "VERB resource": the verb is the
// HTTP method, or LIST and WATCH for a GET of a collection, and the resource its plural
// ("persistentvolumes", "volumeattachments", "secrets", "nodes"...).
type apiCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *apiCounter) wrap(o *sidecar.Options) {
	c.counts = map[string]int{}
	o.KubeConfig.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			kind, verb := "", req.Method
			for _, k := range []string{"persistentvolumes", "volumeattachments", "secrets", "csiaddonsnodes", "nodes", "tokenreviews"} {
				if strings.Contains(req.URL.Path, "/"+k) {
					kind = k
					if verb == http.MethodGet && strings.HasSuffix(req.URL.Path, "/"+k) {
						verb = "LIST"
						if req.URL.Query().Get("watch") == "true" {
							verb = "WATCH"
						}
					}
					break
				}
			}
			c.mu.Lock()
			c.counts[verb+" "+kind]++
			c.mu.Unlock()
			return rt.RoundTrip(req)
		})
	})
}

func (c *apiCounter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[key]
}

// TestCallsWithFactsReadNothingPerVolume: a sidecar whose calls carry the PV's facts (as the
// controller sends them) reads no PersistentVolume and no VolumeAttachment, at its start or for
// any of the node's volumes: it learns what is attached to its node from its Node, and reads a
// node-stage Secret only for the calls that pass it to the driver. Its restart marker is written
// without waiting for anything per volume.
func TestCallsWithFactsReadNothingPerVolume(t *testing.T) {
	f := newFixture(t)
	const n = 30
	var handles []string
	for i := range n {
		handles = append(handles, "vol-"+string(rune('a'+i%26))+strings.Repeat("x", i/26))
	}
	d := f.startDriver(simulated.Options{SeedVolumes: handles}, nil)
	secretNS := f.namespace
	f.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretNS, Name: "stage"}, Data: map[string][]byte{"key": []byte("k")}})
	var pvs []*corev1.PersistentVolume
	for i, h := range handles {
		pv := f.pv("pv-"+h, h, func(pv *corev1.PersistentVolume) {
			if i == 0 {
				pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: secretNS, Name: "stage"}
			}
		})
		f.create(pv)
		pvs = append(pvs, pv)
	}
	counter := &apiCounter{}
	sc := f.startSidecar(counter.wrap)
	select {
	case <-sc.s.Registered():
	case <-time.After(20 * time.Second):
		t.Fatal("no restart marker 20 s after the start")
	}
	ctx := f.as(f.token(controllerSA))
	for _, pv := range pvs {
		if _, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: pv.Name, Volume: probe.FactsOf(pv)}); err != nil {
			t.Fatalf("probe of %s with its facts: %v", pv.Name, err)
		}
	}
	// The heal of the volume with a Secret hands the driver the Secret, read once.
	if _, err := sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: pvs[0].Name, Volume: probe.FactsOf(pvs[0])}); err != nil {
		t.Fatalf("heal of %s with its facts: %v", pvs[0].Name, err)
	}
	if got := f.recorder.Heal().GetSecrets()["key"]; got != "k" {
		t.Errorf("the driver's heal got secret key %q, want %q", got, "k")
	}
	if got := f.recorder.Heal().GetStagingTargetPath(); got != healerv1alpha1.StagingTargetPath(f.stagingRoot(), f.driverName, handles[0]) {
		t.Errorf("the driver's heal got staging path %q", got)
	}
	for key, want := range map[string]int{
		"GET persistentvolumes": 0, "GET volumeattachments": 0, "LIST persistentvolumes": 0, "LIST volumeattachments": 0,
		// The Node is listed once, with its name as field selector, and watched.
		"GET nodes": 0, "LIST nodes": 1,
		// The Secret is read once: for the probe by the driver, and the heal within its cache
		// time goes by that read.
		"GET secrets": 1,
	} {
		if got := counter.get(key); got > want {
			t.Errorf("%d requests %s for a start and %d probes with facts, want at most %d (all: %v)", got, key, n, want, counter.counts)
		}
	}
	// The Node said the volumes are here: the driver's list was not needed for it.
	if got := d.Counters().Calls["ListStagedVolumes"]; got != 0 {
		t.Errorf("the driver was asked %d times for its staged volumes, want 0: the Node lists them attached", got)
	}
	t.Logf("the sidecar's requests for its start, %d probes and a heal: %v", n, counter.counts)
}

// TestFactsDoNotPlaceAVolumeOnTheNode: whatever the caller says of a volume, the sidecar acts on
// it only when its node shows it there: facts that name a volume attached to another node (under
// the name of a PV of this node), or attached nowhere, are refused with FAILED_PRECONDITION
// without reaching the driver; facts that are not valid are INVALID_ARGUMENT.
func TestFactsDoNotPlaceAVolumeOnTheNode(t *testing.T) {
	f := newFixture(t)
	d := f.startDriver(simulated.Options{}, nil)
	elsewhere := func(node string) func(*corev1.PersistentVolume) {
		return func(pv *corev1.PersistentVolume) { pv.Annotations = map[string]string{attachedTo: node} }
	}
	here := f.pv("here", "vol-1")
	f.create(here)
	other := f.pv("elsewhere", "vol-of-node-b", elsewhere("node-b-"+f.id))
	f.create(other)
	counter := &apiCounter{}
	sc := f.startSidecar(counter.wrap)
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))

	lying := probe.FactsOf(here)
	lying.VolumeHandle = "vol-of-node-b"
	nowhere := probe.FactsOf(here)
	nowhere.VolumeHandle = "vol-of-nobody"
	otherDriver := probe.FactsOf(here)
	otherDriver.DriverName = "other.example.com"
	badMode := probe.FactsOf(here)
	badMode.AccessModes = []string{"ReadWriteSometimes"}
	halfSecret := probe.FactsOf(here)
	halfSecret.NodeStageSecretRef = &healerv1alpha1.SecretReference{Name: "stage"}
	for name, tc := range map[string]struct {
		pv    string
		facts *healerv1alpha1.VolumeFacts
		want  codes.Code
	}{
		"true facts of a volume attached here":                  {pv: here.Name, facts: probe.FactsOf(here), want: codes.OK},
		"this node's PV name with another node's volume handle": {pv: here.Name, facts: lying, want: codes.FailedPrecondition},
		"another node's PV with its true facts":                 {pv: other.Name, facts: probe.FactsOf(other), want: codes.FailedPrecondition},
		"a volume handle attached nowhere":                      {pv: here.Name, facts: nowhere, want: codes.FailedPrecondition},
		"facts of another driver":                               {pv: here.Name, facts: otherDriver, want: codes.InvalidArgument},
		"an access mode Kubernetes does not have":               {pv: here.Name, facts: badMode, want: codes.InvalidArgument},
		"a node-stage Secret reference without namespace":       {pv: here.Name, facts: halfSecret, want: codes.InvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			d.ResetCounters()
			_, perr := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: tc.pv, Volume: tc.facts})
			_, herr := sc.client.HealVolume(ctx, &healerv1alpha1.NodeHealVolumeRequest{PvName: tc.pv, Volume: tc.facts})
			for rpc, err := range map[string]error{"probe": perr, "heal": herr} {
				if status.Code(err) != tc.want {
					t.Errorf("%s: %v, want %s", rpc, err, tc.want)
				}
				if tc.want == codes.FailedPrecondition {
					for _, want := range []string{`PersistentVolume "` + tc.pv + `"`, `on node "` + f.nodeName + `"`, "acts only on its node's volumes"} {
						if msg := status.Convert(err).Message(); !strings.Contains(msg, want) {
							t.Errorf("%s: %q does not say %q", rpc, msg, want)
						}
					}
				}
			}
			if c := d.Counters().Calls; tc.want != codes.OK && (c["ProbeVolume"] != 0 || c["HealVolume"] != 0) {
				t.Errorf("a volume not on this node reached the driver: %d probes, %d heals", c["ProbeVolume"], c["HealVolume"])
			}
		})
	}
	if got := counter.get("GET volumeattachments") + counter.get("GET persistentvolumes"); got != 0 {
		t.Errorf("the sidecar read %d PVs and VolumeAttachments for calls with facts, want 0: %v", got, counter.counts)
	}
}

// TestMarkerWhenTheDriverIsReady: the restart marker is written once the driver answers on its
// CSI-Addons socket, not before (a sweep would find the sidecar unable to answer), and within
// about a second of it, however long the driver took to come.
func TestMarkerWhenTheDriverIsReady(t *testing.T) {
	f := newFixture(t)
	sc := f.startSidecar(nil)
	// The driver comes after the sidecar has tried it for longer than its longest retry.
	select {
	case <-sc.s.Registered():
		t.Fatal("restart marker written before the driver answered")
	case <-time.After(3 * time.Second):
	}
	f.startDriver(simulated.Options{}, nil)
	driverUp := time.Now()
	select {
	case <-sc.s.Registered():
	case <-time.After(10 * time.Second):
		t.Fatal("no restart marker 10 s after the driver came up")
	}
	took := time.Since(driverUp)
	// The sidecar tries the socket at least every 200ms (with up to 20% jitter): its first call
	// reaches the driver within that of the driver's start, whatever the machine's load.
	asked := f.recorder.First("GetIdentity").Sub(driverUp)
	if asked > 500*time.Millisecond {
		t.Errorf("the sidecar first asked the driver %s after it was ready, want at most 500ms (it dials at least every 200ms)", asked.Round(time.Millisecond))
	}
	// Then two calls to the driver and the registration's LIST and PATCH.
	if took > 2*time.Second {
		t.Errorf("the restart marker came %s after the driver was ready, want at most 2s", took.Round(time.Millisecond))
	}
	t.Logf("the driver first asked %s and the restart marker written %s after the driver came up", asked.Round(time.Millisecond), took.Round(time.Millisecond))
}
