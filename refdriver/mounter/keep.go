package mounter

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/go-logr/logr"

	"github.com/volume-healer/volume-healer/driverkit/fuseconn"
)

// KeepOptions configure Keep. Zero values take the defaults documented on each field.
type KeepOptions struct {
	// Source is the folder to serve. Required; it must exist.
	Source string
	// Device is the FUSE device of a mount already made (fuseconn.Mount), which another process
	// holds too, so that the connection outlives this one. Required.
	Device *os.File
	// StateDir keeps the connection's node ids and open handles for a server that takes over.
	// Required.
	StateDir string
	// Takeover serves a connection another server answered INIT on, by the state in StateDir.
	// Default: false (a new connection: the state starts empty).
	Takeover bool
	// Ready receives ReadyLine once the connection is served, and is closed then when it is an
	// io.Closer. Default: none.
	Ready io.Writer
	// CacheTimeout is how long the kernel may cache entries and attributes. Default: 1s.
	CacheTimeout time.Duration
	// Logger receives what the mounter does. Default: discard.
	Logger logr.Logger
}

// Keep serves Source on the FUSE connection of Device until ctx ends, and then stops without
// unmounting: the requests in flight are answered, the state is written, and whoever holds the
// device keeps the mount, its open files and its inode numbers for the next server (Keep with
// Takeover). It returns an error when the state cannot be read back for a takeover (naming the
// state directory), and when the connection ended (the mount was taken down).
func Keep(ctx context.Context, o KeepOptions) error {
	if o.Source == "" || o.Device == nil || o.StateDir == "" {
		return fmt.Errorf("%w: a source folder, a FUSE device and a state directory are required", ErrInvalidOptions)
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
	fi, err := os.Stat(o.Source)
	if err != nil {
		return fmt.Errorf("mounter: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("mounter: %s is not a folder", o.Source)
	}
	state, err := fuseconn.OpenState(o.StateDir, fuseconn.StateOptions{Takeover: o.Takeover})
	if err != nil {
		return fmt.Errorf("mounter: %w", err)
	}
	log := o.Logger.WithValues("source", o.Source, "takeover", o.Takeover)
	lb := NewLoopback(o.Source, state, o.CacheTimeout)
	defer lb.Close()
	err = fuseconn.Serve(ctx, o.Device, fuseconn.Options{
		State:    state,
		Handler:  lb,
		Takeover: o.Takeover,
		Logger:   log,
		Ready: func(p fuseconn.InitParams) {
			log.Info("Serving", "protocolMinor", p.Minor, "canResend", p.CanResend())
			if err := signalReady(o.Ready); err != nil {
				log.Error(err, "Could not signal readiness")
			}
		},
	})
	if err != nil {
		return fmt.Errorf("mounter: serve %s: %w", o.Source, err)
	}
	log.Info("Stopped; the mount stays for the next server")
	return nil
}
