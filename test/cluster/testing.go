package cluster

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/test/harness"
)

// StartForTest prepares the assets and starts a node for t, stopped when t ends; a leftover of the
// node fails t. It skips t where the machine cannot run a node, except in CI (CI=true), where a
// machine that cannot fails t instead of hiding the suite.
func StartForTest(t testing.TB) (*Cluster, Assets) {
	t.Helper()
	if testing.Short() {
		// make test-short promises the fast tests only; a real node takes minutes to start.
		t.Skip("a real node is not a fast test (-short)")
	}
	if why := Unavailable(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("cannot run a node here (%s), and CI (CI=true) must run the real-cluster suite", why)
		}
		t.Skip("cannot run a node here: " + why)
	}
	return StartFor(t, "")
}

// StartFor prepares the assets, starts a node in dir (a new temporary folder when ""), stopped
// by tb's cleanups, and imports every image of the assets into it; a leftover of the node fails tb, and its logs are kept when tb failed. It
// fails tb where the machine cannot run a node.
func StartFor(tb harness.TB, dir string) (*Cluster, Assets) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 40*time.Minute)
	defer cancel()
	// One node at a time, from the images' build on: two test packages preparing at once would
	// rewrite the archives the other imports.
	lock, err := takeLock(ctx)
	if err != nil {
		tb.Fatalf("cluster: %v", err)
	}
	assets, err := Prepare(ctx, tb.Logf)
	if err != nil {
		_ = lock.Close()
		tb.Fatalf("%v", err)
	}
	temporary := dir == ""
	if temporary {
		if dir, err = os.MkdirTemp("", "volume-healer-cluster-"); err != nil {
			tb.Fatalf("%v", err)
		}
	}
	o := assets.Options(dir)
	o.Logf = tb.Logf
	o.lock = lock
	c, err := Start(ctx, o)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		start := time.Now()
		if err := c.Stop(); err != nil {
			tb.Errorf("stopping the node: %v", err)
		}
		tb.Logf("cluster: node stopped and cleaned up in %s", time.Since(start).Round(10*time.Millisecond))
		if tb.Failed() || !temporary {
			tb.Logf("cluster: the components' logs are in %s", c.Logs())
			return
		}
		_ = os.RemoveAll(dir)
	})
	imgs := make([]Image, 0, len(assets.Images))
	for _, img := range assets.Images {
		imgs = append(imgs, img)
	}
	begin := time.Now()
	if err := c.ImportImages(ctx, imgs...); err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Logf("cluster: %d images imported in %s", len(imgs), time.Since(begin).Round(100*time.Millisecond))
	return c, assets
}
