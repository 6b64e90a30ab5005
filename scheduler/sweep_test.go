package scheduler

import (
	"testing"
	"time"
)

func TestStaggerOffset(t *testing.T) {
	window := 5 * time.Minute
	seen := map[time.Duration]bool{}
	for i := 0; i < 50; i++ {
		node := "node-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		off := StaggerOffset(node, window)
		if off < 0 || off >= window {
			t.Fatalf("offset of %s = %v, outside [0, %v)", node, off, window)
		}
		if again := StaggerOffset(node, window); again != off {
			t.Fatalf("offset of %s changed: %v then %v", node, off, again)
		}
		seen[off] = true
	}
	if len(seen) < 45 {
		t.Errorf("50 nodes got only %d distinct offsets: the stagger does not spread them", len(seen))
	}
	if got := StaggerOffset("node-a", 0); got != 0 {
		t.Errorf("offset with no window = %v, want 0", got)
	}
}
