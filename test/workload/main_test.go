package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// In mode hold every record lands at its own offset of the one file opened at the start, so
// that a reader afterwards finds each record a try reported written.
func TestHoldWritesEachRecordAtItsOffset(t *testing.T) {
	dir := t.TempDir()
	do, done, err := newStep(modeHold, dir, "w")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for seq := int64(1); seq <= 3; seq++ {
		if op, err := do(seq, Record(seq, start)); err != nil {
			t.Fatalf("try %d: %s: %v", seq, op, err)
		}
	}
	done()
	got, err := os.ReadFile(filepath.Join(dir, "w.data"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3*RecordSize {
		t.Fatalf("the data file has %d bytes, want %d", len(got), 3*RecordSize)
	}
	for seq := int64(1); seq <= 3; seq++ {
		rec := string(got[(seq-1)*RecordSize : seq*RecordSize])
		if rec != Record(seq, start) {
			t.Errorf("record %d is %q, want %q", seq, rec, Record(seq, start))
		}
	}
}

// A held descriptor keeps writing to the file it opened: a file put in its place under the
// same name is not written, which is what a pod holding a file on a remounted volume sees.
func TestHoldKeepsItsDescriptor(t *testing.T) {
	dir := t.TempDir()
	do, done, err := newStep(modeHold, dir, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	file := filepath.Join(dir, "w.data")
	if err := os.Rename(file, file+".moved"); err != nil {
		t.Fatal(err)
	}
	if op, err := do(1, Record(1, time.Now())); err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("a file appeared under the old name (%v): the write did not go through the held descriptor", err)
	}
	if fi, err := os.Stat(file + ".moved"); err != nil || fi.Size() != RecordSize {
		t.Errorf("the held file: %v, want %d bytes", err, RecordSize)
	}
}

func TestDirFDCreatesAndReadsThroughTheFolder(t *testing.T) {
	dir := t.TempDir()
	do, done, err := newStep(modeDirFD, dir, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	for seq := int64(1); seq <= 2; seq++ {
		if op, err := do(seq, Record(seq, time.Now())); err != nil {
			t.Fatalf("try %d: %s: %v", seq, op, err)
		}
	}
	got, err := os.ReadFile(filepath.Join(dir, "w.entry"))
	if err != nil || !strings.HasPrefix(string(got), "2 ") {
		t.Errorf("w.entry = %q, %v; want the second record", got, err)
	}
	// The folder held open was removed: lookups through it fail instead of reaching another.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if op, err := do(3, Record(3, time.Now())); err == nil || op != "openat" {
		t.Errorf("a try in a removed held folder: %s, %v; want openat to fail", op, err)
	}
}

func TestUnknownModeIsRefused(t *testing.T) {
	if _, _, err := newStep("sometimes", t.TempDir(), "w"); err == nil || !strings.Contains(err.Error(), `"sometimes"`) {
		t.Errorf("mode sometimes: %v; want an error naming it", err)
	}
}

// With -report changes a loop prints its first try and each try whose outcome differs from the
// one before: a volume that failed three times in a row says when it failed and when it came
// back, in three lines that name its folder.
func TestReportChangesPrintsOnlyTransitions(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	do := func(seq int64, _ string) (string, error) {
		if seq == 8 {
			cancel()
		}
		if seq >= 3 && seq <= 5 {
			return "open", syscall.ENOTCONN
		}
		return "", nil
	}
	var buf bytes.Buffer
	if err := loop(ctx, do, time.Millisecond, time.Millisecond, &output{enc: json.NewEncoder(&buf)}, "/v1", true); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var r report
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if r.Dir != "/v1" {
			t.Errorf("line %q names folder %q, want /v1", line, r.Dir)
		}
		got = append(got, fmt.Sprintf("%d %t %s", r.Seq, r.OK, r.Err))
	}
	want := []string{"1 true ", "3 false transport endpoint is not connected", "6 true "}
	if !slices.Equal(got, want) {
		t.Errorf("lines %q, want %q", got, want)
	}
}

// With -ok-interval a loop retries a failure after -interval but tries a working volume only
// once per -ok-interval: the tries after a failed one come fast, the others slowly.
func TestOKIntervalSlowsOnlyTheWorkingTries(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const fast, slow = 5 * time.Millisecond, 100 * time.Millisecond
	var at []time.Time
	do := func(seq int64, _ string) (string, error) {
		at = append(at, time.Now())
		if seq == 6 {
			cancel()
		}
		if seq >= 2 && seq <= 4 {
			return "open", syscall.ENOTCONN
		}
		return "", nil
	}
	var buf bytes.Buffer
	if err := loop(ctx, do, fast, slow, &output{enc: json.NewEncoder(&buf)}, "", true); err != nil {
		t.Fatal(err)
	}
	if len(at) != 6 {
		t.Fatalf("%d tries, want 6", len(at))
	}
	// Tries 1 and 5 succeeded: the next came after the slow interval. Tries 2-4 failed: the
	// next came after the fast one.
	for i := 1; i < len(at); i++ {
		gap := at[i].Sub(at[i-1])
		prevOK := i == 1 || i == 5
		switch {
		case prevOK && gap < slow:
			t.Errorf("try %d came %s after a try that succeeded, want at least %s", i+1, gap, slow)
		case !prevOK && gap >= slow:
			t.Errorf("try %d came %s after a failed try, want about %s", i+1, gap, fast)
		}
	}
}
