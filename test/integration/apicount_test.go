package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/volume-healer/volume-healer/test/harness"
)

// requestKey is one kind of API request: a verb as the audit log names it (get, list, watch,
// create, update, patch, delete, deletecollection) and a resource, with its subresource after a
// slash.
type requestKey struct{ verb, resource string }

// requestCounts counts API requests by kind.
type requestCounts map[requestKey]int

// byVerb sums the counts of one verb over all resources.
func (c requestCounts) byVerb(verb string) int {
	n := 0
	for k, v := range c {
		if k.verb == verb {
			n += v
		}
	}
	return n
}

func (c requestCounts) total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// writes sums the requests that change objects.
func (c requestCounts) writes() int {
	return c.total() - c.byVerb("get") - c.byVerb("list") - c.byVerb("watch")
}

func (c requestCounts) minus(o requestCounts) requestCounts {
	out := requestCounts{}
	for k, v := range c {
		if d := v - o[k]; d != 0 {
			out[k] = d
		}
	}
	for k, v := range o {
		if _, ok := c[k]; !ok {
			out[k] = -v
		}
	}
	return out
}

// only keeps the requests on the given resources.
func (c requestCounts) only(resources ...string) requestCounts {
	out := requestCounts{}
	for k, v := range c {
		if slices.Contains(resources, strings.SplitN(k.resource, "/", 2)[0]) {
			out[k] = v
		}
	}
	return out
}

// describe lists the counts as "verb resource: n", sorted.
func (c requestCounts) describe() string {
	var parts []string
	for k, v := range c {
		parts = append(parts, fmt.Sprintf("%s %s: %d", k.verb, k.resource, v))
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// metricVerbs maps the verb label of apiserver_request_total (HTTP methods, and LIST, WATCH and
// APPLY) onto the audit log's verbs.
var metricVerbs = map[string]string{
	"GET": "get", "LIST": "list", "WATCH": "watch", "WATCHLIST": "watch",
	"POST": "create", "PUT": "update", "PATCH": "patch", "APPLY": "patch",
	"DELETE": "delete", "DELETECOLLECTION": "deletecollection", "CONNECT": "connect",
}

// apiserverRequests reads apiserver_request_total from the apiserver's /metrics and sums it by
// verb and resource over every code, scope, group and version. Requests to non-resource paths
// (/metrics, /healthz, ...) are left out.
func apiserverRequests(t *testing.T, cs kubernetes.Interface) requestCounts {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
	defer cancel()
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("read the apiserver's /metrics: %v", err)
	}
	fams, err := harness.ParseMetrics(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("parse the apiserver's /metrics: %v", err)
	}
	fam := fams["apiserver_request_total"]
	if fam == nil {
		t.Fatal("the apiserver's /metrics has no apiserver_request_total")
	}
	out := requestCounts{}
	for _, m := range fam.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["resource"] == "" {
			continue
		}
		verb, ok := metricVerbs[labels["verb"]]
		if !ok {
			verb = strings.ToLower(labels["verb"])
		}
		res := labels["resource"]
		if labels["subresource"] != "" {
			res += "/" + labels["subresource"]
		}
		out[requestKey{verb, res}] += int(m.GetCounter().GetValue())
	}
	return out
}

// Clients as the audit log tells them apart, by user agent and user.
const (
	clientController     = "volume-healer controller"
	clientSidecar        = "healer sidecar"
	clientListEverything = "list-everything client"
	clientAPIServer      = "kube-apiserver (its own loops)"
	clientHarness        = "test harness"
)

// auditRecord is the part of an audit event that says who made which request, and when it ended.
type auditRecord struct {
	Stage     string `json:"stage"`
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	User      struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	StageTimestamp time.Time `json:"stageTimestamp"`
}

func (r auditRecord) client() string {
	switch ua := r.UserAgent; {
	case strings.HasPrefix(ua, "volume-healer"):
		return clientController
	case strings.HasPrefix(ua, "healer-sidecar"):
		return clientSidecar
	case strings.HasPrefix(ua, "list-everything"):
		return clientListEverything
	case r.User.Username == "system:apiserver":
		return clientAPIServer
	default:
		return clientHarness
	}
}

// auditWindow is a stretch of the audit log: what was appended after it opened, restricted to
// requests answered between its start and end.
type auditWindow struct {
	path       string
	offset     int64
	start, end time.Time
}

// openAuditWindow notes where the audit log ends now. The apiserver writes audit events before it
// answers (blocking mode), so every request answered from now on lands after that point.
func openAuditWindow(t *testing.T, path string) *auditWindow {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("audit log: %v", err)
	}
	return &auditWindow{path: path, offset: fi.Size(), start: time.Now()}
}

func (w *auditWindow) close() { w.end = time.Now() }

// byClient counts the window's requests to resources by client.
func (w *auditWindow) byClient(t *testing.T) map[string]requestCounts {
	t.Helper()
	f, err := os.Open(w.path)
	if err != nil {
		t.Fatalf("audit log: %v", err)
	}
	defer func() { _ = f.Close() }()
	if _, err := f.Seek(w.offset, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	out := map[string]requestCounts{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r auditRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit log line %q: %v", sc.Text(), err)
		}
		if r.Stage != "ResponseComplete" || r.ObjectRef == nil || r.ObjectRef.Resource == "" ||
			r.StageTimestamp.Before(w.start) || r.StageTimestamp.After(w.end) {
			continue
		}
		res := r.ObjectRef.Resource
		if r.ObjectRef.Subresource != "" {
			res += "/" + r.ObjectRef.Subresource
		}
		c := r.client()
		if out[c] == nil {
			out[c] = requestCounts{}
		}
		out[c][requestKey{r.Verb, res}]++
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read audit log: %v", err)
	}
	return out
}
