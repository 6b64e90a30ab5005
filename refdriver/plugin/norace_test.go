//go:build !race

package plugin_test

// raceEnabled builds the plugin under test with the race detector when the tests have it.
const raceEnabled = false
