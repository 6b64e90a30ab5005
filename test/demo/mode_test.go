package main

import (
	"strings"
	"testing"

	"github.com/volume-healer/volume-healer/test/cluster"
)

// TestChooseMode checks which story make demo tells on which machine, and that a first run on a
// fresh machine that lacks only what `make node` installs says so: the one command that gets the
// real node, what it installs and how long it takes.
func TestChooseMode(t *testing.T) {
	tests := map[string]struct {
		mode    string
		machine machine
		want    string
		// say are what the output holds, in this order; none when it says nothing.
		say []string
		// noHint: the output must not offer make node, which could not help there.
		noHint bool
		err    string
	}{
		"a machine that runs a node": {
			mode: modeAuto, want: modeCluster,
		},
		"a fresh machine: root and /dev/fuse, without runc, iptables and the CNI plugins": {
			mode:    modeAuto,
			machine: machine{node: cluster.Machine{Installable: []string{"runc", "iptables", "CNI bridge plugin"}}},
			want:    modeReal,
			say: []string{
				"A real node cannot run on this machine: no runc, no iptables, no CNI bridge plugin.",
				"Running the story on kubelet stand-ins with real mounts instead.",
				"run `make node` as root: it installs runc, iptables and containernetworking-plugins with apt-get",
				"(" + nodeBuildTime + ", once); then `make demo` tells this story on a real node (" + clusterStoryTime + ").",
			},
		},
		"without cgroups make node cannot help": {
			mode:    modeAuto,
			machine: machine{node: cluster.Machine{Lacks: []string{"no cgroup memory controller"}, Installable: []string{"runc"}}},
			want:    modeReal,
			say:     []string{"A real node cannot run on this machine: no cgroup memory controller, no runc."},
			noHint:  true,
		},
		"not root: the simulated story": {
			mode:    modeAuto,
			machine: machine{noMounts: "real mounts need root", node: cluster.Machine{Lacks: []string{"not root"}, Installable: []string{"runc"}}},
			want:    modeSimulated,
			say:     []string{"Real mounts are not possible on this machine: real mounts need root.", "Running the simulated story instead"},
			noHint:  true,
		},
		"--mode cluster on a fresh machine names the command": {
			mode:    modeCluster,
			machine: machine{node: cluster.Machine{Installable: []string{"ip"}}},
			err:     "--mode cluster: no ip. To get the real node, run `make node` as root: it installs iproute2 with apt-get",
		},
		"--mode cluster without root": {
			mode:    modeCluster,
			machine: machine{noMounts: "real mounts need root", node: cluster.Machine{Lacks: []string{"not root"}}},
			err:     "--mode cluster: real mounts need root, not root; use --mode real or --mode simulated",
		},
		"--mode real without /dev/fuse": {
			mode:    modeReal,
			machine: machine{noMounts: "real mounts need /dev/fuse"},
			err:     "--mode real: real mounts need /dev/fuse; run the demo as root",
		},
		"--mode simulated anywhere": {
			mode:    modeSimulated,
			machine: machine{noMounts: "real mounts need root", node: cluster.Machine{Lacks: []string{"not root"}}},
			want:    modeSimulated,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out strings.Builder
			got, err := chooseMode(tc.mode, tc.machine, &out)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("chooseMode = %q, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("chooseMode = %q, %v; want %q", got, err, tc.want)
			}
			printed := out.String()
			if len(tc.say) == 0 && printed != "" && !tc.noHint {
				t.Errorf("it said %q, want nothing", printed)
			}
			rest := printed
			for _, s := range tc.say {
				i := strings.Index(rest, s)
				if i < 0 {
					t.Fatalf("the output does not say %q (in this order):\n%s", s, printed)
				}
				rest = rest[i+len(s):]
			}
			if tc.noHint && strings.Contains(printed, "make node") {
				t.Errorf("it offers make node, which cannot help there:\n%s", printed)
			}
		})
	}
}

func TestJoinAnd(t *testing.T) {
	tests := map[string]struct {
		words []string
		want  string
	}{
		"none":  {nil, ""},
		"one":   {[]string{"runc"}, "runc"},
		"two":   {[]string{"runc", "ip"}, "runc and ip"},
		"three": {[]string{"runc", "ip", "iptables"}, "runc, ip and iptables"},
	}
	for name, tc := range tests {
		if got := joinAnd(tc.words); got != tc.want {
			t.Errorf("%s: joinAnd(%q) = %q, want %q", name, tc.words, got, tc.want)
		}
	}
}
