package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// TB is the part of testing.TB that the harness's test helpers use. *testing.T and *testing.B
// satisfy it, and so does Script, for programs.
type TB interface {
	Helper()
	Name() string
	Context() context.Context
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Failed() bool
	Cleanup(func())
}

// Script is a TB for a program, such as the demo, that uses the harness's test helpers: Fatalf
// ends the function RunScript runs, Errorf marks it failed and goes on, Logf writes to standard
// error (or where SetLog says), and the cleanups run when the function returns, last registered first. As with
// testing.T, Fatalf may only be called from the goroutine that RunScript runs the function in.
type Script struct {
	name string
	ctx  context.Context

	mu       sync.Mutex
	errs     []string
	cleanups []func()
	// log receives Logf's lines; nil for standard error.
	log io.Writer
}

// scriptFatal carries a Fatalf's message from Fatalf to RunScript.
type scriptFatal struct{ msg string }

// RunScript runs f with a Script named name whose Context is ctx. It returns f's error, the
// message of a Fatalf, or the messages of Errorf calls, in that order of precedence.
func RunScript(ctx context.Context, name string, f func(*Script) error) (err error) {
	s := &Script{name: name, ctx: ctx}
	defer func() {
		if r := recover(); r != nil {
			fatal, ok := r.(scriptFatal)
			if !ok {
				s.cleanUp()
				panic(r)
			}
			err = errors.New(fatal.msg)
		}
		s.cleanUp()
		if err == nil && s.Failed() {
			s.mu.Lock()
			err = errors.New(strings.Join(s.errs, "; "))
			s.mu.Unlock()
		}
	}()
	return f(s)
}

// cleanUp runs the cleanups, last registered first; a Fatalf in one ends only that one.
func (s *Script) cleanUp() {
	for {
		s.mu.Lock()
		if len(s.cleanups) == 0 {
			s.mu.Unlock()
			return
		}
		f := s.cleanups[len(s.cleanups)-1]
		s.cleanups = s.cleanups[:len(s.cleanups)-1]
		s.mu.Unlock()
		func() {
			defer func() {
				if r := recover(); r != nil {
					if _, ok := r.(scriptFatal); !ok {
						panic(r)
					}
				}
			}()
			f()
		}()
	}
}

// Helper does nothing: a program's messages carry no file and line.
func (s *Script) Helper() {}

// Name returns the name given to RunScript.
func (s *Script) Name() string { return s.name }

// Context returns the context given to RunScript.
func (s *Script) Context() context.Context { return s.ctx }

// SetLog sends Logf's lines to w instead of standard error, so that a program's own output
// stays readable; the messages of Errorf reach standard error too.
func (s *Script) SetLog(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = w
}

// Logf writes a line to standard error, or where SetLog says.
func (s *Script) Logf(format string, args ...any) {
	s.mu.Lock()
	w := s.log
	s.mu.Unlock()
	if w == nil {
		w = os.Stderr
	}
	fmt.Fprintf(w, "%s: %s\n", s.name, fmt.Sprintf(format, args...))
}

// Errorf logs the message and marks the script failed.
func (s *Script) Errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.Logf("%s", msg)
	s.mu.Lock()
	s.errs = append(s.errs, msg)
	logged := s.log != nil
	s.mu.Unlock()
	if logged {
		fmt.Fprintf(os.Stderr, "%s: %s\n", s.name, msg)
	}
}

// Fatalf marks the script failed and ends the function RunScript runs.
func (s *Script) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.errs = append(s.errs, msg)
	s.mu.Unlock()
	panic(scriptFatal{msg: msg})
}

// Failed tells whether Errorf or Fatalf was called.
func (s *Script) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.errs) > 0
}

// Cleanup registers f to run when the function RunScript runs has returned.
func (s *Script) Cleanup(f func()) {
	s.mu.Lock()
	s.cleanups = append(s.cleanups, f)
	s.mu.Unlock()
}
