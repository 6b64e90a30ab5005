package restart_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/sidecar/restart"
	"github.com/volume-healer/volume-healer/test/fakecri"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

const (
	kubelet = "/var/lib/kubelet"
	podA    = "0b6f1d7e-8d3c-4f0e-9a51-5c2d7e1f0a11"
	podB    = "7c2e9f40-1a6b-4d8e-b3f5-0e4a9c6d2b22"
	pv      = "pvc-3f2a"
)

func publishTarget(pod, pv string) string {
	return filepath.Join(kubelet, "pods", pod, "volumes", "kubernetes.io~csi", pv, "mount")
}

func target(pod, pv string) restart.Target {
	return restart.Target{PodUID: pod, PublishTarget: publishTarget(pod, pv), SubpathDir: filepath.Join(kubelet, "pods", pod, "volume-subpaths")}
}

// socketPath is a short path for a UNIX socket (they are limited to about 100 bytes).
func socketPath(t *testing.T) string {
	dir, err := os.MkdirTemp("", "cri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "cri.sock")
}

func serve(t *testing.T, containers ...fakecri.Container) (*fakecri.Server, string) {
	t.Helper()
	path := socketPath(t)
	s, err := fakecri.Serve(path, containers...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s, path
}

func newRuntime(t *testing.T, path string, mutate ...func(*restart.Options)) *restart.Runtime {
	t.Helper()
	opts := restart.Options{Endpoint: "unix://" + path}
	for _, m := range mutate {
		m(&opts)
	}
	r, err := restart.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// started runs r's checks until the test ends.
func started(t *testing.T, r *restart.Runtime) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Start(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func callContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestRestartStopsOnlyTheContainersOfThePodThatMountThePublishTarget(t *testing.T) {
	other := publishTarget(podA, "pvc-other")
	for name, tc := range map[string]struct {
		containers []fakecri.Container
		want       []string
		stopped    []string
	}{
		"one container of two mounts it": {
			containers: []fakecri.Container{
				{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{"/etc/hosts", publishTarget(podA, pv)}},
				{ID: "a-side", PodUID: podA, Name: "sidecar", HostPaths: []string{other}},
			},
			want: []string{"app"}, stopped: []string{"a-app"},
		},
		"another pod mounting the same volume at its own publish target is left alone": {
			containers: []fakecri.Container{
				{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{publishTarget(podA, pv)}},
				{ID: "b-app", PodUID: podB, Name: "app", HostPaths: []string{publishTarget(podB, pv)}},
			},
			want: []string{"app"}, stopped: []string{"a-app"},
		},
		"a container of another pod that names this pod's publish target is left alone": {
			containers: []fakecri.Container{
				{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{publishTarget(podA, pv)}},
				{ID: "b-app", PodUID: podB, Name: "app", HostPaths: []string{publishTarget(podA, pv)}},
			},
			want: []string{"app"}, stopped: []string{"a-app"},
		},
		"every container that mounts it, sorted by name": {
			containers: []fakecri.Container{
				{ID: "a-web", PodUID: podA, Name: "web", HostPaths: []string{publishTarget(podA, pv)}},
				{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{publishTarget(podA, pv) + "/"}},
				{ID: "a-init-done", PodUID: podA, Name: "init", Exited: true, HostPaths: []string{publishTarget(podA, pv)}},
			},
			want: []string{"app", "web"}, stopped: []string{"a-app", "a-web"},
		},
		"a folder inside the publish target is not the publish target": {
			containers: []fakecri.Container{
				{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{publishTarget(podA, pv)}},
				{ID: "a-inner", PodUID: podA, Name: "inner", HostPaths: []string{publishTarget(podA, pv) + "/data"}},
			},
			want: []string{"app"}, stopped: []string{"a-app"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, path := serve(t, tc.containers...)
			r := newRuntime(t, path)
			got, err := r.Restart(callContext(t, 30*time.Second), target(podA, pv))
			if err != nil {
				t.Fatalf("Restart: %v", err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Restart = %q, want %q", got, tc.want)
			}
			var stopped []string
			for _, st := range s.Stops() {
				stopped = append(stopped, st.ID)
				if st.Timeout != int64(restart.DefaultStopGracePeriod/time.Second) {
					t.Errorf("container %s stopped with a grace period of %ds, want %s", st.ID, st.Timeout, restart.DefaultStopGracePeriod)
				}
			}
			slices.Sort(stopped)
			if !slices.Equal(stopped, tc.stopped) {
				t.Errorf("stopped %q, want %q", stopped, tc.stopped)
			}
			for _, c := range tc.containers {
				if !c.Exited && !slices.Contains(tc.stopped, c.ID) && !s.Running(c.ID) {
					t.Errorf("container %s of pod %s (%s) no longer runs", c.ID, c.PodUID, c.Name)
				}
			}
		})
	}
}

func TestRestartWithoutAMatchingContainerStopsNothing(t *testing.T) {
	for name, tc := range map[string]struct {
		containers []fakecri.Container
		wantInMsg  string
	}{
		"no container of the pod": {
			containers: []fakecri.Container{{ID: "b-app", PodUID: podB, Name: "app", HostPaths: []string{publishTarget(podB, pv)}}},
		},
		"the pod's containers mount other volumes": {
			containers: []fakecri.Container{{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{publishTarget(podA, "pvc-other")}}},
		},
		"the container that mounted it has exited": {
			containers: []fakecri.Container{{ID: "a-app", PodUID: podA, Name: "app", Exited: true, HostPaths: []string{publishTarget(podA, pv)}}},
		},
		"a container mounts a subPath of a volume of the pod": {
			containers: []fakecri.Container{{ID: "a-app", PodUID: podA, Name: "app",
				HostPaths: []string{filepath.Join(kubelet, "pods", podA, "volume-subpaths", "data", "app", "0")}}},
			wantInMsg: "containers app mount a subPath",
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, path := serve(t, tc.containers...)
			r := newRuntime(t, path)
			_, err := r.Restart(callContext(t, 30*time.Second), target(podA, pv))
			if !errors.Is(err, restart.ErrNoContainer) {
				t.Fatalf("Restart = %v, want ErrNoContainer", err)
			}
			if !strings.Contains(err.Error(), podA) || !strings.Contains(err.Error(), publishTarget(podA, pv)) || !strings.Contains(err.Error(), tc.wantInMsg) {
				t.Errorf("error %q does not name the pod, the publish target and %q", err, tc.wantInMsg)
			}
			if stops := s.Stops(); len(stops) > 0 {
				t.Errorf("stopped %v", stops)
			}
		})
	}
}

func TestRestartRefusesAMalformedTarget(t *testing.T) {
	_, path := serve(t)
	r := newRuntime(t, path)
	for name, tgt := range map[string]restart.Target{
		"empty pod UID":         {PublishTarget: publishTarget(podA, pv)},
		"pod UID with a slash":  {PodUID: "../" + podB, PublishTarget: publishTarget(podA, pv)},
		"relative target":       {PodUID: podA, PublishTarget: "pods/x/mount"},
		"target not clean":      {PodUID: podA, PublishTarget: publishTarget(podA, pv) + "/../../" + podB},
		"relative subPath root": {PodUID: podA, PublishTarget: publishTarget(podA, pv), SubpathDir: "volume-subpaths"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := r.Restart(context.Background(), tgt); !errors.Is(err, restart.ErrInvalidTarget) {
				t.Fatalf("Restart = %v, want ErrInvalidTarget", err)
			}
		})
	}
}

func TestRestartGracePeriodFitsTheDeadline(t *testing.T) {
	mount := fakecri.Container{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{publishTarget(podA, pv)}}
	t.Run("a deadline shorter than the grace period shortens it", func(t *testing.T) {
		s, path := serve(t, mount)
		r := newRuntime(t, path, func(o *restart.Options) { o.StopGracePeriod = 30 * time.Second })
		if _, err := r.Restart(callContext(t, 5*time.Second), target(podA, pv)); err != nil {
			t.Fatal(err)
		}
		stops := s.Stops()
		// 5s less the second kept for the kill and the answer, less the time to list, in whole
		// seconds: 3s, or less on a machine slow to list; never the 30s asked for.
		if len(stops) != 1 || stops[0].Timeout > 3 || stops[0].Timeout < 1 {
			t.Fatalf("stops = %+v, want one with a grace period of 1s to 3s", stops)
		}
	})
	t.Run("a deadline too short for a graceful stop stops nothing", func(t *testing.T) {
		s, path := serve(t, mount)
		r := newRuntime(t, path)
		_, err := r.Restart(callContext(t, 1500*time.Millisecond), target(podA, pv))
		if !errors.Is(err, restart.ErrTimeout) {
			t.Fatalf("Restart = %v, want ErrTimeout", err)
		}
		if stops := s.Stops(); len(stops) > 0 || !s.Running("a-app") {
			t.Fatalf("stopped %v", stops)
		}
	})
}

func TestRestartOfTheSameTargetInFlightIsBusy(t *testing.T) {
	s, path := serve(t,
		fakecri.Container{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{publishTarget(podA, pv)}},
		fakecri.Container{ID: "b-app", PodUID: podB, Name: "app", HostPaths: []string{publishTarget(podB, pv)}},
	)
	r := newRuntime(t, path)
	release := s.HoldStops()
	defer release()
	first := make(chan error, 1)
	go func() {
		_, err := r.Restart(callContext(t, 30*time.Second), target(podA, pv))
		first <- err
	}()
	select {
	case <-s.Stopping():
	case <-time.After(20 * time.Second):
		t.Fatal("the first restart did not reach StopContainer")
	}
	if _, err := r.Restart(callContext(t, 30*time.Second), target(podA, pv)); !errors.Is(err, restart.ErrBusy) {
		t.Fatalf("second Restart of the same pod and volume = %v, want ErrBusy", err)
	}
	// Another pod's restart is not held up by this one.
	second := make(chan error, 1)
	go func() {
		_, err := r.Restart(callContext(t, 30*time.Second), target(podB, pv))
		second <- err
	}()
	select {
	case <-s.Stopping():
	case <-time.After(20 * time.Second):
		t.Fatal("the restart of another pod did not reach StopContainer")
	}
	release()
	for _, ch := range []chan error{first, second} {
		if err := <-ch; err != nil {
			t.Fatalf("Restart: %v", err)
		}
	}
	// Done: the same target can be restarted again (its container is now exited).
	if _, err := r.Restart(callContext(t, 30*time.Second), target(podA, pv)); !errors.Is(err, restart.ErrNoContainer) {
		t.Fatalf("Restart after the first ended = %v, want ErrNoContainer", err)
	}
}

func TestRestartOfAHungRuntimeEndsAtTheDeadlineAndLeavesNoGoroutine(t *testing.T) {
	for _, method := range []string{"ListContainers", "ContainerStatus", "StopContainer"} {
		t.Run(method, func(t *testing.T) {
			s, path := serve(t, fakecri.Container{ID: "a-app", PodUID: podA, Name: "app", HostPaths: []string{publishTarget(podA, pv)}})
			r := newRuntime(t, path)
			// Connected first, so that the connection's own goroutines are counted before.
			if _, err := r.Restart(callContext(t, 30*time.Second), target(podB, pv)); !errors.Is(err, restart.ErrNoContainer) {
				t.Fatal(err)
			}
			before := runtime.NumGoroutine()
			s.Hang(method)
			const deadline = 3 * time.Second
			start := time.Now()
			_, err := r.Restart(callContext(t, deadline), target(podA, pv))
			took := time.Since(start)
			if !errors.Is(err, restart.ErrTimeout) {
				t.Fatalf("Restart = %v, want ErrTimeout", err)
			}
			if took > deadline+time.Second {
				t.Errorf("Restart took %s, beyond its deadline of %s", took, deadline)
			}
			if !strings.Contains(err.Error(), method) {
				t.Errorf("error %q does not name the call that hung (%s)", err, method)
			}
			poll.Eventually(t, 10*time.Second, "the goroutines of the hung call to end", func() (bool, string) {
				n := runtime.NumGoroutine()
				return n <= before, fmt.Sprintf("goroutines: %d, before: %d", n, before)
			})
		})
	}
}

func TestReachability(t *testing.T) {
	t.Run("a runtime that answers is reachable", func(t *testing.T) {
		_, path := serve(t)
		r := newRuntime(t, path)
		if ok, _ := r.Reachable(); ok {
			t.Fatal("reachable before it was asked")
		}
		started(t, r)
		poll.Eventually(t, 10*time.Second, "the runtime reachable", poll.True(func() bool { ok, _ := r.Reachable(); return ok }))
	})
	t.Run("a runtime that is not there is not, until it comes", func(t *testing.T) {
		path := socketPath(t)
		changes := make(chan bool, 10)
		r := newRuntime(t, path, func(o *restart.Options) {
			o.OnReachable = func(ok bool) { changes <- ok }
		})
		started(t, r)
		poll.Eventually(t, 10*time.Second, "the first check to fail", func() (bool, string) {
			ok, why := r.Reachable()
			return !ok && strings.Contains(why.Error(), "Version"), why.Error()
		})
		_, err := r.Restart(callContext(t, 10*time.Second), target(podA, pv))
		if !errors.Is(err, restart.ErrUnreachable) || !strings.Contains(err.Error(), path) {
			t.Fatalf("Restart = %v, want ErrUnreachable naming %s", err, path)
		}
		s, err := fakecri.Serve(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		// The checks go on, at most 30s apart; the first ones are a second or two apart.
		poll.Eventually(t, 20*time.Second, "the runtime reachable once it serves", poll.True(func() bool { ok, _ := r.Reachable(); return ok }))

		// It goes away: the next call finds it gone, and so does the capability.
		s.Stop()
		_, err = r.Restart(callContext(t, 10*time.Second), target(podA, pv))
		if !errors.Is(err, restart.ErrUnreachable) {
			t.Fatalf("Restart after the runtime stopped = %v, want ErrUnreachable", err)
		}
		if ok, _ := r.Reachable(); ok {
			t.Fatal("still reachable after a call found the runtime gone")
		}
		for i, want := range []bool{true, false} {
			if got := <-changes; got != want {
				t.Fatalf("change %d of reachability = %v, want %v", i+1, got, want)
			}
		}
	})
	t.Run("a runtime that goes away while no call comes is found gone within a minute", func(t *testing.T) {
		s, path := serve(t)
		fc := clocktesting.NewFakeClock(time.Now())
		r := newRuntime(t, path, func(o *restart.Options) { o.Clock = fc })
		started(t, r)
		poll.Eventually(t, 10*time.Second, "the runtime reachable", poll.True(func() bool { ok, _ := r.Reachable(); return ok }))
		s.Stop()
		poll.Eventually(t, 10*time.Second, "the next check to wait", poll.True(fc.HasWaiters))
		if ok, _ := r.Reachable(); !ok {
			t.Fatal("found gone before the minute passed")
		}
		fc.Step(time.Minute)
		poll.Eventually(t, 10*time.Second, "the runtime found gone", poll.True(func() bool { ok, _ := r.Reachable(); return !ok }))
	})
	t.Run("a runtime that hangs is not", func(t *testing.T) {
		s, path := serve(t)
		s.Hang("Version")
		r := newRuntime(t, path, func(o *restart.Options) { o.CheckTimeout = 500 * time.Millisecond })
		started(t, r)
		poll.Eventually(t, 10*time.Second, "the check to time out", func() (bool, string) {
			ok, why := r.Reachable()
			return !ok && strings.Contains(why.Error(), "DeadlineExceeded"), why.Error()
		})
	})
}

func TestNewRefusesBadOptions(t *testing.T) {
	for name, o := range map[string]restart.Options{
		"no endpoint":            {},
		"a relative path":        {Endpoint: "unix://run/containerd.sock"},
		"a TCP address":          {Endpoint: "tcp://127.0.0.1:1234"},
		"a grace period of 0.5s": {Endpoint: "unix:///run/c.sock", StopGracePeriod: 500 * time.Millisecond},
		"a negative timeout":     {Endpoint: "unix:///run/c.sock", CheckTimeout: -time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := restart.New(o); !errors.Is(err, restart.ErrInvalidOptions) {
				t.Fatalf("New = %v, want ErrInvalidOptions", err)
			}
		})
	}
}
