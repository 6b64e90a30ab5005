package scale

import (
	"io"
	"maps"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// requestKey names an API request the way apiserver_request_total does: the verb (LIST, GET,
// WATCH, POST, PUT, PATCH, DELETE) and the resource, with the subresource after a slash
// ("persistentvolumes/status"). Non-resource requests (/metrics, /readyz) have no resource.
type requestKey struct {
	Verb     string
	Resource string
}

func (k requestKey) String() string { return k.Verb + " " + k.Resource }

// classify reads the verb and resource of a request to the Kubernetes API from its method and
// path: /api/v1/[namespaces/<ns>/]<resource>[/<name>[/<sub>]] and the same under
// /apis/<group>/<version>/.
func classify(method string, u *url.URL) requestKey {
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		rest = parts[3:]
	default:
		return requestKey{Verb: method}
	}
	// A namespaced path, unless it is the namespace object itself (/api/v1/namespaces/<name>).
	if len(rest) >= 3 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	if len(rest) == 0 {
		return requestKey{Verb: method}
	}
	resource, named := rest[0], len(rest) >= 2
	if len(rest) >= 3 {
		resource += "/" + rest[2]
	}
	verb := method
	switch method {
	case http.MethodGet:
		switch {
		case u.Query().Get("watch") == "true" || u.Query().Get("watch") == "1":
			verb = "WATCH"
		case named:
			verb = "GET"
		default:
			verb = "LIST"
		}
	case http.MethodDelete:
		if !named {
			verb = "DELETECOLLECTION"
		}
	}
	return requestKey{Verb: verb, Resource: resource}
}

// requestStats counts requests and response bytes per requestKey. It is safe for concurrent use.
type requestStats struct {
	mu     sync.Mutex
	counts map[requestKey]int64
	bytes  map[requestKey]int64
}

func newRequestStats() *requestStats {
	return &requestStats{counts: map[requestKey]int64{}, bytes: map[requestKey]int64{}}
}

func (s *requestStats) add(k requestKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[k]++
}

func (s *requestStats) addBytes(k requestKey, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bytes[k] += n
}

// requestSnapshot is a copy of the counts and bytes at one moment.
type requestSnapshot struct {
	Counts map[requestKey]int64
	Bytes  map[requestKey]int64
}

func (s *requestStats) snapshot() requestSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return requestSnapshot{Counts: maps.Clone(s.counts), Bytes: maps.Clone(s.bytes)}
}

// since returns what was counted between earlier and s.
func (s requestSnapshot) since(earlier requestSnapshot) requestSnapshot {
	out := requestSnapshot{Counts: map[requestKey]int64{}, Bytes: map[requestKey]int64{}}
	for k, v := range s.Counts {
		if d := v - earlier.Counts[k]; d != 0 {
			out.Counts[k] = d
		}
	}
	for k, v := range s.Bytes {
		if d := v - earlier.Bytes[k]; d != 0 {
			out.Bytes[k] = d
		}
	}
	return out
}

// plus adds the counts and bytes of o.
func (s requestSnapshot) plus(o requestSnapshot) requestSnapshot {
	out := requestSnapshot{Counts: maps.Clone(s.Counts), Bytes: maps.Clone(s.Bytes)}
	if out.Counts == nil {
		out.Counts = map[requestKey]int64{}
	}
	if out.Bytes == nil {
		out.Bytes = map[requestKey]int64{}
	}
	for k, v := range o.Counts {
		out.Counts[k] += v
	}
	for k, v := range o.Bytes {
		out.Bytes[k] += v
	}
	return out
}

// total counts the requests whose verb is in verbs (all requests when verbs is empty), WATCH
// excepted unless asked for: a watch is one long request, not a per-sweep cost.
func (s requestSnapshot) total(verbs ...string) int64 {
	var n int64
	for k, v := range s.Counts {
		if len(verbs) == 0 && k.Verb != "WATCH" {
			n += v
			continue
		}
		for _, verb := range verbs {
			if k.Verb == verb {
				n += v
			}
		}
	}
	return n
}

// byKey renders the counts as "VERB resource" → count, for results.json.
func (s requestSnapshot) byKey() map[string]int64 {
	out := make(map[string]int64, len(s.Counts))
	for k, v := range s.Counts {
		out[k.String()] = v
	}
	return out
}

// totalBytes sums the response bytes, watches excepted.
func (s requestSnapshot) totalBytes() int64 {
	var n int64
	for k, v := range s.Bytes {
		if k.Verb != "WATCH" {
			n += v
		}
	}
	return n
}

// describe lists the counts in a stable order, for logs.
func (s requestSnapshot) describe() string {
	keys := make([]string, 0, len(s.Counts))
	for k, v := range s.Counts {
		keys = append(keys, k.String()+"="+strconv.FormatInt(v, 10))
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}

// countingTransport counts every request that passes through it, and the bytes of the responses.
// narrow, when set, may rewrite a request before it is sent; observe, when set, sees every
// response (or error) with the request's key.
type countingTransport struct {
	base    http.RoundTripper
	stats   *requestStats
	narrow  func(*http.Request, requestKey) *http.Request
	observe func(requestKey, *http.Response, error)
}

// RoundTrip counts and forwards one request.
func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := classify(req.Method, req.URL)
	if t.narrow != nil {
		req = t.narrow(req, key)
	}
	t.stats.add(key)
	resp, err := t.base.RoundTrip(req)
	if t.observe != nil {
		t.observe(key, resp, err)
	}
	if err == nil && resp.Body != nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, add: func(n int64) { t.stats.addBytes(key, n) }}
	}
	return resp, err
}

// countingBody reports how many bytes were read from a response body.
type countingBody struct {
	io.ReadCloser
	add func(int64)
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.add(int64(n))
	}
	return n, err
}
