package main

// The import rules of volume-healer: each package's doc comment says what it must not import, and
// this table is where those sentences are checked. A rule states its reason; change the doc
// comment and the rule together.
//
// Words the table uses, as the doc comments do:
//   - the controller's packages: its stages (scheduler/..., policy/..., probe/..., healer/...),
//     its admission webhook of pods (admission/...) and its program (cmd/volume-healer/...);
//   - the sidecar's packages: sidecar/... and cmd/healer-sidecar/...;
//   - the product: everything that ships, which is everything outside test/ and hack/.

var (
	stages     = []string{"scheduler/...", "policy/...", "probe/...", "healer/..."}
	controller = append(stages[:len(stages):len(stages)], "admission/...", "cmd/volume-healer/...")
	sidecars   = []string{"sidecar/...", "cmd/healer-sidecar/..."}
	tooling    = []string{"test/...", "hack/..."}
)

func join(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

var rules = []Rule{
	// The layout.
	{
		Name:     "cmd-holds-programs",
		Packages: []string{"..."},
		Except:   join([]string{"cmd/..."}, tooling),
		Forbid:   []string{"cmd/..."},
		Reason: "cmd/ holds the programs and their wiring; what a second binary or a test needs " +
			"lives beside the stage it serves",
	},
	{
		Name:     "tests-reach-cmd-through-the-composition-root",
		Packages: []string{"test/..."},
		Tests:    true,
		Forbid:   []string{"cmd/..."},
		Allow:    []string{"cmd/volume-healer/controller/..."},
		Reason: "of cmd/, a suite may link only the controller's composition root; the programs " +
			"themselves it builds and runs as processes",
	},
	{
		Name:     "shipped-code-links-no-tooling",
		Packages: []string{"..."},
		Except:   tooling,
		Forbid:   tooling,
		Reason: "test/ and hack/ are the project's own tooling: a shipped binary would carry test " +
			"code and build locks",
	},
	{
		Name:     "hack-builds-programs",
		Packages: []string{"hack/..."},
		Forbid:   []string{"..."},
		Allow:    []string{"hack/..."},
		Reason: "build tooling builds the product and the test programs with the go command; it " +
			"links none of them (hack/images, hack/release, hack/buildsource, hack/filelock)",
	},
	{
		Name:     "filelock-is-a-leaf",
		Packages: []string{"hack/filelock"},
		Forbid:   []string{"..."},
		Reason:   "the build lock is shared by hack/images and test/harness, which must not reach each other",
	},

	// The contract and what drivers import.
	{
		Name:     "protocol-is-the-contract",
		Packages: []string{"api/healer/v1alpha1"},
		Forbid:   []string{"..."},
		Reason:   "every party imports the wire protocol: the controller, the sidecar, drivers",
	},
	{
		Name:     "annotations-are-free",
		Packages: []string{"api/annotations"},
		Forbid:   []string{"...", "k8s.io/..."},
		Reason: "every binary, and a driver that reads the same keys, imports the annotation keys " +
			"for free: nothing of the project, nothing of Kubernetes",
	},
	{
		Name:     "driver-surface-is-lean",
		Packages: []string{"api/...", "driverkit/..."},
		Forbid:   []string{"...", "k8s.io/client-go/...", "github.com/open-policy-agent/...", "github.com/prometheus/..."},
		Allow:    []string{"api/...", "driverkit/..."},
		Reason: "api/ and driverkit/ are what a CSI driver links (docs/driver-authors.md): no other " +
			"package of the project, no Kubernetes client, policy engine or metrics client",
	},
	{
		Name:     "supervisor-holds-connections",
		Packages: []string{"driverkit/supervisor"},
		Forbid:   []string{"..."},
		Allow:    []string{"driverkit/fuseconn"},
		Reason: "the mount supervisor runs in a DaemonSet of its own and must stay up while node plugins " +
			"and mounters come and go: it mounts with fuseconn and links nothing else of the project, " +
			"not even the rest of driverkit (gRPC, CSI)",
	},

	// The controller's stages, in the order a volume passes through them.
	{
		Name:     "config-is-a-leaf",
		Packages: []string{"config"},
		Forbid:   []string{"..."},
		Allow:    []string{"api/annotations", "api/healer/v1alpha1"},
		Reason: "every binary reads its configuration: of the project it takes only the policy " +
			"label and the sidecar token's audience, both leaves",
	},
	{
		Name:     "scheduler-holds-the-sweep",
		Packages: []string{"scheduler"},
		Forbid:   []string{"..."},
		Reason:   "the Sweep every stage passes along imports nothing of the project",
	},
	{
		Name:     "trigger-hands-sweeps-on",
		Packages: []string{"scheduler/trigger"},
		Forbid:   join([]string{"scheduler/planner", "scheduler/dispatch"}, stages[1:]),
		Reason:   "a trigger fires sweeps and never plans, decides or calls",
	},
	{
		Name:     "planner-selects",
		Packages: []string{"scheduler/planner"},
		Forbid:   []string{"scheduler/trigger", "scheduler/dispatch", "probe/...", "healer/..."},
		Reason:   "the planner selects volumes from caches; of the stages it knows the policy's input types only",
	},
	{
		Name:     "dispatch-runs-opaque-tasks",
		Packages: []string{"scheduler/dispatch"},
		Forbid:   []string{"scheduler/planner", "policy/...", "probe/...", "healer/..."},
		Reason:   "the dispatcher budgets tasks it does not look into",
	},
	{
		Name:     "policy-decides",
		Packages: []string{"policy/..."},
		Forbid:   []string{"scheduler/...", "probe/...", "healer/...", "admission/..."},
		Reason: "the policy (and its admission webhook) decides and never acts: the planner builds " +
			"its input, the healer acts on its decision",
	},
	{
		Name:     "admission-patches-pods",
		Packages: []string{"admission/..."},
		Forbid:   []string{"scheduler/...", "probe/...", "healer/..."},
		Reason: "the propagation webhook asks the policy about a pod being created and patches it; " +
			"it never plans, calls a sidecar or acts on a volume, and reads the caches through its own small interface",
	},
	{
		Name:     "probe-is-a-client",
		Packages: []string{"probe/..."},
		Forbid:   []string{"scheduler/...", "policy/...", "healer/..."},
		Reason:   "the sidecars' client knows the wire protocol and nothing of sweeps or policies",
	},
	{
		Name:     "evict-asks-the-policy-only",
		Packages: []string{"healer/evict"},
		Direct:   true,
		Forbid:   []string{"..."},
		Allow:    []string{"policy"},
		Reason:   "the evictor asks the policy about each pod; the healer imports it, not the other way",
	},
	{
		Name:     "leader-is-wiring",
		Packages: []string{"cmd/volume-healer/controller/leader"},
		Forbid:   stages,
		Reason:   "the stages reach the Lease through small interfaces of their own",
	},
	{
		Name:     "signer-judges-requests-alone",
		Packages: []string{"cmd/volume-healer/controller/sidecarsigner"},
		Forbid:   join(stages, sidecars, []string{"config", "admission/..."}),
		Reason: "the signer of the sidecars' certificates approves by who asks and for which names: " +
			"it neither plans, decides, calls a sidecar nor reads the configuration, which the composition root turns into its options",
	},
	{
		Name:     "healerctl-is-not-the-controller",
		Packages: []string{"cmd/healerctl/..."},
		Forbid:   []string{"cmd/volume-healer/..."},
		Reason:   "healerctl reads what the controller writes; it does not embed the controller",
	},

	// The node side.
	{
		Name:     "sidecar-links-no-controller",
		Packages: sidecars,
		Forbid:   join(controller, []string{"github.com/open-policy-agent/..."}),
		Reason: "the sidecar runs in every node plugin pod: it carries neither the controller's " +
			"stages nor the policy engine",
	},
	{
		Name:     "restart-only-stops",
		Packages: []string{"sidecar/restart"},
		Forbid:   []string{"...", "k8s.io/client-go/..."},
		Reason: "the container restart knows no PersistentVolume and reads nothing of the API server: " +
			"the sidecar proves which publish target it may act on, and the restart only stops what mounts it",
	},
	{
		Name:     "refdriver-is-a-driver",
		Packages: []string{"refdriver/...", "cmd/refdriver/..."},
		Forbid:   join(controller, sidecars),
		Reason: "the reference driver links what any driver may: the protocol and driverkit, " +
			"never the controller or the sidecar it is tested against",
	},
	{
		Name:     "mounter-serves-one-folder",
		Packages: []string{"refdriver/.../mounter"},
		Forbid:   []string{"refdriver/...", "driverkit/..."},
		Allow:    []string{"refdriver/.../mounter", "driverkit/fuseconn"},
		Reason: "the FUSE mounter process serves one folder and knows nothing of the plugin that starts it; " +
			"of driverkit it links the FUSE connection its keep mode serves (driverkit/fuseconn)",
	},
	{
		Name:     "fuseconn-is-a-leaf",
		Packages: []string{"driverkit/fuseconn"},
		Forbid:   []string{"..."},
		Reason: "the FUSE connection that outlives its server is linked by mounter processes, which know " +
			"nothing of driverkit's server or the plugin: it imports nothing of the project",
	},
	{
		Name:     "logging-is-a-leaf",
		Packages: []string{"logging/..."},
		Forbid:   []string{"..."},
		Allow:    []string{"logging/..."},
		Reason:   "every binary takes the same logging flags; the package knows nothing of any of them",
	},
	{
		Name:     "component-base-in-programs-only",
		Packages: []string{"..."},
		Except:   join([]string{"cmd/...", "refdriver/cli", "logging"}, tooling),
		Forbid:   []string{"k8s.io/component-base/..."},
		Reason: "component-base's logging sets up a process: only the programs and their command lines " +
			"(cmd/..., refdriver/cli) link it, through package logging; a library, and what a driver " +
			"links (api/, driverkit/), does not",
	},
	{
		Name:     "version-is-a-leaf",
		Packages: []string{"version"},
		Forbid:   []string{"..."},
		Reason:   "every binary prints its build",
	},
	{
		Name:     "versionmetrics-is-a-leaf",
		Packages: []string{"version/versionmetrics"},
		Forbid:   []string{"..."},
		Allow:    []string{"version"},
		Reason:   "every binary with metrics links the build gauge",
	},

	// The suites and the programs they run.
	{
		Name:     "test-bases-import-no-product",
		Packages: []string{"test/controlplane", "test/metricstest", "test/fixtures"},
		Forbid:   []string{"..."},
		Allow:    join(tooling, []string{"api/..."}),
		Reason: "the control plane, the metric recorder and the fixtures are what tests stand on, " +
			"not what they test; of the product only the contract's names (api/) may shape a fixture",
	},
	{
		Name:     "fake-runtime-is-a-leaf",
		Packages: []string{"test/fakecri"},
		Forbid:   []string{"..."},
		Reason:   "the fake container runtime stands in for containerd, which knows nothing of the healer",
	},
	{
		Name:     "containers-know-no-healer",
		Packages: []string{"test/workload", "test/container"},
		Forbid:   []string{"..."},
		Allow:    []string{"test/mountns"},
		Reason: "these programs stand in for a user's container and what a runtime gives it, which " +
			"know nothing of the healer; they share only the check that they run in a mount namespace",
	},
	{
		Name:     "sandbox-programs-are-leaves",
		Packages: []string{"test/mountns", "test/cluster/pause"},
		Forbid:   []string{"..."},
		Reason:   "a pod sandbox and a container's own check import nothing of volume-healer",
	},
	{
		Name:     "kubelet-computes-its-own-paths",
		Packages: []string{"test/kubelet"},
		Forbid:   join(sidecars, []string{"test/harness"}),
		Reason: "the kubelet stand-in computes kubelet's paths from kubelet's source so that tests " +
			"can compare the sidecar's computation with it; the harness uses it, not the other way",
	},
	{
		Name:     "cluster-installs-as-a-user",
		Packages: []string{"test/cluster"},
		Direct:   true,
		Forbid:   []string{"..."},
		Allow:    []string{"test/controlplane", "test/harness"},
		Reason:   "what runs on the real node is the project's images and charts, installed as a user installs them",
	},
	{
		Name:     "suites-run-the-controller-as-a-process",
		Packages: []string{"test/e2e", "test/integration", "test/deploy", "test/realcluster", "test/demo"},
		Tests:    true,
		Forbid:   []string{"cmd/..."},
		Reason:   "these suites check the controller as it ships: built from cmd/ and run as its own process",
	},
	{
		Name:     "docs-checks-read-what-an-operator-reads",
		Packages: []string{"test/docs"},
		Tests:    true,
		Forbid:   []string{"cmd/..."},
		Reason: "the documentation describes the programs; its checks read the source and the names the " +
			"stages register (metrics, annotation keys), not the programs' wiring",
	},
	{
		Name:     "real-node-reads-what-a-user-reads",
		Packages: []string{"test/realcluster"},
		Direct:   true,
		Forbid:   []string{"..."},
		Allow:    join(tooling, []string{"api/annotations", "healer", "healer/evict"}),
		Reason: "the product runs from its images, installed by Helm: of it the suite imports only " +
			"annotation keys and Event reasons",
	},
	{
		Name:     "demo-reads-what-an-operator-reads",
		Packages: []string{"test/demo"},
		Direct:   true,
		Forbid:   []string{"scheduler/...", "policy/...", "probe/..."},
		Reason:   "the controller runs as its own process, as in a cluster: the demo imports only the names an operator reads",
	},
}
