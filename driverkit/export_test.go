package driverkit

// StatsStarted returns how many stat goroutines c has started, so that a test can tell that
// probing a hung mount again started none.
func StatsStarted(c *Checker) int64 {
	return c.statsStarted.Load()
}
