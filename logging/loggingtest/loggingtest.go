// Package loggingtest checks, for the tests of each binary, what the logging flags of package
// logging make the binary write. Only tests import it.
package loggingtest

import (
	"encoding/json"
	"strings"
	"testing"
)

// AssertJSONLines fails t unless out holds at least one line, every line of out is a JSON object,
// and one of them has the message msg.
func AssertJSONLines(t testing.TB, out, msg string) {
	t.Helper()
	out = strings.TrimSpace(out)
	if out == "" {
		t.Fatalf("nothing was logged; want JSON lines, one with msg %q", msg)
	}
	found := false
	for _, line := range strings.Split(out, "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v\nall output:\n%s", line, err, out)
		}
		found = found || m["msg"] == msg
	}
	if !found {
		t.Errorf("no log line with msg %q in:\n%s", msg, out)
	}
}
