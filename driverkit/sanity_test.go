package driverkit_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
	"github.com/volume-healer/volume-healer/driverkit"
)

// fuseControl breaks a fake driver's FUSE volume for the protocol sanity checks the way real
// volumes break: gone is a dead mounter whose mount was removed, read-only a read-only remount,
// hung a frozen mounter, lost what the driver's Inspect says.
type fuseControl struct {
	d       *fakeDriver
	vol     *fuseVolume
	staging string
	checker *driverkit.Checker
}

var _ sanity.VolumeControl = (*fuseControl)(nil)

func (c *fuseControl) SetFault(ctx context.Context, volumeID string, f sanity.Fault, _ time.Duration) error {
	// The checks put the volume in one fault after another; each starts from a healthy volume.
	if f != sanity.Healthy {
		if err := c.SetFault(ctx, volumeID, sanity.Healthy, 0); err != nil {
			return err
		}
	}
	switch f {
	case sanity.Healthy:
		_ = c.vol.signal(syscall.SIGCONT) // a dead daemon needs no waking
		c.d.update(volumeID, func(v *fakeVolume) { v.lost = false })
		res, err := c.checker.Repair(ctx, driverkit.Repair{
			VolumeID: volumeID, StagingPath: c.staging, Expect: driverkit.Expect{FSType: fuseFSType},
			Remount: func(context.Context) error { return c.vol.remount() },
		})
		if err == nil && len(res.Findings) > 0 {
			err = fmt.Errorf("still broken: %+v", res.Findings)
		}
		return err
	case sanity.Gone:
		c.vol.killDaemon()
		_, err := driverkit.UnmountAll(c.staging)
		return err
	case sanity.ReadOnly:
		return unix.Mount("", c.staging, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
	case sanity.Hung:
		// The probe's stat blocks until its timeout: that holds the call long enough.
		return c.vol.signal(syscall.SIGSTOP)
	case sanity.Lost:
		c.d.update(volumeID, func(v *fakeVolume) { v.lost = true })
		return nil
	}
	return fmt.Errorf("unknown fault %q", f)
}

func (c *fuseControl) SetStaged(_ context.Context, volumeID string, staged bool) error {
	c.d.update(volumeID, func(v *fakeVolume) { v.staged = staged })
	return nil
}

// TestProtocolSanity runs the protocol's conformance checks against the kit serving real FUSE
// and tmpfs volumes, with every check enabled by a control that breaks the FUSE volume.
func TestProtocolSanity(t *testing.T) {
	requireMounts(t, true)
	root := t.TempDir()
	d := newFakeDriver()
	staging := mkdir(t, root, "fuse", "globalmount")
	vol := newFUSEVolume(t, staging)
	// A lost volume's mounter still runs: the driver can heal it, the heal just cannot bring
	// the data back (the protocol's heal-data-loss check).
	d.add(&fakeVolume{staged: true, remount: vol.remount, rec: driverkit.Volume{
		ID: "vol-fuse", StagingPath: staging, Expect: driverkit.Expect{Source: testSource, FSType: fuseFSType},
	}})
	for _, id := range []string{"vol-a", "vol-z"} {
		p := mkdir(t, root, id, "globalmount")
		mountTmpfs(t, p, 0)
		d.add(&fakeVolume{staged: true, rec: driverkit.Volume{ID: id, StagingPath: p}})
	}

	const statTimeout = time.Second
	_, endpoint := serve(t, d, driverkit.ServerOptions{
		DriverName: "kit.example.com", VendorVersion: "v0.1.0",
		Checker: driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: statTimeout}),
	})
	var out strings.Builder
	report, err := sanity.Run(context.Background(), sanity.Options{
		Endpoint: endpoint,
		VolumeID: "vol-fuse",
		Control:  &fuseControl{d: d, vol: vol, staging: staging, checker: driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: statTimeout})},
		// The first probe of the hung volume must still be blocked in its stat a quarter of
		// this later.
		HangFor: 2 * statTimeout,
		Out:     &out,
	})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !report.Passed() || report.Count(sanity.Skip) > 0 {
		t.Fatalf("sanity: %d failed, %d skipped; want every check to pass", report.Count(sanity.Fail), report.Count(sanity.Skip))
	}
}
