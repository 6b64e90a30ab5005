package mounter

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit/fuseconn"
)

// reopenMask are the open flags a handle's backing file is opened again without after a
// takeover: the file exists, and must not be emptied a second time.
const reopenMask = unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC

// Loopback is a fuseconn.Handler that serves a folder: every node is the file at its path below
// the folder, and reports the backing file's inode number, so that node ids (kept in the
// fuseconn.State) and inode numbers are the same for a server that took the connection over. An
// open handle whose backing file a takeover left behind is opened again by its path and flags.
// Operations it does not serve (extended attributes, locks, mknod, fallocate) fail with ENOSYS.
type Loopback struct {
	root    string
	state   *fuseconn.State
	timeout time.Duration
	chown   bool

	mu    sync.Mutex
	files map[uint64]*os.File
	dirs  map[uint64][]fuse.DirEntry
}

var _ fuseconn.Handler = (*Loopback)(nil)

// NewLoopback serves the folder root, keeping node ids and handles in state; the kernel may
// cache entries and attributes for timeout.
func NewLoopback(root string, state *fuseconn.State, timeout time.Duration) *Loopback {
	return &Loopback{
		root: root, state: state, timeout: timeout, chown: os.Geteuid() == 0,
		files: map[uint64]*os.File{}, dirs: map[uint64][]fuse.DirEntry{},
	}
}

// Close closes the backing files of the open handles; the handles stay in the state for a next
// server.
func (l *Loopback) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for fh, f := range l.files {
		_ = f.Close()
		delete(l.files, fh)
	}
}

func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	if errors.Is(err, fuseconn.ErrLimit) {
		return syscall.ENFILE
	}
	return syscall.EIO
}

// Handle answers one request.
func (l *Loopback) Handle(r *fuseconn.Request) {
	var errno syscall.Errno
	switch r.Header.Opcode {
	case fuseconn.OpLookup:
		errno = l.lookup(r)
	case fuseconn.OpForget:
		if in, _, err := fuseconn.In[fuse.ForgetIn](r); err == nil {
			_ = l.state.Forget(r.Header.NodeId, in.Nlookup)
		}
		return
	case fuseconn.OpBatchForget:
		l.batchForget(r)
		return
	case fuseconn.OpGetattr:
		errno = l.getattr(r)
	case fuseconn.OpSetattr:
		errno = l.setattr(r)
	case fuseconn.OpReadlink:
		errno = l.readlink(r)
	case fuseconn.OpSymlink:
		errno = l.symlink(r)
	case fuseconn.OpMkdir:
		errno = l.mkdir(r)
	case fuseconn.OpUnlink, fuseconn.OpRmdir:
		errno = l.remove(r)
	case fuseconn.OpRename, fuseconn.OpRename2:
		errno = l.rename(r)
	case fuseconn.OpLink:
		errno = l.link(r)
	case fuseconn.OpOpen:
		errno = l.open(r)
	case fuseconn.OpCreate:
		errno = l.create(r)
	case fuseconn.OpRead:
		errno = l.read(r)
	case fuseconn.OpWrite:
		errno = l.write(r)
	case fuseconn.OpFlush:
		r.Reply()
	case fuseconn.OpFsync:
		errno = l.fsync(r)
	case fuseconn.OpRelease, fuseconn.OpReleasedir:
		errno = l.release(r)
	case fuseconn.OpOpendir:
		errno = l.opendir(r)
	case fuseconn.OpReaddir:
		errno = l.readdir(r)
	case fuseconn.OpFsyncdir:
		errno = l.fsyncdir(r)
	case fuseconn.OpStatfs:
		errno = l.statfs(r)
	default:
		errno = syscall.ENOSYS
	}
	if errno != 0 {
		r.Fail(errno)
	}
}

// node returns the node a request is about and its backing path.
func (l *Loopback) node(id uint64) (fuseconn.Node, string, syscall.Errno) {
	n, ok := l.state.Node(id)
	if !ok {
		return n, "", syscall.ESTALE
	}
	return n, filepath.Join(l.root, n.Path), 0
}

// child returns the path relative to the root and the backing path of name in the folder dir.
func (l *Loopback) child(dir uint64, name string) (string, string, syscall.Errno) {
	n, _, errno := l.node(dir)
	if errno != 0 {
		return "", "", errno
	}
	if name == "" || name == "." || name == ".." || len(name) > 255 || filepath.Base(name) != name {
		return "", "", syscall.EINVAL
	}
	rel := name
	if n.Path != "" {
		rel = n.Path + "/" + name
	}
	return rel, filepath.Join(l.root, rel), 0
}

func (l *Loopback) attr(st *syscall.Stat_t) fuse.Attr {
	var a fuse.Attr
	a.FromStat(st)
	return a
}

// entry records a lookup of rel and returns the entry the kernel is answered with.
func (l *Loopback) entry(rel, abs string) (fuse.EntryOut, syscall.Errno) {
	var st syscall.Stat_t
	if err := syscall.Lstat(abs, &st); err != nil {
		return fuse.EntryOut{}, errnoOf(err)
	}
	n, err := l.state.Lookup(rel, st.Ino)
	if err != nil {
		return fuse.EntryOut{}, errnoOf(err)
	}
	out := fuse.EntryOut{NodeId: n.ID, Attr: l.attr(&st)}
	out.SetEntryTimeout(l.timeout)
	out.SetAttrTimeout(l.timeout)
	return out, 0
}

func (l *Loopback) lookup(r *fuseconn.Request) syscall.Errno {
	names, err := fuseconn.Names(r.Body(), 1)
	if err != nil {
		return syscall.EIO
	}
	rel, abs, errno := l.child(r.Header.NodeId, names[0])
	if errno != 0 {
		return errno
	}
	out, errno := l.entry(rel, abs)
	if errno != 0 {
		return errno
	}
	r.Reply(fuseconn.Bytes(&out))
	return 0
}

func (l *Loopback) batchForget(r *fuseconn.Request) {
	b := r.Body()
	if len(b) < 8 {
		return
	}
	count := binary.NativeEndian.Uint32(b)
	b = b[8:]
	for i := uint32(0); i < count && len(b) >= 16; i++ {
		_ = l.state.Forget(binary.NativeEndian.Uint64(b), binary.NativeEndian.Uint64(b[8:]))
		b = b[16:]
	}
}

func (l *Loopback) replyAttr(r *fuseconn.Request, st *syscall.Stat_t) {
	out := fuse.AttrOut{Attr: l.attr(st)}
	out.SetTimeout(l.timeout)
	r.Reply(fuseconn.Bytes(&out))
}

func (l *Loopback) getattr(r *fuseconn.Request) syscall.Errno {
	in, _, err := fuseconn.In[fuse.GetAttrIn](r)
	if err != nil {
		return syscall.EIO
	}
	var st syscall.Stat_t
	if in.Flags()&fuse.FUSE_GETATTR_FH != 0 {
		f, errno := l.file(in.Fh())
		if errno != 0 {
			return errno
		}
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			return errnoOf(err)
		}
	} else {
		_, abs, errno := l.node(r.Header.NodeId)
		if errno != 0 {
			return errno
		}
		if err := syscall.Lstat(abs, &st); err != nil {
			return errnoOf(err)
		}
	}
	l.replyAttr(r, &st)
	return 0
}

func (l *Loopback) setattr(r *fuseconn.Request) syscall.Errno {
	in, _, err := fuseconn.In[fuse.SetAttrIn](r)
	if err != nil {
		return syscall.EIO
	}
	_, abs, errno := l.node(r.Header.NodeId)
	if errno != 0 {
		return errno
	}
	v := in.Valid
	if v&fuse.FATTR_MODE != 0 {
		if err := unix.Fchmodat(unix.AT_FDCWD, abs, in.Mode&07777, 0); err != nil {
			return errnoOf(err)
		}
	}
	if v&(fuse.FATTR_UID|fuse.FATTR_GID) != 0 {
		uid, gid := -1, -1
		if v&fuse.FATTR_UID != 0 {
			uid = int(in.Uid)
		}
		if v&fuse.FATTR_GID != 0 {
			gid = int(in.Gid)
		}
		if err := unix.Lchown(abs, uid, gid); err != nil {
			return errnoOf(err)
		}
	}
	if v&fuse.FATTR_SIZE != 0 {
		if v&fuse.FATTR_FH != 0 {
			f, errno := l.file(in.Fh)
			if errno != 0 {
				return errno
			}
			err = unix.Ftruncate(int(f.Fd()), int64(in.Size))
		} else {
			err = unix.Truncate(abs, int64(in.Size))
		}
		if err != nil {
			return errnoOf(err)
		}
	}
	if v&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) != 0 {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if v&fuse.FATTR_ATIME_NOW != 0 {
			ts[0].Nsec = unix.UTIME_NOW
		} else if v&fuse.FATTR_ATIME != 0 {
			ts[0] = unix.Timespec{Sec: int64(in.Atime), Nsec: int64(in.Atimensec)}
		}
		if v&fuse.FATTR_MTIME_NOW != 0 {
			ts[1].Nsec = unix.UTIME_NOW
		} else if v&fuse.FATTR_MTIME != 0 {
			ts[1] = unix.Timespec{Sec: int64(in.Mtime), Nsec: int64(in.Mtimensec)}
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, abs, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return errnoOf(err)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(abs, &st); err != nil {
		return errnoOf(err)
	}
	l.replyAttr(r, &st)
	return 0
}

func (l *Loopback) readlink(r *fuseconn.Request) syscall.Errno {
	_, abs, errno := l.node(r.Header.NodeId)
	if errno != 0 {
		return errno
	}
	target, err := os.Readlink(abs)
	if err != nil {
		return errnoOf(err)
	}
	r.Reply([]byte(target))
	return 0
}

// owned gives what a request created to its caller, as a local file system would; a mounter
// that does not run as root leaves it to itself.
func (l *Loopback) owned(r *fuseconn.Request, abs string) {
	if l.chown {
		_ = unix.Lchown(abs, int(r.Header.Uid), int(r.Header.Gid))
	}
}

// created answers a request that made rel: with its entry. A resent request whose first
// attempt already made it (EEXIST) is answered the same way.
func (l *Loopback) created(r *fuseconn.Request, rel, abs string, err error) syscall.Errno {
	if err != nil && !(r.Resent() && errors.Is(err, unix.EEXIST)) {
		return errnoOf(err)
	}
	if err == nil {
		l.owned(r, abs)
	}
	out, errno := l.entry(rel, abs)
	if errno != 0 {
		return errno
	}
	r.Reply(fuseconn.Bytes(&out))
	return 0
}

func (l *Loopback) symlink(r *fuseconn.Request) syscall.Errno {
	names, err := fuseconn.Names(r.Body(), 2)
	if err != nil {
		return syscall.EIO
	}
	rel, abs, errno := l.child(r.Header.NodeId, names[0])
	if errno != 0 {
		return errno
	}
	return l.created(r, rel, abs, unix.Symlink(names[1], abs))
}

func (l *Loopback) mkdir(r *fuseconn.Request) syscall.Errno {
	in, rest, err := fuseconn.In[fuse.MkdirIn](r)
	if err != nil {
		return syscall.EIO
	}
	names, err := fuseconn.Names(rest, 1)
	if err != nil {
		return syscall.EIO
	}
	rel, abs, errno := l.child(r.Header.NodeId, names[0])
	if errno != 0 {
		return errno
	}
	return l.created(r, rel, abs, unix.Mkdir(abs, in.Mode&07777))
}

func (l *Loopback) remove(r *fuseconn.Request) syscall.Errno {
	names, err := fuseconn.Names(r.Body(), 1)
	if err != nil {
		return syscall.EIO
	}
	_, abs, errno := l.child(r.Header.NodeId, names[0])
	if errno != 0 {
		return errno
	}
	if r.Header.Opcode == fuseconn.OpRmdir {
		err = unix.Rmdir(abs)
	} else {
		err = unix.Unlink(abs)
	}
	// A resent request whose first attempt removed the entry has done its work.
	if err != nil && !(r.Resent() && errors.Is(err, unix.ENOENT)) {
		return errnoOf(err)
	}
	r.Reply()
	return 0
}

func (l *Loopback) rename(r *fuseconn.Request) syscall.Errno {
	body := r.Body()
	var newDir uint64
	var flags uint32
	if r.Header.Opcode == fuseconn.OpRename2 {
		in, rest, err := fuseconn.In[fuse.RenameIn](r)
		if err != nil {
			return syscall.EIO
		}
		newDir, flags, body = in.Newdir, in.Flags, rest
	} else {
		if len(body) < 8 {
			return syscall.EIO
		}
		newDir, body = binary.NativeEndian.Uint64(body), body[8:]
	}
	names, err := fuseconn.Names(body, 2)
	if err != nil {
		return syscall.EIO
	}
	fromRel, fromAbs, errno := l.child(r.Header.NodeId, names[0])
	if errno != 0 {
		return errno
	}
	toRel, toAbs, errno := l.child(newDir, names[1])
	if errno != 0 {
		return errno
	}
	err = unix.Renameat2(unix.AT_FDCWD, fromAbs, unix.AT_FDCWD, toAbs, uint(flags))
	if err != nil && r.Resent() && errors.Is(err, unix.ENOENT) {
		// The first attempt moved it.
		if _, serr := os.Lstat(toAbs); serr == nil {
			err = nil
		}
	}
	if err != nil {
		return errnoOf(err)
	}
	if flags&unix.RENAME_EXCHANGE != 0 {
		// Swap through a name no path has.
		tmp := "\x00exchange"
		err = errors.Join(l.state.Rename(fromRel, tmp), l.state.Rename(toRel, fromRel), l.state.Rename(tmp, toRel))
	} else {
		err = l.state.Rename(fromRel, toRel)
	}
	if err != nil {
		return errnoOf(err)
	}
	r.Reply()
	return 0
}

func (l *Loopback) link(r *fuseconn.Request) syscall.Errno {
	in, rest, err := fuseconn.In[fuse.LinkIn](r)
	if err != nil {
		return syscall.EIO
	}
	names, err := fuseconn.Names(rest, 1)
	if err != nil {
		return syscall.EIO
	}
	_, oldAbs, errno := l.node(in.Oldnodeid)
	if errno != 0 {
		return errno
	}
	rel, abs, errno := l.child(r.Header.NodeId, names[0])
	if errno != 0 {
		return errno
	}
	err = unix.Link(oldAbs, abs)
	if err != nil && !(r.Resent() && errors.Is(err, unix.EEXIST)) {
		return errnoOf(err)
	}
	out, errno := l.entry(rel, abs)
	if errno != 0 {
		return errno
	}
	r.Reply(fuseconn.Bytes(&out))
	return 0
}

// opened records a handle for f opened on node, and answers with it (after entry, for CREATE).
func (l *Loopback) opened(r *fuseconn.Request, node uint64, flags uint32, f *os.File, entry []byte) syscall.Errno {
	h, err := l.state.Open(node, flags, f == nil)
	if err != nil {
		if f != nil {
			_ = f.Close()
		}
		return errnoOf(err)
	}
	if f != nil {
		l.mu.Lock()
		l.files[h.ID] = f
		l.mu.Unlock()
	}
	out := fuse.OpenOut{Fh: h.ID}
	if entry != nil {
		r.Reply(entry, fuseconn.Bytes(&out))
	} else {
		r.Reply(fuseconn.Bytes(&out))
	}
	return 0
}

func (l *Loopback) open(r *fuseconn.Request) syscall.Errno {
	in, _, err := fuseconn.In[fuse.OpenIn](r)
	if err != nil {
		return syscall.EIO
	}
	n, abs, errno := l.node(r.Header.NodeId)
	if errno != 0 {
		return errno
	}
	f, err := os.OpenFile(abs, int(in.Flags)|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return errnoOf(err)
	}
	return l.opened(r, n.ID, in.Flags, f, nil)
}

func (l *Loopback) create(r *fuseconn.Request) syscall.Errno {
	in, rest, err := fuseconn.In[fuse.CreateIn](r)
	if err != nil {
		return syscall.EIO
	}
	names, err := fuseconn.Names(rest, 1)
	if err != nil {
		return syscall.EIO
	}
	rel, abs, errno := l.child(r.Header.NodeId, names[0])
	if errno != 0 {
		return errno
	}
	flags := int(in.Flags) | unix.O_CREAT | unix.O_CLOEXEC | unix.O_NOFOLLOW
	f, err := os.OpenFile(abs, flags, os.FileMode(in.Mode&0o777))
	if err != nil && r.Resent() && errors.Is(err, unix.EEXIST) {
		// The first attempt created it.
		f, err = os.OpenFile(abs, flags&^(unix.O_EXCL|unix.O_TRUNC), 0)
	} else if err == nil {
		l.owned(r, abs)
	}
	if err != nil {
		return errnoOf(err)
	}
	entry, errno := l.entry(rel, abs)
	if errno != 0 {
		_ = f.Close()
		return errno
	}
	return l.opened(r, entry.NodeId, in.Flags, f, fuseconn.Bytes(&entry))
}

// file returns the backing file of handle fh, opening it again by the handle's node path and
// flags when this server has not opened it (the handle was opened before a takeover).
func (l *Loopback) file(fh uint64) (*os.File, syscall.Errno) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.files[fh]; ok {
		return f, 0
	}
	h, ok := l.state.Handle(fh)
	if !ok || h.Dir {
		return nil, syscall.EBADF
	}
	n, abs, errno := l.node(h.Node)
	if errno != 0 {
		return nil, errno
	}
	f, err := os.OpenFile(abs, int(h.Flags)&^reopenMask|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, errnoOf(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil || st.Ino != n.Ino {
		// The path names another file now: the handle's file is gone.
		_ = f.Close()
		return nil, syscall.ESTALE
	}
	l.files[fh] = f
	return f, 0
}

func (l *Loopback) read(r *fuseconn.Request) syscall.Errno {
	in, _, err := fuseconn.In[fuse.ReadIn](r)
	if err != nil {
		return syscall.EIO
	}
	f, errno := l.file(in.Fh)
	if errno != 0 {
		return errno
	}
	buf := make([]byte, in.Size)
	n, err := unix.Pread(int(f.Fd()), buf, int64(in.Offset))
	if err != nil {
		return errnoOf(err)
	}
	r.Reply(buf[:n])
	return 0
}

func (l *Loopback) write(r *fuseconn.Request) syscall.Errno {
	in, data, err := fuseconn.In[fuse.WriteIn](r)
	if err != nil || uint32(len(data)) < in.Size {
		return syscall.EIO
	}
	f, errno := l.file(in.Fh)
	if errno != 0 {
		return errno
	}
	n, err := unix.Pwrite(int(f.Fd()), data[:in.Size], int64(in.Offset))
	if err != nil {
		return errnoOf(err)
	}
	out := fuse.WriteOut{Size: uint32(n)}
	r.Reply(fuseconn.Bytes(&out))
	return 0
}

func (l *Loopback) fsync(r *fuseconn.Request) syscall.Errno {
	in, _, err := fuseconn.In[fuse.FsyncIn](r)
	if err != nil {
		return syscall.EIO
	}
	f, errno := l.file(in.Fh)
	if errno != 0 {
		return errno
	}
	if in.FsyncFlags&1 != 0 {
		err = unix.Fdatasync(int(f.Fd()))
	} else {
		err = unix.Fsync(int(f.Fd()))
	}
	if err != nil {
		return errnoOf(err)
	}
	r.Reply()
	return 0
}

func (l *Loopback) release(r *fuseconn.Request) syscall.Errno {
	in, _, err := fuseconn.In[fuse.ReleaseIn](r)
	if err != nil {
		return syscall.EIO
	}
	l.mu.Lock()
	if f, ok := l.files[in.Fh]; ok {
		_ = f.Close()
		delete(l.files, in.Fh)
	}
	delete(l.dirs, in.Fh)
	l.mu.Unlock()
	if err := l.state.Release(in.Fh); err != nil {
		return errnoOf(err)
	}
	r.Reply()
	return 0
}

func (l *Loopback) opendir(r *fuseconn.Request) syscall.Errno {
	in, _, err := fuseconn.In[fuse.OpenIn](r)
	if err != nil {
		return syscall.EIO
	}
	n, abs, errno := l.node(r.Header.NodeId)
	if errno != 0 {
		return errno
	}
	var st syscall.Stat_t
	if err := syscall.Stat(abs, &st); err != nil {
		return errnoOf(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return syscall.ENOTDIR
	}
	return l.opened(r, n.ID, in.Flags, nil, nil)
}

// listing reads the folder of handle fh: ".", "..", then its entries by name. An offset past 0
// continues the listing the handle read (or a fresh one after a takeover).
func (l *Loopback) listing(fh uint64, offset uint64) ([]fuse.DirEntry, syscall.Errno) {
	l.mu.Lock()
	cached, ok := l.dirs[fh]
	l.mu.Unlock()
	if ok && offset > 0 {
		return cached, 0
	}
	h, ok := l.state.Handle(fh)
	if !ok || !h.Dir {
		return nil, syscall.EBADF
	}
	n, abs, errno := l.node(h.Node)
	if errno != 0 {
		return nil, errno
	}
	ents, err := os.ReadDir(abs)
	if err != nil {
		return nil, errnoOf(err)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	list := []fuse.DirEntry{{Name: ".", Mode: unix.S_IFDIR, Ino: n.Ino}, {Name: "..", Mode: unix.S_IFDIR}}
	for _, e := range ents {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(abs, e.Name()), &st); err != nil {
			continue // removed since the folder was read
		}
		list = append(list, fuse.DirEntry{Name: e.Name(), Mode: st.Mode, Ino: st.Ino})
	}
	for i := range list {
		list[i].Off = uint64(i + 1)
	}
	l.mu.Lock()
	l.dirs[fh] = list
	l.mu.Unlock()
	return list, 0
}

func (l *Loopback) readdir(r *fuseconn.Request) syscall.Errno {
	in, _, err := fuseconn.In[fuse.ReadIn](r)
	if err != nil {
		return syscall.EIO
	}
	list, errno := l.listing(in.Fh, in.Offset)
	if errno != 0 {
		return errno
	}
	out := fuse.NewDirEntryList(make([]byte, in.Size), in.Offset)
	for i := in.Offset; i < uint64(len(list)); i++ {
		if !out.AddDirEntry(list[i]) {
			break
		}
	}
	r.Reply(out.Bytes())
	return 0
}

func (l *Loopback) fsyncdir(r *fuseconn.Request) syscall.Errno {
	_, abs, errno := l.node(r.Header.NodeId)
	if errno != 0 {
		return errno
	}
	fd, err := unix.Open(abs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return errnoOf(err)
	}
	err = unix.Fsync(fd)
	_ = unix.Close(fd)
	if err != nil {
		return errnoOf(err)
	}
	r.Reply()
	return 0
}

func (l *Loopback) statfs(r *fuseconn.Request) syscall.Errno {
	var st unix.Statfs_t
	if err := unix.Statfs(l.root, &st); err != nil {
		return errnoOf(err)
	}
	out := fuse.StatfsOut{
		Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail, Files: st.Files, Ffree: st.Ffree,
		Bsize: uint32(st.Bsize), NameLen: uint32(st.Namelen), Frsize: uint32(st.Frsize),
	}
	r.Reply(fuseconn.Bytes(&out))
	return 0
}
