package fuseconn

import (
	"fmt"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// The FUSE opcodes (include/uapi/linux/fuse.h) a Handler sees in Request.Opcode.
const (
	OpLookup      = 1
	OpForget      = 2
	OpGetattr     = 3
	OpSetattr     = 4
	OpReadlink    = 5
	OpSymlink     = 6
	OpMknod       = 8
	OpMkdir       = 9
	OpUnlink      = 10
	OpRmdir       = 11
	OpRename      = 12
	OpLink        = 13
	OpOpen        = 14
	OpRead        = 15
	OpWrite       = 16
	OpStatfs      = 17
	OpRelease     = 18
	OpFsync       = 20
	OpFlush       = 25
	OpInit        = 26
	OpOpendir     = 27
	OpReaddir     = 28
	OpReleasedir  = 29
	OpFsyncdir    = 30
	OpAccess      = 34
	OpCreate      = 35
	OpInterrupt   = 36
	OpDestroy     = 38
	OpBatchForget = 42
	OpRename2     = 45
)

// UniqueResend is the bit the kernel sets in a request's unique id when it sends the request
// again after a FUSE_NOTIFY_RESEND: the request was read by an earlier server, which may have
// acted on it without answering.
const UniqueResend = uint64(1) << 63

// RootID is the node id of the file system's root.
const RootID = 1

// The protocol this package speaks: 7.31 at least (the kernel structures go-fuse's types
// describe); it asks for a resend on 7.40 and later.
const (
	protocolMajor     = 7
	minProtocolMinor  = 31
	resendMinor       = 40
	notifyResend      = 7
	ourProtocolMinor  = 40
	headerSize        = int(unsafe.Sizeof(fuse.InHeader{}))
	outHeaderSize     = int(unsafe.Sizeof(fuse.OutHeader{}))
	minReadBuffer     = 8192
	defaultMaxWrite   = 128 * 1024
	defaultMaxPages   = defaultMaxWrite / 4096
	requestAllowance  = 4096
	defaultMaxFlights = 16
)

// In returns the request's message as a T (one of go-fuse's request types, which begin with
// the fuse.InHeader), and what follows it (names, data). It fails when the message is shorter
// than a T: the kernel sent a request this package does not understand.
func In[T any](r *Request) (*T, []byte, error) {
	var zero T
	n := int(unsafe.Sizeof(zero))
	if len(r.msg) < n {
		return nil, nil, fmt.Errorf("%w: opcode %d: %d bytes, want at least %d", ErrProtocol, r.Header.Opcode, len(r.msg), n)
	}
	return (*T)(unsafe.Pointer(&r.msg[0])), r.msg[n:], nil
}

// Bytes returns the memory of v (one of go-fuse's reply types) as a reply part.
func Bytes[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// Names splits b into the NUL-terminated strings a request carries (the name of an entry, a
// symlink's target). It fails when fewer than n are there.
func Names(b []byte, n int) ([]string, error) {
	names := make([]string, 0, n)
	for len(names) < n {
		i := 0
		for i < len(b) && b[i] != 0 {
			i++
		}
		if i == len(b) {
			return nil, fmt.Errorf("%w: want %d NUL-terminated names, found %d", ErrProtocol, n, len(names))
		}
		names = append(names, string(b[:i]))
		b = b[i+1:]
	}
	return names, nil
}
