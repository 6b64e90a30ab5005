package realcluster

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"

	"github.com/volume-healer/volume-healer/test/harness"
)

// cpuUse is what the machine's CPUs did up to one moment: the time they were busy and idle
// (/proc/stat), and the CPU time of each process then alive (/proc/<pid>/stat), by pid.
type cpuUse struct {
	at         time.Time
	busy, idle float64
	procs      map[int]procCPU
}

// procCPU is one process's name and its CPU time so far, in seconds, in user space and in the
// kernel.
type procCPU struct {
	name         string
	user, system float64
}

// procName is what the CPU account calls a process: its command name, and its first argument
// when that is a word (a subcommand: "refdriver mounter").
func procName(p procfs.Proc, comm string) string {
	args, err := p.CmdLine()
	if err != nil || len(args) < 2 {
		return comm
	}
	a := args[1]
	if a == "" || len(a) > 20 || strings.ContainsAny(a, "-/=.:") {
		return comm
	}
	return comm + " " + a
}

// readCPUUse reads the machine's cpuUse now.
func readCPUUse() (cpuUse, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return cpuUse{}, err
	}
	st, err := fs.Stat()
	if err != nil {
		return cpuUse{}, fmt.Errorf("read /proc/stat: %w", err)
	}
	c := st.CPUTotal
	u := cpuUse{
		at:    time.Now(),
		busy:  c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal,
		idle:  c.Idle + c.Iowait,
		procs: map[int]procCPU{},
	}
	all, err := fs.AllProcs()
	if err != nil {
		return cpuUse{}, fmt.Errorf("list /proc: %w", err)
	}
	for _, p := range all {
		ps, err := p.Stat()
		if err != nil {
			continue // gone meanwhile
		}
		u.procs[p.PID] = procCPU{
			name:   procName(p, ps.Comm),
			user:   float64(ps.UTime) / userHZ,
			system: float64(ps.STime) / userHZ,
		}
	}
	return u, nil
}

// since is a table of what the CPUs did from before to u: how busy they were, and the processes
// that used the most CPU meanwhile, by name (top of them; the rest in one row). A process that
// ended before u is not counted by name: its time is in the row of processes not seen at the end.
func (u cpuUse) since(before cpuUse, top int) string {
	busy, idle := u.busy-before.busy, u.idle-before.idle
	type use struct{ user, system float64 }
	byName := map[string]use{}
	counted := 0.0
	for pid, p := range u.procs {
		du, ds := p.user, p.system
		if b, ok := before.procs[pid]; ok && b.name == p.name {
			du, ds = du-b.user, ds-b.system
		}
		if du+ds > 0 {
			n := byName[p.name]
			n.user, n.system = n.user+du, n.system+ds
			byName[p.name] = n
			counted += du + ds
		}
	}
	total := func(n string) float64 { return byName[n].user + byName[n].system }
	names := slices.SortedFunc(maps.Keys(byName), func(a, b string) int { return cmp.Compare(total(b), total(a)) })
	var b strings.Builder
	wall := u.at.Sub(before.at).Seconds()
	share := 0.0
	if busy+idle > 0 {
		share = busy / (busy + idle)
	}
	fmt.Fprintf(&b, "CPUs busy %.0f%% of %.1fs (%.1f CPU-seconds busy, %.1f idle)\n", 100*share, wall, busy, idle)
	b.WriteString("| processes | CPU-seconds | of it in the kernel |\n|---|---:|---:|\n")
	rest := 0.0
	for i, n := range names {
		if i >= top {
			rest += total(n)
			continue
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.2f |\n", n, total(n), byName[n].system)
	}
	if rest > 0 {
		fmt.Fprintf(&b, "| (%d other names) | %.2f | |\n", len(names)-top, rest)
	}
	if gone := busy - counted; gone > 0 {
		fmt.Fprintf(&b, "| (ended meanwhile, and the kernel's own) | %.2f | |\n", gone)
	}
	return b.String()
}

// logCPUSince logs what the CPUs did from start (read with err) to now, under what, with the top
// processes by name; or why it cannot.
func logCPUSince(t harness.TB, what string, start cpuUse, err error, top int) {
	t.Helper()
	end, endErr := readCPUUse()
	if err = errors.Join(err, endErr); err != nil {
		t.Logf("no CPU account %s: %v", what, err)
		return
	}
	t.Logf("the CPUs %s:\n%s", what, end.since(start, top))
}
