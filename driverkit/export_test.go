package driverkit

// StatsStarted returns how many stat goroutines c has started, so that a test can tell that
// probing a hung mount again started none.
func StatsStarted(c *Checker) int64 {
	return c.statsStarted.Load()
}

// ScansRun returns how many searches of the mount namespaces c has run, so that a test can tell
// that calls at once shared them.
func ScansRun(c *Checker) int64 {
	return c.scansRun.Load()
}
