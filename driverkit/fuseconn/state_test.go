package fuseconn_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/volume-healer/volume-healer/driverkit/fuseconn"
)

func TestStateReplaysWhatAKilledServerJournaled(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := fuseconn.OpenState(dir, fuseconn.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	init := fuseconn.InitParams{Minor: 40, KernelMinor: 44, KernelFlags: 1 << 39, MaxWrite: 131072, TimeGran: 1}
	if err := s.SetInit(init); err != nil {
		t.Fatal(err)
	}
	a, _ := s.Lookup("a", 100)
	a2, _ := s.Lookup("a", 100)
	b, _ := s.Lookup("dir/b\nodd name", 101)
	c, _ := s.Lookup("dir/c", 102)
	if a.ID != a2.ID || a.ID == b.ID {
		t.Fatalf("node ids: a %d, a again %d, b %d; want one id per inode", a.ID, a2.ID, b.ID)
	}
	if err := s.Forget(c.ID, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Rename("dir", "moved"); err != nil {
		t.Fatal(err)
	}
	h, _ := s.Open(a.ID, uint32(os.O_RDWR|os.O_APPEND), false)
	gone, _ := s.Open(b.ID, 0, false)
	if err := s.Release(gone.ID); err != nil {
		t.Fatal(err)
	}
	// No Close: a killed server leaves its journal as its writes left it, with maybe half a
	// record at the end.
	f, err := os.OpenFile(filepath.Join(dir, "fuseconn.journal"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("N 99 12"); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()

	r, err := fuseconn.OpenState(dir, fuseconn.StateOptions{Takeover: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	if got, ok := r.Init(); !ok || got != init {
		t.Errorf("INIT parameters %+v (%v), want %+v", got, ok, init)
	}
	if got, ok := r.Node(a.ID); !ok || got.Path != "a" || got.Ino != 100 || got.Lookups != 2 {
		t.Errorf("node a: %+v (%v), want path a, inode 100, 2 lookups", got, ok)
	}
	if got, ok := r.Node(b.ID); !ok || got.Path != "moved/b\nodd name" {
		t.Errorf("node b: %+v (%v), want it renamed with its folder", got, ok)
	}
	if got, ok := r.Node(c.ID); ok {
		t.Errorf("node c is still there after it was forgotten: %+v", got)
	}
	if got, ok := r.Handle(h.ID); !ok || got.Node != a.ID || got.Flags != uint32(os.O_RDWR|os.O_APPEND) {
		t.Errorf("handle %d: %+v (%v), want node %d with its flags", h.ID, got, ok, a.ID)
	}
	if _, ok := r.Handle(gone.ID); ok {
		t.Errorf("released handle %d is still there", gone.ID)
	}
	if n, _ := r.Lookup("new", 103); n.ID == a.ID || n.ID == b.ID || n.ID == c.ID {
		t.Errorf("a new node took id %d of an earlier one", n.ID)
	}
}

func TestStateCompactsItsJournal(t *testing.T) {
	dir := t.TempDir()
	s, err := fuseconn.OpenState(dir, fuseconn.StateOptions{CompactAfter: 100})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetInit(fuseconn.InitParams{Minor: 40, MaxWrite: 4096}); err != nil {
		t.Fatal(err)
	}
	n, _ := s.Lookup("held", 7)
	for range 10000 {
		h, err := s.Open(n.ID, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Release(h.ID); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "fuseconn.journal"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(data), "\n"); lines > 110 {
		t.Errorf("the journal has %d lines after 20000 changes to a state of 2 nodes, want it compacted to at most 110", lines)
	}
	r, err := fuseconn.OpenState(dir, fuseconn.StateOptions{Takeover: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := r.Node(n.ID); !ok || got.Path != "held" {
		t.Errorf("node after compaction: %+v (%v)", got, ok)
	}
	if nodes, handles := r.Counts(); nodes != 2 || handles != 0 {
		t.Errorf("counts after compaction: %d nodes, %d handles, want 2 and 0", nodes, handles)
	}
}

func TestStateTakeoverNeedsAJournal(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if _, err := fuseconn.OpenState(empty, fuseconn.StateOptions{}); err != nil {
		t.Fatal(err) // a first start that never answered INIT
	}
	bad := filepath.Join(dir, "bad")
	if err := os.MkdirAll(bad, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "fuseconn.journal"), []byte("volume-healer fuseconn journal v1\nN x 1 1 \"a\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		dir  string
		want string
	}{
		"missing directory": {filepath.Join(dir, "missing"), "no such file"},
		"no INIT recorded":  {empty, "no INIT parameters"},
		"corrupt record":    {bad, "line 2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := fuseconn.OpenState(tc.dir, fuseconn.StateOptions{Takeover: true})
			if !errors.Is(err, fuseconn.ErrState) || !strings.Contains(err.Error(), tc.dir) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("OpenState(%s) = %v, want ErrState naming the directory and %q", tc.dir, err, tc.want)
			}
		})
	}
}
