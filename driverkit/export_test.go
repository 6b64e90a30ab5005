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

// TableReads returns how many times a kept-open mount table was read anew, so that a test can
// tell that a read with no change between found the table it had.
func TableReads() int64 {
	return tableReads.Load()
}

// NamespaceTables returns the mount namespaces whose tables c keeps open.
func NamespaceTables(c *Checker) []string {
	c.nsMu.Lock()
	defer c.nsMu.Unlock()
	var out []string
	for ns := range c.nsTables {
		out = append(out, ns)
	}
	return out
}

// StaleSearchReuse is how old a search of the mount namespaces a probe may take.
const StaleSearchReuse = staleSearchReuse

// WriteFakeProcess puts a process into a fake /proc folder (CheckerOptions.Proc): its mount
// namespace and its mount table.
var WriteFakeProcess = writeFakeProcess
