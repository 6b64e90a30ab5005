package cli

import (
	"os"
	"testing"

	"github.com/volume-healer/volume-healer/test/harness"
)

// TestMain unmounts the fusectl file system the supervisor tests' supervisors mount, when it was
// not mounted before the run, as the supervisor's and the plugin's tests do.
func TestMain(m *testing.M) {
	os.Exit(harness.RunUnmountingFuseControl(m))
}
