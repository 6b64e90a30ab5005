package scale

import (
	"net/url"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	tests := map[string]struct {
		method, url string
		want        requestKey
	}{
		"cluster-scoped list":       {"GET", "/api/v1/persistentvolumes?limit=500&resourceVersion=0", requestKey{"LIST", "persistentvolumes"}},
		"cluster-scoped get":        {"GET", "/api/v1/persistentvolumes/pvc-1", requestKey{"GET", "persistentvolumes"}},
		"watch":                     {"GET", "/api/v1/persistentvolumes?watch=true&resourceVersion=1", requestKey{"WATCH", "persistentvolumes"}},
		"namespaced get":            {"GET", "/api/v1/namespaces/rook-ceph/secrets/rook-csi-rbd-node", requestKey{"GET", "secrets"}},
		"namespaced list":           {"GET", "/api/v1/namespaces/rook-ceph/secrets", requestKey{"LIST", "secrets"}},
		"namespace object":          {"GET", "/api/v1/namespaces/rook-ceph", requestKey{"GET", "namespaces"}},
		"group resource patch":      {"PATCH", "/apis/csiaddons.openshift.io/v1alpha1/namespaces/csi-rbd/csiaddonsnodes/node-1-rbd", requestKey{"PATCH", "csiaddonsnodes"}},
		"status subresource":        {"PUT", "/apis/storage.k8s.io/v1/volumeattachments/csi-abc/status", requestKey{"PUT", "volumeattachments/status"}},
		"create":                    {"POST", "/apis/authentication.k8s.io/v1/tokenreviews", requestKey{"POST", "tokenreviews"}},
		"delete collection":         {"DELETE", "/api/v1/namespaces/app/persistentvolumeclaims", requestKey{"DELETECOLLECTION", "persistentvolumeclaims"}},
		"non-resource":              {"GET", "/metrics", requestKey{Verb: "GET"}},
		"group list across all ns":  {"GET", "/apis/csiaddons.openshift.io/v1alpha1/csiaddonsnodes", requestKey{"LIST", "csiaddonsnodes"}},
		"namespaced status of pvcs": {"PUT", "/api/v1/namespaces/app-00/persistentvolumeclaims/data/status", requestKey{"PUT", "persistentvolumeclaims/status"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			if got := classify(tc.method, u); got != tc.want {
				t.Errorf("classify(%s %s) = %v, want %v", tc.method, tc.url, got, tc.want)
			}
		})
	}
}

func TestIdealFinish(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	many := make([]nodeArrival, 200)
	for i := range many {
		many[i] = nodeArrival{ready: t0, tasks: 100}
	}
	// One node holds ten times the others' work: taking turns leaves it to run alone at the end.
	uneven := []nodeArrival{{ready: t0, tasks: 400}}
	for range 60 {
		uneven = append(uneven, nodeArrival{ready: t0, tasks: 40})
	}
	tests := map[string]struct {
		nodes        []nodeArrival
		global, node int
		fair         bool
		want         time.Duration
	}{
		// 20,000 calls of 50ms through 64 slots: 313 rounds.
		"all work at once, global budget binds": {many, 64, 4, false, 313 * 50 * time.Millisecond},
		// One node with 100 calls and 4 slots: 25 rounds.
		"one node, per-node budget binds": {[]nodeArrival{{ready: t0, tasks: 100}}, 64, 4, false, 25 * 50 * time.Millisecond},
		// The second node's work arrives after the first's is done.
		"late arrival": {[]nodeArrival{{ready: t0, tasks: 4}, {ready: t0.Add(time.Second), tasks: 4}}, 64, 4, false, time.Second + 50*time.Millisecond},
		// The big node keeps its 4 slots from the start: 100 rounds.
		"uneven, most work first": {uneven, 64, 4, false, 100 * 50 * time.Millisecond},
		// 61 nodes share 64 slots, 64/61 each a round, for 38 rounds until the small nodes are
		// done; then the big node has 360 calls left at 4 a time: 90 more rounds.
		"uneven, taking turns": {uneven, 64, 4, true, 128 * 50 * time.Millisecond},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := idealFinish(tc.nodes, 50*time.Millisecond, tc.global, tc.node, tc.fair).Sub(t0)
			if got != tc.want {
				t.Errorf("ideal finish after %s, want %s", got, tc.want)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{5, 1, 4, 2, 3}
	tests := map[string]struct {
		p, want float64
	}{
		"minimum": {0, 1},
		"median":  {50, 3},
		"p99":     {99, 5},
		"maximum": {100, 5},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := percentile(v, tc.p); got != tc.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", v, tc.p, got, tc.want)
			}
		})
	}
}
