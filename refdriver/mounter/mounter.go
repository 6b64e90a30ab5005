// Package mounter is the reference driver's userspace mounter: a FUSE daemon that serves one
// folder (a volume's backing folder) at a mount point, the way ceph-fuse serves a CephFS volume
// at a CSI staging path. `refdriver mounter` runs it as a process of its own, so that it can die,
// freeze or be killed apart from the node plugin, and leave behind the dead (ENOTCONN) or hung
// mount that volume-healer repairs.
//
// The mount shows in /proc/self/mountinfo with type fuse.refdriver (FSType) and the source the
// caller names (Options.FsName).
//
// It mounts and serves one folder; it must not import the plugin, driverkit, the controller's or
// the sidecar's packages, nor test/.
package mounter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Name is the FUSE subtype of the mounts: they show as filesystem type FSType.
const Name = "refdriver"

// FSType is the filesystem type of the mounts in /proc/self/mountinfo.
const FSType = "fuse." + Name

// ReadyLine is what Run writes to Options.Ready once the folder is mounted.
const ReadyLine = "ready\n"

// Options configure Run. Zero values take the defaults documented on each field.
type Options struct {
	// Source is the folder to serve. Required; it must exist.
	Source string
	// Target is the mount point. Required; it must exist.
	Target string
	// FsName is the mount's source in the mount table. Default: Source.
	FsName string
	// Ready receives ReadyLine once the mount is up, and is closed then when it is an
	// io.Closer, so that a parent reading it sees the end at once. Default: none.
	Ready io.Writer
	// CacheTimeout is how long the kernel may cache entries and attributes. It is short on
	// purpose: the folder can change behind the mount's back (a fault removes it), and a heal
	// checks the mount with statfs, which no cache answers. Default: 1s.
	CacheTimeout time.Duration
	// Logger receives what the mounter does. Default: discard.
	Logger logr.Logger
}

func (o *Options) setDefaults() error {
	if o.Source == "" || o.Target == "" {
		return fmt.Errorf("%w: a source folder and a target mount point are required", ErrInvalidOptions)
	}
	if o.FsName == "" {
		o.FsName = o.Source
	}
	if o.CacheTimeout == 0 {
		o.CacheTimeout = time.Second
	}
	if o.CacheTimeout < 0 {
		return fmt.Errorf("%w: CacheTimeout must not be negative, got %s", ErrInvalidOptions, o.CacheTimeout)
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	return nil
}

// ErrInvalidOptions is returned by Run for missing or invalid options.
var ErrInvalidOptions = errors.New("invalid mounter options")

// Run mounts opts.Source at opts.Target, signals readiness, and serves until ctx is done; then
// it unmounts (lazily when the mount is busy) and returns nil. It returns an error when the
// mount cannot be made, and when the mount went away while it served (someone unmounted it).
func Run(ctx context.Context, opts Options) error {
	if err := opts.setDefaults(); err != nil {
		return err
	}
	for _, p := range []string{opts.Source, opts.Target} {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("mounter: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("mounter: %s is not a folder", p)
		}
	}
	root, err := fs.NewLoopbackRoot(opts.Source)
	if err != nil {
		return fmt.Errorf("mounter: serve %s: %w", opts.Source, err)
	}
	timeout := opts.CacheTimeout
	server, err := fs.Mount(opts.Target, root, &fs.Options{
		MountOptions: fuse.MountOptions{
			DirectMount: true,
			// Workloads run as other users than the mounter.
			AllowOther: true,
			FsName:     opts.FsName,
			Name:       Name,
		},
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
	})
	if err != nil {
		return fmt.Errorf("mounter: mount %s at %s: %w", opts.Source, opts.Target, err)
	}
	log := opts.Logger.WithValues("source", opts.Source, "target", opts.Target)
	log.Info("Mounted")
	if err := signalReady(opts.Ready); err != nil {
		unmount(server, opts.Target, log)
		return fmt.Errorf("mounter: signal readiness: %w", err)
	}

	served := make(chan struct{})
	go func() {
		server.Wait()
		close(served)
	}()
	select {
	case <-ctx.Done():
		unmount(server, opts.Target, log)
		return nil
	case <-served:
		return fmt.Errorf("mounter: the mount at %s went away", opts.Target)
	}
}

func signalReady(w io.Writer) error {
	if w == nil {
		return nil
	}
	_, err := io.WriteString(w, ReadyLine)
	if c, ok := w.(io.Closer); ok {
		err = errors.Join(err, c.Close())
	}
	return err
}

// unmount takes the mount down cleanly when it can. A busy mount (a workload holds a file open,
// a bind of it is still mounted elsewhere) is detached instead, so that the mounter can always
// exit when asked to.
func unmount(server *fuse.Server, target string, log logr.Logger) {
	err := server.Unmount()
	if err == nil {
		log.Info("Unmounted")
		return
	}
	if derr := unix.Unmount(target, unix.MNT_DETACH); derr != nil {
		log.Error(errors.Join(err, derr), "Unmount failed; the mount stays until the process exits")
		return
	}
	log.Info("Detached a busy mount", "reason", err.Error())
}
