package cluster

import (
	"context"
	"os"
	"testing"
	"time"
)

// StartForTest prepares the assets and starts a node for t, stopped when t ends; a leftover of the
// node fails t. It skips t where the machine cannot run a node, except in CI (CI=true), where a
// machine that cannot fails t instead of hiding the suite.
func StartForTest(t testing.TB) (*Cluster, Assets) {
	t.Helper()
	if why := Unavailable(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("cannot run a node here (%s), and CI (CI=true) must run the real-cluster suite", why)
		}
		t.Skip("cannot run a node here: " + why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	assets, err := Prepare(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "volume-healer-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	o := assets.Options(dir)
	o.Logf = t.Logf
	c, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		start := time.Now()
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the node: %v", err)
		}
		t.Logf("cluster: node stopped and cleaned up in %s", time.Since(start).Round(10*time.Millisecond))
		if t.Failed() {
			t.Logf("cluster: keeping the components' logs in %s", c.Logs())
			return
		}
		_ = os.RemoveAll(dir)
	})
	return c, assets
}
