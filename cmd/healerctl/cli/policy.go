package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/policy"
)

func newPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Test, evaluate and explain volume-healer policies",
	}
	cmd.AddCommand(newPolicyTestCommand(), newPolicyEvalCommand(), newPolicyExplainCommand())
	return cmd
}

func newPolicyTestCommand() *cobra.Command {
	var opts policy.TestOptions
	cmd := &cobra.Command{
		Use:   "test [PATH...]",
		Short: "Run the Rego unit tests (test_* rules) of policy files or folders",
		Long: "Runs the Rego unit tests of the .rego files at PATH (files, or folders searched recursively)\n" +
			"the way `opa test` does, through the controller's own loader and compiler. Without PATH it\n" +
			"runs the tests of the built-in default policy. Exits non-zero when a test fails.",
		RunE: func(cmd *cobra.Command, args []string) error {
			modules := policy.DefaultTestModules()
			if len(args) > 0 {
				var err error
				if modules, err = policy.LoadFiles(args...); err != nil {
					return err
				}
			}
			results, err := policy.RunTests(cmd.Context(), modules, opts)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, r := range results {
				fmt.Fprintln(out, r)
			}
			if err := policy.CheckTests(results); err != nil {
				return err
			}
			fmt.Fprintf(out, "PASS: %d tests\n", len(results))
			return nil
		},
	}
	cmd.Flags().StringVar(&opts.Run, "run", "", "run only the tests whose name matches this regular expression")
	cmd.Flags().DurationVar(&opts.Timeout, "timeout", 5*time.Second, "time limit of each test")
	return cmd
}

func newPolicyEvalCommand() *cobra.Command {
	var paths []string
	var inputFile string
	var opts policy.CompileOptions
	cmd := &cobra.Command{
		Use:   "eval --input FILE [--policy PATH]...",
		Short: "Print the decision of a policy for one input document",
		Long: "Compiles and validates the policy at PATH (files or folders; the built-in default without\n" +
			"--policy) exactly as the controller would, evaluates it against the input document in FILE\n" +
			"(JSON; - for standard input) and prints the decision as JSON.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in, err := readInput(cmd.InOrStdin(), inputFile)
			if err != nil {
				return err
			}
			rev, err := compileFrom(cmd, paths, opts)
			if err != nil {
				return err
			}
			d, err := rev.Evaluate(cmd.Context(), in)
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(d)
		},
	}
	cmd.Flags().StringArrayVar(&paths, "policy", nil, "policy file or folder (repeatable); default: the built-in policy")
	cmd.Flags().StringVar(&inputFile, "input", "", "input document (JSON), - for standard input")
	cmd.Flags().DurationVar(&opts.EvalTimeout, "timeout", policy.DefaultEvalTimeout, "evaluation timeout")
	_ = cmd.MarkFlagRequired("input")
	return cmd
}

func readInput(stdin io.Reader, file string) (*policy.Input, error) {
	var r io.Reader = stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("reading input: %w", err)
		}
		defer f.Close()
		r = f
	}
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var in policy.Input
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("decoding input %s: %w", file, err)
	}
	return &in, nil
}

func compileFrom(cmd *cobra.Command, paths []string, opts policy.CompileOptions) (*policy.Revision, error) {
	modules := policy.DefaultModules()
	if len(paths) > 0 {
		var err error
		if modules, err = policy.LoadFiles(paths...); err != nil {
			return nil, err
		}
	}
	return policy.Compile(cmd.Context(), modules, opts)
}

func newPolicyExplainCommand() *cobra.Command {
	var (
		trigger, node, probe     string
		probeReason              string
		healable, kept, full     bool
		capabilities, identities []string
		attributes               map[string]string
		paths                    []string
		namespace, selector      string
		pod, pvc, output         string
		at                       time.Time
		opts                     policy.CompileOptions
	)
	kube := newKubeFlags()
	cmd := &cobra.Command{
		Use:   "explain (PV | pv/PV | pvc/CLAIM | --pvc CLAIM)",
		Short: "Show how the policy decides for one volume of a live cluster, and which rules fired",
		Long: "Builds the policy input for a volume from the cluster (PV, PVC, StorageClass, VolumeAttachment,\n" +
			"Node), evaluates the policy the controller would use (the policy ConfigMaps, the built-in default\n" +
			"when there are none, or --policy) and prints the decision, the rules that fired and those that did\n" +
			"not. The volume is a PersistentVolume (PV or pv/PV), or the one a claim is bound to (pvc/CLAIM or\n" +
			"--pvc CLAIM, in -n's namespace or the context's). It is a dry run: it reads from the API server and\n" +
			"calls no sidecar or driver, so what only the driver knows is assumed from flags\n" +
			"(--driver-capability, --probe).\n\n" +
			"With -o json it prints the policy input it built instead, as JSON, which `healerctl policy eval\n" +
			"--input -` takes: the same decision, for a policy being written, from a file kept with its tests.",
		Example: "  healerctl policy explain pvc-0b1c2d3e\n" +
			"  kubectl healer policy explain -n shop pvc/data-db-0\n" +
			"  healerctl policy explain -n shop --pvc data-db-0 -o json | healerctl policy eval --policy ./policy --input -",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			switch output {
			case "text", "json":
			default:
				return fmt.Errorf("--output %q: want text or json", output)
			}
			if output == "json" && pod != "" {
				return errors.New("-o json prints the volume's policy input, which policy eval takes; drop --pod, whose restart decision has no eval command")
			}
			cfg, err := kube.config()
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("creating Kubernetes client: %w", err)
			}
			pv, err := explainTarget(ctx, client, kube, args, pvc)
			if err != nil {
				return err
			}

			driver, err := policy.AssumedDriver(capabilities, identities, attributes)
			if err != nil {
				return err
			}
			in, err := policy.InputFromCluster(ctx, client, pv, policy.ClusterInputOptions{
				Trigger: policy.Trigger(trigger),
				Node:    node,
				Driver:  driver,
			})
			if err != nil {
				return err
			}
			if probe == "" && pod != "" {
				// The restart decision is asked after a heal that running pods cannot see.
				probe, probeReason = string(policy.HealthInaccessible), healerv1alpha1.ReasonStaleMountInPods
			}
			if probe != "" {
				if in.Probe, err = policy.AssumedProbe(probe, probeReason, healable); err != nil {
					return err
				}
				in.Probe.Kept = kept
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(in)
			}

			modules := policy.DefaultModules()
			if len(paths) > 0 {
				if modules, err = policy.LoadFiles(paths...); err != nil {
					return err
				}
			} else {
				items, err := policyConfigMaps(selector, func(sel labels.Selector) ([]corev1.ConfigMap, error) {
					list, err := client.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
					if err != nil {
						return nil, fmt.Errorf("listing policy ConfigMaps: %w", err)
					}
					return list.Items, nil
				})
				if err != nil {
					return err
				}
				cms := make([]*corev1.ConfigMap, len(items))
				for i := range items {
					cms[i] = &items[i]
				}
				if found := policy.ModulesFromConfigMaps(cms); len(found) > 0 {
					modules = found
				}
			}
			rev, err := policy.Compile(ctx, modules, opts)
			if err != nil {
				if errors.Is(err, policy.ErrRejected) {
					return fmt.Errorf("%w (the controller keeps serving its last good revision)", err)
				}
				return err
			}
			if pod == "" {
				x, err := rev.Explain(ctx, &in)
				if err != nil {
					return err
				}
				return x.WriteText(cmd.OutOrStdout(), full)
			}
			rin, err := restartInput(ctx, client, in, pod, at)
			if err != nil {
				return err
			}
			x, err := rev.ExplainRestart(ctx, &rin)
			if err != nil {
				return err
			}
			return x.WriteText(cmd.OutOrStdout(), full)
		},
	}
	f := cmd.Flags()
	kube.addTo(f)
	f.StringVar(&pvc, "pvc", "", "explain the volume of this claim, in -n's namespace (default: the context's); instead of the argument")
	f.StringVarP(&output, "output", "o", "text", "text: the decision and the rules; json: the policy input, for policy eval --input")
	f.StringVar(&trigger, "trigger", string(policy.TriggerRestart), "sweep to assume: restart, schedule or manual")
	f.StringVar(&node, "node", "", "node to assume when the volume has no VolumeAttachment")
	f.StringVar(&probe, "probe", "", "assume a probe result and explain the second evaluation: healthy, "+
		strings.Join([]string{string(policy.HealthDegraded), string(policy.HealthInaccessible), string(policy.HealthDataLoss)}, ", "))
	f.StringVar(&probeReason, "probe-reason", "Assumed", "reason of the assumed probe result")
	f.BoolVar(&healable, "healable", true, "whether the assumed probe result says the volume can be healed")
	f.BoolVar(&kept, "kept", false, "whether the assumed probe result says the driver keeps the volume alive across restarts (its mounter runs outside the node plugin)")
	f.StringSliceVar(&capabilities, "driver-capability", []string{"probe", "heal"}, "healer capabilities to assume the driver advertises: probe, heal, listVolumes, and the volume keeping pluginRestart, mounterRestart")
	f.StringSliceVar(&identities, "identity-capability", nil, "CSI-Addons identity capabilities to assume, such as SERVICE:NODE_SERVICE")
	f.StringToStringVar(&attributes, "driver-attribute", nil, "healer attributes to assume the driver publishes, key=value")
	f.StringArrayVar(&paths, "policy", nil, "explain with this policy file or folder instead of the cluster's (repeatable)")
	f.StringVar(&namespace, "policy-namespace", policy.DefaultPolicyNamespace, "namespace of the policy ConfigMaps")
	f.StringVar(&selector, "policy-selector", policy.DefaultPolicySelector, "label selector of the policy ConfigMaps")
	f.DurationVar(&opts.EvalTimeout, "timeout", policy.DefaultEvalTimeout, "evaluation timeout")
	f.BoolVar(&full, "trace", false, "also print OPA's full evaluation trace")
	f.StringVar(&pod, "pod", "", "explain the restart decision for this pod of the volume's claim (its namespace), after a heal it cannot see "+
		"(the probe result defaults to INACCESSIBLE "+healerv1alpha1.ReasonStaleMountInPods+")")
	f.Func("time", "time of the restart decision, RFC 3339; default: now", func(v string) error {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return fmt.Errorf("--time %q is not an RFC 3339 time such as 2026-12-01T03:00:00Z: %w", v, err)
		}
		at = t
		return nil
	})
	return cmd
}

// explainTarget names the PersistentVolume to explain: the argument (PV, pv/PV, pvc/CLAIM), or
// --pvc, whose claim must be bound.
func explainTarget(ctx context.Context, client kubernetes.Interface, kube *kubeFlags, args []string, pvc string) (string, error) {
	switch {
	case len(args) == 0 && pvc == "":
		return "", errors.New("name the volume: a PersistentVolume (PV or pv/PV), or a claim (pvc/CLAIM or --pvc CLAIM)")
	case len(args) == 1 && pvc != "":
		return "", fmt.Errorf("%s and --pvc %s both name a volume; give one", args[0], pvc)
	case len(args) == 1:
		kind, name, typed := strings.Cut(args[0], "/")
		if !typed {
			return args[0], nil
		}
		switch strings.ToLower(kind) {
		case "pv", "persistentvolume", "persistentvolumes":
			return name, nil
		case "pvc", "persistentvolumeclaim", "persistentvolumeclaims":
			pvc = name
		default:
			return "", fmt.Errorf("%s: want a PersistentVolume (pv/NAME) or a PersistentVolumeClaim (pvc/NAME), not %s", args[0], kind)
		}
	}
	if pvc == "" || strings.Contains(pvc, "/") {
		return "", fmt.Errorf("claim %q: want its name, with -n for its namespace", pvc)
	}
	ns, err := kube.namespace()
	if err != nil {
		return "", err
	}
	claim, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, pvc, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", ns, pvc, err)
	}
	if claim.Spec.VolumeName == "" {
		return "", fmt.Errorf("PersistentVolumeClaim %s/%s is not bound to a volume (phase %s): the policy decides for volumes", ns, pvc, claim.Status.Phase)
	}
	return claim.Spec.VolumeName, nil
}

// restartInput builds the restart input of the pod named name, in the namespace of the volume's
// claim, from the cluster, at the time at (now when zero).
func restartInput(ctx context.Context, client kubernetes.Interface, in policy.Input, name string, at time.Time) (policy.RestartInput, error) {
	if in.Volume.PVC == nil {
		return policy.RestartInput{}, fmt.Errorf("--pod %s: PersistentVolume %s is not bound to a claim, so no pod uses it", name, in.Volume.PV)
	}
	ns := in.Volume.PVC.Namespace
	p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return policy.RestartInput{}, fmt.Errorf("reading pod %s/%s: %w", ns, name, err)
	}
	sc := ""
	if in.Volume.StorageClass != nil {
		sc = in.Volume.StorageClass.Name
	}
	scope, err := policy.ReadPodScope(ctx, client, ns, sc)
	if err != nil {
		return policy.RestartInput{}, err
	}
	if at.IsZero() {
		at = time.Now()
	}
	return scope.Input(in, p, at), nil
}

// policyConfigMaps lists the policy ConfigMaps as the controller selects them (policy.Selectors):
// one LIST per selector, each ConfigMap once, by name.
func policyConfigMaps(selector string, list func(labels.Selector) ([]corev1.ConfigMap, error)) ([]corev1.ConfigMap, error) {
	sels, err := policy.Selectors(selector)
	if err != nil {
		return nil, err
	}
	var out []corev1.ConfigMap
	for _, sel := range sels {
		items, err := list(sel)
		if err != nil {
			return nil, err
		}
		for _, cm := range items {
			if !slices.ContainsFunc(out, func(o corev1.ConfigMap) bool { return o.Name == cm.Name }) {
				out = append(out, cm)
			}
		}
	}
	slices.SortFunc(out, func(a, b corev1.ConfigMap) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
