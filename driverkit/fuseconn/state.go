package fuseconn

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// journalName is the journal's file in a state directory; a compaction writes a new one beside
// it and renames it over the journal.
const journalName = "fuseconn.journal"

// journalHeader is the first line of a journal; a file that begins otherwise is not one.
const journalHeader = "volume-healer fuseconn journal v1"

// InitParams are what a server and the kernel agreed on in the INIT exchange; a takeover serves
// by them, since the kernel does not send INIT again.
type InitParams struct {
	// Minor is the protocol minor version in effect: the lower of the kernel's and the server's.
	Minor uint32
	// KernelMinor is the kernel's protocol minor version.
	KernelMinor uint32
	// KernelFlags are the capabilities the kernel offered (fuse.CAP_*).
	KernelFlags uint64
	// Flags are the capabilities the server took.
	Flags uint64
	// MaxWrite is the largest write request the kernel sends.
	MaxWrite uint32
	// MaxReadahead is the read-ahead size agreed on.
	MaxReadahead uint32
	// TimeGran is the time granularity in nanoseconds the server reported.
	TimeGran uint32
}

// CanResend says whether the kernel understands FUSE_NOTIFY_RESEND (Linux 6.9, protocol 7.40).
func (p InitParams) CanResend() bool {
	const hasResend = uint64(1) << 39
	return p.KernelMinor >= resendMinor && p.KernelFlags&hasResend != 0
}

// A Node is a node id the kernel holds: what it names in the file system and how often the
// kernel looked it up (the count its FORGETs take back).
type Node struct {
	// ID is the node id the kernel knows the node by.
	ID uint64
	// Path is the node's path relative to the file system's root; "" is the root.
	Path string
	// Ino is the identity of what the node stands for (a backing file's inode number), checked
	// when the node is reached again.
	Ino uint64
	// Lookups is how many lookups the kernel has not yet forgotten.
	Lookups uint64
}

// A Handle is an open file or folder handle the kernel holds.
type Handle struct {
	// ID is the handle (fh) the kernel passes back.
	ID uint64
	// Node is the node the handle was opened on.
	Node uint64
	// Flags are the open(2) flags it was opened with.
	Flags uint32
	// Dir says it is a folder handle (OPENDIR).
	Dir bool
}

// StateOptions configure OpenState. Zero values take the defaults documented on each field.
type StateOptions struct {
	// Takeover reads the state a previous server left; without it the state starts empty (a new
	// connection). Default: false.
	Takeover bool
	// MaxNodes bounds the node ids held at once; a lookup past it fails. Default: 1<<20.
	MaxNodes int
	// MaxHandles bounds the open handles held at once; an open past it fails. Default: 1<<16.
	MaxHandles int
	// CompactAfter is how many journal records past the live state trigger a compaction.
	// Default: 4096.
	CompactAfter int
}

// A State holds a connection's INIT parameters, node ids and open handles, and journals every
// change to a file in its directory with one write(2) each: the journal outlives a killed process
// in the page cache, and is compacted when it grows past the live state by CompactAfter
// records. Its methods are safe for concurrent use.
type State struct {
	dir  string
	opts StateOptions

	mu         sync.Mutex
	journal    *os.File
	records    int
	init       *InitParams
	nodes      map[uint64]*Node
	byIno      map[uint64]uint64
	handles    map[uint64]*Handle
	nextNode   uint64
	nextHandle uint64
	err        error
}

// ErrLimit is returned by a State when a node or handle would pass its bound.
var ErrLimit = errors.New("fuseconn state limit reached")

// OpenState opens the state in dir (created if missing on a first start). A takeover reads the
// journal back and fails with ErrState, naming dir, when it is missing or corrupt.
func OpenState(dir string, o StateOptions) (*State, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: a state directory is required", ErrInvalidOptions)
	}
	if o.MaxNodes == 0 {
		o.MaxNodes = 1 << 20
	}
	if o.MaxHandles == 0 {
		o.MaxHandles = 1 << 16
	}
	if o.CompactAfter == 0 {
		o.CompactAfter = 4096
	}
	if o.MaxNodes < 0 || o.MaxHandles < 0 || o.CompactAfter < 0 {
		return nil, fmt.Errorf("%w: state %s: negative bound in %+v", ErrInvalidOptions, dir, o)
	}
	s := &State{
		dir: dir, opts: o,
		nodes:    map[uint64]*Node{RootID: {ID: RootID, Lookups: 1}},
		byIno:    map[uint64]uint64{},
		handles:  map[uint64]*Handle{},
		nextNode: RootID + 1, nextHandle: 1,
	}
	if o.Takeover {
		if err := s.replay(); err != nil {
			return nil, err
		}
		if s.init == nil {
			return nil, fmt.Errorf("%w: state directory %s holds no INIT parameters: the connection's first server never finished INIT, or the directory is another's", ErrState, dir)
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", dir, err)
	}
	// A compaction writes the whole live state, so that the journal starts small and is ours.
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.compactLocked(); err != nil {
		return nil, err
	}
	return s, nil
}

// Dir is the state's directory.
func (s *State) Dir() string { return s.dir }

// replay reads the journal into s.
func (s *State) replay() error {
	path := filepath.Join(s.dir, journalName)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: state directory %s: %w", ErrState, s.dir, err)
	}
	defer func() { _ = f.Close() }()
	r := bufio.NewReaderSize(f, 64*1024)
	lineNo := 0
	for {
		line, err := r.ReadString('\n')
		if errors.Is(err, io.EOF) {
			// A record without its newline is one a killed process did not finish writing.
			break
		}
		if err != nil {
			return fmt.Errorf("%w: state directory %s: read %s: %w", ErrState, s.dir, path, err)
		}
		lineNo++
		line = strings.TrimSuffix(line, "\n")
		if lineNo == 1 {
			if line != journalHeader {
				return fmt.Errorf("%w: state directory %s: %s line 1 is %q, not a journal header", ErrState, s.dir, path, truncate(line))
			}
			continue
		}
		if err := s.apply(line); err != nil {
			return fmt.Errorf("%w: state directory %s: %s line %d: %w", ErrState, s.dir, path, lineNo, err)
		}
	}
	if lineNo == 0 {
		return fmt.Errorf("%w: state directory %s: %s is empty", ErrState, s.dir, path)
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// apply replays one journal record.
func (s *State) apply(line string) error {
	kind, rest, _ := strings.Cut(line, " ")
	nums := func(n int) ([]uint64, string, error) {
		out := make([]uint64, n)
		for i := range out {
			var f string
			f, rest, _ = strings.Cut(rest, " ")
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return nil, "", fmt.Errorf("record %q: field %d: %w", truncate(line), i+1, err)
			}
			out[i] = v
		}
		return out, rest, nil
	}
	switch kind {
	case "I":
		v, _, err := nums(7)
		if err != nil {
			return err
		}
		s.init = &InitParams{Minor: uint32(v[0]), KernelMinor: uint32(v[1]), KernelFlags: v[2], Flags: v[3],
			MaxWrite: uint32(v[4]), MaxReadahead: uint32(v[5]), TimeGran: uint32(v[6])}
	case "C":
		v, _, err := nums(2)
		if err != nil {
			return err
		}
		s.nextNode, s.nextHandle = max(s.nextNode, v[0]), max(s.nextHandle, v[1])
	case "N":
		v, rest, err := nums(3)
		if err != nil {
			return err
		}
		path, err := strconv.Unquote(rest)
		if err != nil {
			return fmt.Errorf("record %q: path: %w", truncate(line), err)
		}
		s.addLookup(v[0], v[1], path, v[2])
	case "F":
		v, _, err := nums(2)
		if err != nil {
			return err
		}
		s.forgetLocked(v[0], v[1])
	case "R":
		oldQ, newQ, ok := strings.Cut(rest, "\t")
		if !ok {
			return fmt.Errorf("record %q: want two paths", truncate(line))
		}
		from, err1 := strconv.Unquote(oldQ)
		to, err2 := strconv.Unquote(newQ)
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("record %q: %w", truncate(line), err)
		}
		s.renameLocked(from, to)
	case "H":
		v, _, err := nums(4)
		if err != nil {
			return err
		}
		s.handles[v[0]] = &Handle{ID: v[0], Node: v[1], Flags: uint32(v[2]), Dir: v[3] == 1}
		s.nextHandle = max(s.nextHandle, v[0]+1)
	case "X":
		v, _, err := nums(1)
		if err != nil {
			return err
		}
		delete(s.handles, v[0])
	default:
		return fmt.Errorf("unknown record %q", truncate(line))
	}
	return nil
}

// write appends one record to the journal, and compacts the journal when it has grown far past
// the live state. A failed write is kept and returned by every later change and by Close: the
// journal no longer says what the kernel holds.
func (s *State) write(record string) error {
	if s.err != nil {
		return s.err
	}
	if _, err := s.journal.WriteString(record + "\n"); err != nil {
		s.err = fmt.Errorf("state directory %s: journal: %w", s.dir, err)
		return s.err
	}
	s.records++
	if s.records > len(s.nodes)+len(s.handles)+s.opts.CompactAfter {
		return s.compactLocked()
	}
	return nil
}

// compactLocked rewrites the journal as the live state and swaps it in.
func (s *State) compactLocked() error {
	var b strings.Builder
	b.WriteString(journalHeader + "\n")
	if p := s.init; p != nil {
		fmt.Fprintf(&b, "I %d %d %d %d %d %d %d\n", p.Minor, p.KernelMinor, p.KernelFlags, p.Flags, p.MaxWrite, p.MaxReadahead, p.TimeGran)
	}
	fmt.Fprintf(&b, "C %d %d\n", s.nextNode, s.nextHandle)
	for _, n := range s.nodes {
		if n.ID != RootID {
			fmt.Fprintf(&b, "N %d %d %d %s\n", n.ID, n.Ino, n.Lookups, strconv.Quote(n.Path))
		}
	}
	for _, h := range s.handles {
		fmt.Fprintf(&b, "H %d %d %d %d\n", h.ID, h.Node, h.Flags, boolNum(h.Dir))
	}
	path := filepath.Join(s.dir, journalName)
	f, err := os.CreateTemp(s.dir, journalName+".*.new")
	if err == nil {
		_, err = f.WriteString(b.String())
		if err == nil {
			err = os.Rename(f.Name(), path)
		}
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}
	if err != nil {
		s.err = fmt.Errorf("state directory %s: compact the journal: %w", s.dir, err)
		return s.err
	}
	if s.journal != nil {
		_ = s.journal.Close()
	}
	s.journal, s.records = f, 0
	return nil
}

func boolNum(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Init returns the recorded INIT parameters, and false before SetInit on a first start.
func (s *State) Init() (InitParams, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.init == nil {
		return InitParams{}, false
	}
	return *s.init, true
}

// SetInit records the INIT parameters.
func (s *State) SetInit(p InitParams) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init = &p
	return s.write(fmt.Sprintf("I %d %d %d %d %d %d %d", p.Minor, p.KernelMinor, p.KernelFlags, p.Flags, p.MaxWrite, p.MaxReadahead, p.TimeGran))
}

// Lookup records one lookup the kernel will hold of what path names (identity ino): the node
// already standing for ino, whose path it updates, or a new node. It returns the node.
func (s *State) Lookup(path string, ino uint64) (Node, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.byIno[ino]
	if !ok {
		if len(s.nodes) >= s.opts.MaxNodes {
			return Node{}, fmt.Errorf("%w: %d nodes held (state directory %s)", ErrLimit, len(s.nodes), s.dir)
		}
		id = s.nextNode
	}
	// The record goes out before the kernel hears of the node: a server killed after the write
	// leaves a lookup count too high, never a node id the next server does not know.
	if err := s.write(fmt.Sprintf("N %d %d 1 %s", id, ino, strconv.Quote(path))); err != nil {
		return Node{}, err
	}
	return *s.addLookup(id, ino, path, 1), nil
}

func (s *State) addLookup(id, ino uint64, path string, n uint64) *Node {
	node, ok := s.nodes[id]
	if !ok {
		node = &Node{ID: id, Ino: ino}
		s.nodes[id] = node
		s.byIno[ino] = id
		s.nextNode = max(s.nextNode, id+1)
	}
	node.Path = path
	node.Lookups += n
	return node
}

// Node returns the node with id.
func (s *State) Node(id uint64) (Node, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[id]
	if !ok {
		return Node{}, false
	}
	return *n, true
}

// Forget takes n lookups of node id back (FORGET, BATCH_FORGET); the node goes at zero.
func (s *State) Forget(id, n uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.nodes[id]; !ok || id == RootID {
		return nil
	}
	s.forgetLocked(id, n)
	return s.write(fmt.Sprintf("F %d %d", id, n))
}

func (s *State) forgetLocked(id, n uint64) {
	node, ok := s.nodes[id]
	if !ok || id == RootID {
		return
	}
	if node.Lookups <= n {
		delete(s.nodes, id)
		if s.byIno[node.Ino] == id {
			delete(s.byIno, node.Ino)
		}
		return
	}
	node.Lookups -= n
}

// Rename records that what was at path from is now at path to, and so is everything below it.
func (s *State) Rename(from, to string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renameLocked(from, to)
	return s.write("R " + strconv.Quote(from) + "\t" + strconv.Quote(to))
}

func (s *State) renameLocked(from, to string) {
	for _, n := range s.nodes {
		if n.Path == from {
			n.Path = to
		} else if rest, ok := strings.CutPrefix(n.Path, from+"/"); ok && from != "" {
			n.Path = to + "/" + rest
		}
	}
}

// Open records a handle opened on node with flags, and returns it.
func (s *State) Open(node uint64, flags uint32, dir bool) (Handle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.handles) >= s.opts.MaxHandles {
		return Handle{}, fmt.Errorf("%w: %d handles open (state directory %s)", ErrLimit, len(s.handles), s.dir)
	}
	h := &Handle{ID: s.nextHandle, Node: node, Flags: flags, Dir: dir}
	if err := s.write(fmt.Sprintf("H %d %d %d %d", h.ID, h.Node, h.Flags, boolNum(h.Dir))); err != nil {
		return Handle{}, err
	}
	s.nextHandle++
	s.handles[h.ID] = h
	return *h, nil
}

// Handle returns the open handle id.
func (s *State) Handle(id uint64) (Handle, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.handles[id]
	if !ok {
		return Handle{}, false
	}
	return *h, true
}

// Release records that the kernel released handle id.
func (s *State) Release(id uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.handles[id]; !ok {
		return nil
	}
	delete(s.handles, id)
	return s.write(fmt.Sprintf("X %d", id))
}

// Counts returns how many nodes (the root included) and handles the state holds.
func (s *State) Counts() (nodes, handles int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.nodes), len(s.handles)
}

// Close compacts the journal, so that the next server replays the live state only, and closes
// it. It returns the first error the journal met.
func (s *State) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	if err == nil {
		err = s.compactLocked()
	}
	if s.journal != nil {
		err = errors.Join(err, s.journal.Close())
		s.journal = nil
	}
	if s.err == nil {
		s.err = fmt.Errorf("state directory %s: closed", s.dir)
	}
	return err
}
