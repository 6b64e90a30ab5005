package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/kubelet"
)

// The states of a workload in the table, by its last iteration.
const (
	stateWriting = "writing"
	stateFailing = "failing"
	stateStalled = "stalled"
)

// stallAfter is how long a workload's iteration may run before the table calls it stalled: a
// healthy one takes milliseconds, one on a frozen mount blocks until the mounter goes.
const stallAfter = 2 * time.Second

// statTimeout bounds this program's own check of a mount whose plugin is down.
const statTimeout = 500 * time.Millisecond

// legend explains the table; it is printed above the first.
const legend = `  The table: mounts as each node's driver checks them (DISCONNECTED answers ENOTCONN, its mounter
  dead; HUNG does not answer; LOST has no data); workloads by their last iteration (WRITING wrote,
  synced and read back; FAILING got an error; STALLED blocked for 2s); PROBES and HEALS, the calls
  served by the node's current driver process.
`

// realView observes the real story's nodes, their mounts and workloads, and prints them as a
// table whenever what it shows changes.
type realView struct {
	nodes  []*realNode
	last   string
	legend bool
}

func newRealView(nodes []*realNode) *realView {
	return &realView{nodes: nodes}
}

// nodeState is one observation of a node.
type nodeState struct {
	node *realNode
	// byStat tells that the node's driver did not answer, so that this program checked the
	// staging mounts itself.
	byStat bool
	// conds are the volumes' conditions by volume ID.
	conds map[string]control.Condition
	// workloads are the workloads' states by volume ID.
	workloads map[string]string
	// probes and heals count the calls the node's current driver process served; -1 when down.
	probes, heals int64
}

// observe asks every node's driver for the conditions it observes on its mounts (each check is
// real: a stat of the mount, its mount options, its mounter process), and reads every workload.
func (v *realView) observe(ctx context.Context) []nodeState {
	now := time.Now()
	out := make([]nodeState, 0, len(v.nodes))
	for _, n := range v.nodes {
		st := nodeState{node: n, conds: map[string]control.Condition{}, workloads: map[string]string{}, probes: -1, heals: -1}
		var vols []simulated.Volume
		var err error
		if n.Running() {
			vols, err = n.ctl.Volumes(ctx)
		}
		if n.Running() && err == nil {
			for _, vol := range vols {
				st.conds[vol.ID] = vol.Condition
			}
			if c, err := n.ctl.Counters(ctx); err == nil {
				st.probes, st.heals = c.Calls["ProbeVolume"], c.Calls["HealVolume"]
			}
		} else {
			st.byStat = true
			for _, vol := range n.vols {
				st.conds[vol.Handle] = statMount(n.StagingPath(vol.Volume))
			}
		}
		for _, vol := range n.vols {
			st.workloads[vol.Handle] = workloadState(vol.workload, now)
		}
		out = append(out, st)
	}
	return out
}

// statMount checks a mount as any program on the node would, with statfs(2): a stat(2) of a FUSE
// mount may be answered from the kernel's attribute cache without reaching the mounter, a statfs
// always reaches it.
func statMount(path string) control.Condition {
	done := make(chan error, 1)
	go func() {
		var st syscall.Statfs_t
		done <- syscall.Statfs(path, &st)
	}()
	select {
	case err := <-done:
		switch {
		case err == nil:
			return control.Healthy
		case errors.Is(err, syscall.ENOTCONN), errors.Is(err, syscall.ECONNABORTED):
			// ECONNABORTED: the call was in flight when the mounter died.
			return control.Gone
		default:
			return control.Condition("error: " + err.Error())
		}
	case <-time.After(statTimeout):
		// The goroutine ends when the mount answers or its mounter goes.
		return control.Hung
	}
}

func workloadState(w *kubelet.Workload, now time.Time) string {
	res := w.Results()
	if len(res) == 0 {
		return stateStalled
	}
	last := res[len(res)-1]
	switch {
	case now.Sub(last.Time) > stallAfter:
		return stateStalled
	case last.OK:
		return stateWriting
	default:
		return stateFailing
	}
}

// watch prints the table whenever it changes, and new Events, until done holds.
func (v *realView) watch(ctx context.Context, timeout time.Duration, what string, events *eventPrinter, done func([]nodeState) (bool, string)) error {
	return harness.WaitFor(ctx, timeout, what, func() (bool, string) {
		events.print(ctx)
		st := v.observe(ctx)
		if table := v.table(st); table != v.last {
			if !v.legend {
				v.legend = true
				fmt.Print(legend)
			}
			fmt.Printf("  %s\n%s", time.Now().Format("15:04:05.000"), table)
			v.last = table
		}
		return done(st)
	})
}

func (v *realView) table(states []nodeState) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "  \tNODE\tPLUGIN\tHEALTHY\tDISCONNECTED\tREADONLY\tHUNG\tLOST\tWRITING\tFAILING\tSTALLED\tPROBES\tHEALS\n")
	var down []string
	for _, st := range states {
		conds := map[control.Condition]int{}
		for _, c := range st.conds {
			conds[c]++
		}
		work := map[string]int{}
		for _, s := range st.workloads {
			work[s]++
		}
		plugin, probes, heals := "running", fmt.Sprint(st.probes), fmt.Sprint(st.heals)
		if st.byStat {
			plugin, probes, heals = "down*", "-", "-"
			down = append(down, st.node.Node())
		}
		fmt.Fprintf(w, "  \t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", st.node.Node(), plugin,
			conds[control.Healthy], conds[control.Gone], conds[control.ReadOnly], conds[control.Hung], conds[control.Lost],
			work[stateWriting], work[stateFailing], work[stateStalled], probes, heals)
	}
	_ = w.Flush()
	if len(down) > 0 {
		fmt.Fprintf(&b, "    * no driver answers on %s: this program checks its staging mounts itself, with statfs(2)\n", strings.Join(down, ", "))
	}
	return b.String()
}

// volumes counts the volumes of every node.
func (v *realView) volumes() int {
	n := 0
	for _, node := range v.nodes {
		n += len(node.vols)
	}
	return n
}

// count counts the volumes of every node in condition c.
func (v *realView) count(states []nodeState, c control.Condition) int {
	n := 0
	for _, st := range states {
		n += v.nodeCount(states, st.node, c)
	}
	return n
}

// nodeCount counts the volumes of node in condition c.
func (v *realView) nodeCount(states []nodeState, node *realNode, c control.Condition) int {
	n := 0
	for _, vol := range node.vols {
		if v.condition(states, node, vol) == c {
			n++
		}
	}
	return n
}

// condition is the volume's condition in the observation, "" when it was not seen.
func (v *realView) condition(states []nodeState, node *realNode, vol *realVolume) control.Condition {
	for _, st := range states {
		if st.node == node {
			return st.conds[vol.Handle]
		}
	}
	return ""
}

// workloads counts the workloads of every node in state s.
func (v *realView) workloads(states []nodeState, s string) int {
	n := 0
	for _, st := range states {
		for _, ws := range st.workloads {
			if ws == s {
				n++
			}
		}
	}
	return n
}
