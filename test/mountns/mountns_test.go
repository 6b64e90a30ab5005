package mountns

import (
	"strings"
	"testing"
)

// A test runs in its parent's mount namespace (go test starts it without CLONE_NEWNS): refused,
// naming what starts the program correctly.
func TestRequireOwnRefusesTheParentsNamespace(t *testing.T) {
	if err := RequireOwn("test/harness's StartContainer"); err == nil || !strings.Contains(err.Error(), "as test/harness's StartContainer does") {
		t.Errorf("RequireOwn in the parent's namespace: %v, want a refusal naming StartContainer", err)
	}
}
