package realcluster

import (
	"strings"
	"testing"
	"time"
)

// An evicted pod's first failure and its replacement's first good try make one outage, whatever
// order the pods' outputs were read in; a good try before the first failure does not end it.
func TestSlotOutageAcrossPods(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return at.Add(time.Duration(n) * time.Millisecond) }
	tries := []podTry{
		{pod: "new", try: try{Seq: 2, Time: ms(5200), OK: true}},
		{pod: "old", try: try{Seq: 10, Time: ms(100), OK: true}},
		{pod: "old", try: try{Seq: 12, Time: ms(300), OK: false, Op: "write", Err: "transport endpoint is not connected"}},
		{pod: "old", try: try{Seq: 11, Time: ms(200), OK: false, Op: "open", Err: "transport endpoint is not connected"}},
		{pod: "new", try: try{Seq: 1, Time: ms(5100), OK: true}},
	}
	o := slotOutage(tries)
	if !o.Over() || o.FailedPod != "old" || o.ResumedPod != "new" || o.Duration() != 4900*time.Millisecond {
		t.Fatalf("outage %s, want 4.9s from pod old's open to pod new's first try", o)
	}
	if o.Failure != "open: transport endpoint is not connected" {
		t.Errorf("failure %q", o.Failure)
	}
	if o := slotOutage(tries[:2]); o.Over() || !o.FirstFailure.IsZero() || o.Duration() != 0 {
		t.Errorf("tries without a failure: %s, want none", o)
	}
	if o := slotOutage(tries[1:4]); o.Over() || o.Duration() != 0 || !strings.HasPrefix(o.String(), "failing since") {
		t.Errorf("a failure not over yet: %s", o)
	}
}

func TestPercentileNearestRank(t *testing.T) {
	s := func(secs ...int) []time.Duration {
		var out []time.Duration
		for _, n := range secs {
			out = append(out, time.Duration(n)*time.Second)
		}
		return out
	}
	for _, c := range []struct {
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{nil, 50, -1},
		{s(7), 50, 7 * time.Second},
		{s(7), 99, 7 * time.Second},
		{s(4, 1, 3, 2), 50, 2 * time.Second},
		{s(4, 1, 3, 2), 99, 4 * time.Second},
		{s(4, 1, 3, 2), 100, 4 * time.Second},
		{s(5, 1, 4, 2, 3), 50, 3 * time.Second},
	} {
		if got := Percentile(c.samples, c.p); got != c.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", c.samples, c.p, got, c.want)
		}
	}
}

func TestOutageTableKeepsRemediesInOrder(t *testing.T) {
	var tab OutageTable
	tab.Add(RemedyHeal, "rollout restart", 1500*time.Millisecond)
	tab.Add(RemedyRecycle, "stock rollout restart", 9*time.Second, 11*time.Second)
	tab.Add(RemedyHeal, "kill -9", 2500*time.Millisecond)
	got := tab.String()
	want := "| remedy | samples | p50 | p99 | max | from |\n|---|---|---|---|---|---|\n" +
		"| in-place heal (HostToContainer) | 2 | 1.50s | 2.50s | 2.50s | rollout restart; kill -9 |\n" +
		"| recycle (stock driver, rclone) | 2 | 9.00s | 11.00s | 11.00s | stock rollout restart |\n"
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}
