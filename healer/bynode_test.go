package healer

import (
	"reflect"
	"testing"

	"github.com/volume-healer/volume-healer/scheduler/planner"
)

// TestByNodeGroupsByDriverAndNode checks that byNode gives each driver and node one group, in the
// planner's order, whether the volumes come in runs (one driver, sorted by node) or not.
func TestByNodeGroupsByDriverAndNode(t *testing.T) {
	v := func(driver, node, pv string) planner.Volume {
		return planner.Volume{Driver: driver, NodeName: node, PVName: pv}
	}
	tests := map[string]struct {
		vols []planner.Volume
		want [][]string
	}{
		"none": {},
		"runs": {
			vols: []planner.Volume{v("d", "n1", "a"), v("d", "n1", "b"), v("d", "n2", "c"), v("e", "n2", "d")},
			want: [][]string{{"a", "b"}, {"c"}, {"d"}},
		},
		"a driver and node come back": {
			vols: []planner.Volume{v("d", "n1", "a"), v("e", "n1", "b"), v("d", "n1", "c"), v("d", "n2", "d")},
			want: [][]string{{"a", "c"}, {"b"}, {"d"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got [][]string
			for _, g := range byNode(tc.vols) {
				var pvs []string
				for _, x := range g {
					pvs = append(pvs, x.PVName)
				}
				got = append(got, pvs)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("byNode: %v, want %v", got, tc.want)
			}
		})
	}
}
