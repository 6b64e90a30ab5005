package fuseconn

import "testing"

func TestReleaseAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"6.18.0-1-amd64": true,
		"6.9.0":          true,
		"6.8.12-rt":      false,
		"5.15.0":         false,
		"7.0":            true,
		"garbage":        false,
	} {
		if got := releaseAtLeast(release, 6, 9); got != want {
			t.Errorf("releaseAtLeast(%q, 6, 9) = %t, want %t", release, got, want)
		}
	}
}
