package fuseconn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A Handler answers the requests of a session. Handle is called concurrently, for every request
// but INIT, INTERRUPT and DESTROY, which the session answers itself. It answers each request
// once, with Request.Reply or Request.Fail, before it returns, except FORGET and BATCH_FORGET,
// which take no answer. A request it leaves unanswered, or a panic, is answered with EIO; it
// must not keep the Request after it returns.
type Handler interface {
	Handle(r *Request)
}

// Options configure Serve. Zero values take the defaults documented on each field.
type Options struct {
	// State is the connection's state: Serve records the INIT parameters in it on a first start
	// and reads them back from it on a takeover. Required; Serve closes it when it returns.
	State *State
	// Handler answers the requests. Required.
	Handler Handler
	// Takeover serves a connection whose INIT another server answered: Serve reads no INIT,
	// serves by the parameters in State, and first asks the kernel to resend the requests the
	// other server read and did not answer, where the kernel can (InitParams.CanResend).
	// Default: false.
	Takeover bool
	// MaxInFlight bounds the requests handled at once; the session reads no more until one is
	// answered. Default: 16.
	MaxInFlight int
	// MaxWrite is the largest write request the session takes, on a first start. Default and
	// maximum: 128 KiB.
	MaxWrite uint32
	// Ready is called once the session serves: after INIT, or after the resend request of a
	// takeover. Default: none.
	Ready func(InitParams)
	// Logger receives what the session does. Default: discard.
	Logger logr.Logger
}

// A Request is one request the kernel sent. It is valid until the Handler returns.
type Request struct {
	// Header is the request's header: opcode, unique id, node id and caller.
	Header *fuse.InHeader

	msg      []byte
	sess     *Session
	answered bool
}

// Resent says whether the kernel sent the request again after a FUSE_NOTIFY_RESEND: an earlier
// server read it, and may have acted on it without answering.
func (r *Request) Resent() bool { return r.Header.Unique&UniqueResend != 0 }

// Reply answers the request with success and the concatenated parts as its reply.
func (r *Request) Reply(parts ...[]byte) {
	n := outHeaderSize
	for _, p := range parts {
		n += len(p)
	}
	buf := make([]byte, n)
	out := (*fuse.OutHeader)(unsafe.Pointer(&buf[0]))
	out.Length, out.Unique = uint32(n), r.Header.Unique
	off := outHeaderSize
	for _, p := range parts {
		off += copy(buf[off:], p)
	}
	r.send(buf)
}

// Fail answers the request with the error errno.
func (r *Request) Fail(errno syscall.Errno) {
	if errno == 0 {
		errno = syscall.EIO
	}
	buf := make([]byte, outHeaderSize)
	out := (*fuse.OutHeader)(unsafe.Pointer(&buf[0]))
	out.Length, out.Status, out.Unique = uint32(outHeaderSize), -int32(errno), r.Header.Unique
	r.send(buf)
}

func (r *Request) send(buf []byte) {
	if r.answered {
		r.sess.log.Error(nil, "A request was answered twice; the second answer is dropped", "opcode", r.Header.Opcode, "unique", r.Header.Unique)
		return
	}
	r.answered = true
	r.sess.write(buf, r.Header)
}

// A Session serves one mounted FUSE connection.
type Session struct {
	dev     *os.File
	opts    Options
	log     logr.Logger
	params  InitParams
	bufSize int
	bufs    sync.Pool
}

// Serve serves the FUSE connection whose device dev is (a file Mount returned, or its duplicate
// passed to this process) until ctx ends or the connection does. It works on a duplicate of dev,
// so the caller keeps dev. When ctx ends it stops reading requests, lets the ones in flight be
// answered, closes the State (compacting its journal) and returns nil, leaving the file system
// mounted and the connection alive for whoever holds the device: a next server takes over with
// Options.Takeover. It returns ErrUnmounted when the connection ended under it.
func Serve(ctx context.Context, dev *os.File, o Options) (err error) {
	if o.State == nil || o.Handler == nil {
		return fmt.Errorf("%w: a State and a Handler are required", ErrInvalidOptions)
	}
	defer func() { err = errors.Join(err, o.State.Close()) }()
	if o.MaxInFlight == 0 {
		o.MaxInFlight = defaultMaxFlights
	}
	if o.MaxWrite == 0 || o.MaxWrite > defaultMaxWrite {
		o.MaxWrite = defaultMaxWrite
	}
	if o.MaxInFlight < 0 {
		return fmt.Errorf("%w: MaxInFlight must not be negative, got %d", ErrInvalidOptions, o.MaxInFlight)
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	own, err := pollable(dev)
	if err != nil {
		return err
	}
	defer func() { _ = own.Close() }()
	s := &Session{dev: own, opts: o, log: o.Logger.WithValues("state", o.State.Dir())}

	if o.Takeover {
		p, ok := o.State.Init()
		if !ok {
			return fmt.Errorf("%w: state directory %s holds no INIT parameters", ErrState, o.State.Dir())
		}
		s.params = p
		s.bufSize = max(int(p.MaxWrite)+requestAllowance, minReadBuffer)
		if p.CanResend() {
			if err := s.notifyResend(); err != nil {
				return err
			}
			s.log.Info("Took the connection over and asked the kernel to resend what the last server did not answer", "minor", p.KernelMinor)
		} else {
			s.log.Info("Took the connection over; the kernel cannot resend what the last server did not answer (it needs protocol 7.40, Linux 6.9)", "minor", p.KernelMinor)
		}
	} else {
		s.bufSize = max(int(o.MaxWrite)+requestAllowance, minReadBuffer)
		if err := s.init(ctx); err != nil {
			return err
		}
	}
	s.bufs.New = func() any { b := make([]byte, s.bufSize); return &b }
	if o.Ready != nil {
		o.Ready(s.params)
	}
	return s.loop(ctx)
}

// pollable duplicates dev into a non-blocking file the runtime polls, so that a read deadline
// can stop a read that waits for a request. The flag is on the open file, which every holder of
// the device shares; none but the server reads it.
func pollable(dev *os.File) (*os.File, error) {
	raw, err := dev.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("FUSE device %s: %w", dev.Name(), err)
	}
	fd := -1
	cerr := raw.Control(func(d uintptr) { fd, err = unix.FcntlInt(d, unix.F_DUPFD_CLOEXEC, 0) })
	if err = errors.Join(cerr, err); err != nil {
		return nil, fmt.Errorf("duplicate FUSE device %s: %w", dev.Name(), err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("FUSE device %s: %w", dev.Name(), err)
	}
	return os.NewFile(uintptr(fd), dev.Name()), nil
}

// notifyResend asks the kernel to queue again every request this connection's servers read and
// did not answer; they come back with UniqueResend in their unique ids.
func (s *Session) notifyResend() error {
	buf := make([]byte, outHeaderSize)
	out := (*fuse.OutHeader)(unsafe.Pointer(&buf[0]))
	out.Length, out.Status = uint32(outHeaderSize), notifyResend
	if _, err := s.dev.Write(buf); err != nil {
		return fmt.Errorf("ask the kernel to resend unanswered FUSE requests: %w", err)
	}
	return nil
}

// init reads the kernel's INIT request, answers it and records the outcome.
func (s *Session) init(ctx context.Context) error {
	buf := make([]byte, s.bufSize)
	n, err := s.read(ctx, buf)
	if err != nil {
		return fmt.Errorf("read the FUSE INIT request: %w", err)
	}
	r := &Request{msg: buf[:n], sess: s}
	if n < headerSize {
		return fmt.Errorf("%w: a %d-byte message where INIT was due", ErrProtocol, n)
	}
	r.Header = (*fuse.InHeader)(unsafe.Pointer(&buf[0]))
	if r.Header.Opcode != OpInit {
		r.Fail(syscall.EIO)
		return fmt.Errorf("%w: opcode %d where INIT was due: the connection was served before (start with takeover)", ErrProtocol, r.Header.Opcode)
	}
	in, _, err := In[fuse.InitIn](r)
	if err != nil {
		r.Fail(syscall.EPROTO)
		return err
	}
	if in.Major != protocolMajor || in.Minor < minProtocolMinor {
		r.Fail(syscall.EPROTO)
		return fmt.Errorf("%w: the kernel speaks FUSE %d.%d, want %d.%d or later", ErrProtocol, in.Major, in.Minor, protocolMajor, minProtocolMinor)
	}
	kernel := in.Flags64()
	want := uint64(fuse.CAP_ASYNC_READ | fuse.CAP_BIG_WRITES | fuse.CAP_PARALLEL_DIROPS | fuse.CAP_MAX_PAGES)
	if kernel&fuse.CAP_INIT_EXT != 0 {
		want |= fuse.CAP_INIT_EXT
	}
	flags := kernel & want
	p := InitParams{
		Minor: min(in.Minor, ourProtocolMinor), KernelMinor: in.Minor, KernelFlags: kernel, Flags: flags,
		MaxWrite: s.opts.MaxWrite, MaxReadahead: min(in.MaxReadAhead, s.opts.MaxWrite), TimeGran: 1,
	}
	// The record is written before the answer: a server killed in between leaves a state the
	// next one can serve by.
	if err := s.opts.State.SetInit(p); err != nil {
		r.Fail(syscall.EIO)
		return err
	}
	out := fuse.InitOut{
		Major: protocolMajor, Minor: p.Minor, MaxReadAhead: p.MaxReadahead,
		Flags: uint32(flags), Flags2: uint32(flags >> 32),
		MaxBackground: uint16(s.opts.MaxInFlight), CongestionThreshold: uint16(s.opts.MaxInFlight * 3 / 4),
		MaxWrite: p.MaxWrite, TimeGran: p.TimeGran, MaxPages: uint16(max(p.MaxWrite/4096, 1)),
	}
	r.Reply(Bytes(&out))
	s.params = p
	s.log.Info("Answered INIT", "kernelMinor", in.Minor, "minor", p.Minor, "maxWrite", p.MaxWrite, "canResend", p.CanResend())
	return nil
}

// read reads one request; it returns ctx's error once ctx ends and ErrUnmounted when the
// connection is gone.
func (s *Session) read(ctx context.Context, buf []byte) (int, error) {
	stop := context.AfterFunc(ctx, func() { _ = s.dev.SetReadDeadline(time.Now()) })
	defer stop()
	for {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		n, err := s.dev.Read(buf)
		switch {
		case err == nil:
			return n, nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			_ = s.dev.SetReadDeadline(time.Time{})
		case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.EINTR), errors.Is(err, syscall.EAGAIN):
			// The request was interrupted before it was read; read the next.
		case errors.Is(err, syscall.ENODEV):
			return 0, ErrUnmounted
		default:
			return 0, fmt.Errorf("read a FUSE request: %w", err)
		}
	}
}

// loop reads requests and hands them to handlers, MaxInFlight at a time, until ctx ends.
func (s *Session) loop(ctx context.Context) error {
	slots := make(chan struct{}, s.opts.MaxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			s.log.Info("Stopping: no more requests are read; answering those in flight")
			return nil
		}
		bp := s.bufs.Get().(*[]byte)
		n, err := s.read(ctx, *bp)
		if err != nil {
			s.bufs.Put(bp)
			if ctx.Err() != nil {
				s.log.Info("Stopping: no more requests are read; answering those in flight")
				return nil
			}
			return err
		}
		msg := (*bp)[:n]
		if n < headerSize {
			s.log.Error(nil, "Dropped a message shorter than a FUSE header", "bytes", n)
			s.bufs.Put(bp)
			<-slots
			continue
		}
		r := &Request{Header: (*fuse.InHeader)(unsafe.Pointer(&msg[0])), msg: msg, sess: s}
		if r.Header.Opcode == OpDestroy {
			r.Reply()
			s.bufs.Put(bp)
			return ErrUnmounted
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			defer s.bufs.Put(bp)
			s.dispatch(r)
		}()
	}
}

// dispatch answers one request: the session's own, or the handler's, answering EIO where the
// handler did not answer or panicked.
func (s *Session) dispatch(r *Request) {
	op := r.Header.Opcode
	switch op {
	case OpInterrupt:
		// Requests run to their end; an interrupt takes no answer.
		return
	case OpInit:
		r.Fail(syscall.EPROTO)
		return
	}
	defer func() {
		if p := recover(); p != nil {
			s.log.Error(fmt.Errorf("panic: %v", p), "A handler panicked; the request fails with EIO", "opcode", op, "stack", string(debug.Stack()))
		}
		if !r.answered && op != OpForget && op != OpBatchForget {
			r.Fail(syscall.EIO)
		}
	}()
	if uint32(len(r.msg)) != r.Header.Length {
		r.Fail(syscall.EIO)
		return
	}
	s.opts.Handler.Handle(r)
}

// write sends an answer. ENOENT means the kernel no longer waits for it (the request was
// interrupted, or a server before this one answered it).
func (s *Session) write(buf []byte, h *fuse.InHeader) {
	if _, err := s.dev.Write(buf); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			s.log.V(1).Info("The kernel no longer waits for an answer", "opcode", h.Opcode, "unique", h.Unique)
			return
		}
		s.log.Error(err, "Could not answer a FUSE request", "opcode", h.Opcode, "unique", h.Unique)
	}
}

// Body returns what follows the header: the request's arguments.
func (r *Request) Body() []byte { return r.msg[headerSize:] }
