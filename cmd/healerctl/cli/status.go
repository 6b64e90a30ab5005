package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
)

// exitNeedsHuman is healerctl status's exit code when something needs a human; 1 stays for
// errors (the cluster could not be read).
const exitNeedsHuman = 2

// defaultPendingThreshold is how long a restart may stay unswept before it needs a human: far
// beyond a sweep's usual minutes, short of an hour-long outage going unnoticed.
const defaultPendingThreshold = 15 * time.Minute

// statusOptions are the flags of healerctl status.
type statusOptions struct {
	kube                          *kubeFlags
	output                        string
	pendingThreshold              time.Duration
	policyNamespace               string
	policySelector                string
	sweepCSIAddonsSidecarRestarts bool
	timeout                       time.Duration
}

func newStatusCommand() *cobra.Command {
	o := statusOptions{kube: newKubeFlags()}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show restarts swept and pending, volumes that need a human, and the policy in force",
		Long: "status reads the cluster and prints, per CSI driver and node, the node plugin's last restart\n" +
			"and whether the controller has swept it (handled) or not yet (pending, and since when), with the\n" +
			"tier the driver gets there (healer, probe-only or none, from the capabilities its sidecar\n" +
			"answered, as the controller recorded them on the CSIAddonsNode); the\n" +
			"volumes whose last probe or heal failed and those whose data is lost, from the status the\n" +
			"controller writes on their PVCs; and the policy in force with the status the controller wrote\n" +
			"on each policy ConfigMap.\n\n" +
			"It exits 0 when nothing needs a human, 2 when something does (a restart pending longer than\n" +
			"--pending-threshold, a volume left unhealthy or whose heal failed, data loss, a policy that is\n" +
			"rejected or not loaded), and 1 when the cluster could not be read; so it can be a cron job or a\n" +
			"CI gate. It needs to list CSIAddonsNodes, PVCs, PVs and Events in every namespace, and the\n" +
			"ConfigMaps of the policy namespace.",
		Example: "  healerctl status\n" +
			"  kubectl healer status --context prod -o json\n" +
			"  healerctl status --pending-threshold 5m || page-the-storage-team",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch o.output {
			case "table", "json", "yaml":
			default:
				return fmt.Errorf("--output %q: want table, json or yaml", o.output)
			}
			if o.kube.namespaceGiven() {
				return errors.New("-n/--namespace: status reads every namespace; drop the flag (--policy-namespace names the policy's)")
			}
			c, err := o.kube.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			r, err := readStatus(ctx, c, o, time.Now())
			if err != nil {
				return err
			}
			if err := r.write(cmd.OutOrStdout(), o.output); err != nil {
				return err
			}
			if n := len(r.Problems); n > 0 {
				return &exitError{code: exitNeedsHuman, msg: fmt.Sprintf("%d %s a human", n, plural(n, "thing needs", "things need"))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	o.kube.addTo(f)
	f.StringVarP(&o.output, "output", "o", "table", "output format: table, json or yaml")
	f.DurationVar(&o.pendingThreshold, "pending-threshold", defaultPendingThreshold, "a restart not swept after this long needs a human")
	f.StringVar(&o.policyNamespace, "policy-namespace", policy.DefaultPolicyNamespace, "namespace of the policy ConfigMaps (the controller's policy.namespace)")
	f.StringVar(&o.policySelector, "policy-selector", policy.DefaultPolicySelector, "label selector of the policy ConfigMaps (the controller's policy.labelSelector)")
	f.BoolVar(&o.sweepCSIAddonsSidecarRestarts, "sweep-csiaddons-sidecar-restarts", false,
		"count a restart of the csi-addons sidecar container alone as a restart to sweep, as the controller's restart.sweepCSIAddonsSidecarRestarts does")
	f.DurationVar(&o.timeout, "timeout", time.Minute, "how long reading the cluster may take")
	return cmd
}

// Status is what healerctl status reports; its JSON and YAML forms are this struct's.
type Status struct {
	// Time is when the cluster was read.
	Time time.Time `json:"time"`
	// Restarts has one entry per CSIAddonsNode: a driver's node plugin on a node.
	Restarts []Restart `json:"restarts"`
	// Volumes are the volumes whose last probe found them unhealthy without a heal, or whose heal
	// failed.
	Volumes []Volume `json:"volumes"`
	// HealedVolumes counts the PVCs whose status says healed: the controller healed them, and no
	// probe since found them healthy or broken again.
	HealedVolumes int `json:"healedVolumes"`
	// Recycling are the volumes being recycled on a node (the pods using them there evicted so
	// that the driver mounts them again), with their progress.
	Recycling []Volume `json:"recycling"`
	// Policy is the policy in force.
	Policy PolicyState `json:"policy"`
	// Problems lists what needs a human, one sentence each; empty when nothing does.
	Problems []string `json:"problems"`
}

// Restart states.
const (
	RestartHandled = "handled"
	RestartPending = "pending"
)

// Restart is the last restart of one driver's node plugin on one node.
type Restart struct {
	Driver        string `json:"driver"`
	Node          string `json:"node"`
	CSIAddonsNode string `json:"csiAddonsNode"`
	// State is handled (swept) or pending (not swept yet).
	State string `json:"state"`
	// RestartedAt is when the node plugin started, from its restart marker; absent when the
	// marker holds no time.
	RestartedAt *time.Time `json:"restartedAt,omitempty"`
	// Marker is the current restart marker, HandledMarker the last one swept.
	Marker        string `json:"marker"`
	HandledMarker string `json:"handledMarker,omitempty"`
	// LastSweep is the newest Event the controller recorded about sweeping this restart.
	LastSweep *SweepEvent `json:"lastSweep,omitempty"`
	// NeedsHuman is true for a restart pending longer than the threshold.
	NeedsHuman bool `json:"needsHuman"`
	// Tier is what volume-healer gets from the driver on the node, as the controller recorded it
	// from the capabilities the sidecar answered: healer, probe-only or none; TierUnknown until
	// the controller has read them (or when what it recorded cannot be read).
	Tier string `json:"tier"`
	// ProbeSource is who probes the driver's volumes on the node, driver or sidecar; absent
	// while the tier is unknown.
	ProbeSource string `json:"probeSource,omitempty"`
	// LastSweepResult is what the last finished restart sweep did with the node's volumes, as
	// the controller recorded it with the handled marker: among others how many it healed and
	// how many it found kept alive across the restart by the driver. Absent until a sweep
	// recorded it (or when what it recorded cannot be read).
	LastSweepResult *healer.RestartSweepResult `json:"lastSweepResult,omitempty"`
}

// TierUnknown is Restart.Tier before the controller has recorded the driver's tier on the node.
const TierUnknown = "unknown"

// SweepEvent is an Event of a restart sweep.
type SweepEvent struct {
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Time    time.Time `json:"time"`
}

// Volume is a volume the controller left broken.
type Volume struct {
	// PVC is namespace/name.
	PVC    string `json:"pvc"`
	PV     string `json:"pv,omitempty"`
	Driver string `json:"driver,omitempty"`
	// Status is the controller's status annotation on the PVC.
	Status healer.VolumeStatus `json:"status"`
	// DataLoss is true when the last probe reported DATA_LOSS.
	DataLoss bool `json:"dataLoss"`
	// Action says what a human should do.
	Action string `json:"action"`
}

// PolicyState is the policy in force and the status of each policy ConfigMap.
type PolicyState struct {
	Namespace string `json:"namespace"`
	Selector  string `json:"selector"`
	// InForce is true when the configured policy serves: the built-in default without
	// ConfigMaps, or every ConfigMap loaded (status ok).
	InForce bool `json:"inForce"`
	// Serving says which policy decides now.
	Serving string `json:"serving"`
	// Revision is the serving revision, when the ConfigMaps say it.
	Revision string `json:"revision,omitempty"`
	// LastGoodRevision is the revision kept for when the configured set is rejected.
	LastGoodRevision string `json:"lastGoodRevision,omitempty"`
	// ConfigMaps are the policy ConfigMaps with their status.
	ConfigMaps []PolicyConfigMap `json:"configMaps"`
}

// PolicyConfigMap is one policy ConfigMap and the status the controller wrote on it.
type PolicyConfigMap struct {
	Name string `json:"name"`
	// Status is the controller's status annotation; nil when it wrote none.
	Status *policy.PolicyStatus `json:"status"`
}

// readStatus reads everything the report needs from the cluster.
func readStatus(ctx context.Context, c client.Client, o statusOptions, now time.Time) (*Status, error) {
	s := &Status{Time: now.UTC(), Restarts: []Restart{}, Volumes: []Volume{}, Problems: []string{}}
	if err := s.readRestarts(ctx, c, o, now); err != nil {
		return nil, err
	}
	if err := s.readVolumes(ctx, c); err != nil {
		return nil, err
	}
	if err := s.readPolicy(ctx, c, o); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Status) readRestarts(ctx context.Context, c client.Client, o statusOptions, now time.Time) error {
	var nodes csiaddonsv1alpha1.CSIAddonsNodeList
	if err := c.List(ctx, &nodes); err != nil {
		if meta.IsNoMatchError(err) {
			return fmt.Errorf("list CSIAddonsNodes: %w: the cluster lacks the CSIAddonsNode CRD of kubernetes-csi-addons, which volume-healer needs (docs/operations.md, Before you install)", err)
		}
		return fmt.Errorf("list CSIAddonsNodes: %w", err)
	}
	var events corev1.EventList
	if err := c.List(ctx, &events, client.MatchingFieldsSelector{
		Selector: fields.OneTermEqualSelector("involvedObject.kind", "CSIAddonsNode"),
	}); err != nil {
		return fmt.Errorf("list the Events of CSIAddonsNodes: %w", err)
	}
	newest := map[string]*SweepEvent{}
	for _, e := range events.Items {
		if sweepEventRank[e.Reason] == 0 {
			continue
		}
		key := e.InvolvedObject.Namespace + "/" + e.InvolvedObject.Name
		at := eventTime(&e).UTC()
		// Event times have seconds only: a sweep that ends within the second it started has two
		// Events of one time, and the end tells more.
		if cur, ok := newest[key]; !ok || at.After(cur.Time) || at.Equal(cur.Time) && sweepEventRank[e.Reason] > sweepEventRank[cur.Reason] {
			newest[key] = &SweepEvent{Reason: e.Reason, Message: e.Message, Time: at}
		}
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		marker, unswept := trigger.Unswept(n, o.sweepCSIAddonsSidecarRestarts)
		r := Restart{
			Driver: n.Spec.Driver.Name, Node: n.Spec.Driver.NodeID, CSIAddonsNode: n.Namespace + "/" + n.Name,
			State: RestartHandled, Marker: marker, HandledMarker: annotations.Value(n.Annotations, annotations.HandledMarker),
			LastSweep: newest[n.Namespace+"/"+n.Name],
		}
		if at, ok := restartTime(n); ok {
			r.RestartedAt = &at
		}
		r.Tier, r.ProbeSource = driverTier(n)
		r.LastSweepResult = restartSweepResult(n)
		if unswept {
			r.State = RestartPending
			since := n.CreationTimestamp.Time
			if r.RestartedAt != nil {
				since = *r.RestartedAt
			}
			if age := now.Sub(since); age > o.pendingThreshold {
				r.NeedsHuman = true
				msg := fmt.Sprintf("The restart of %s on node %s (CSIAddonsNode %s) has not been swept for %s", r.Driver, r.Node, r.CSIAddonsNode, duration.HumanDuration(age))
				if r.LastSweep != nil {
					msg += fmt.Sprintf("; last Event %s: %s", r.LastSweep.Reason, r.LastSweep.Message)
				} else {
					msg += "; no sweep Event: is the controller running and leading?"
				}
				s.Problems = append(s.Problems, msg)
			}
		}
		s.Restarts = append(s.Restarts, r)
	}
	slices.SortFunc(s.Restarts, func(a, b Restart) int {
		return cmp.Or(cmp.Compare(a.Driver, b.Driver), cmp.Compare(a.Node, b.Node), cmp.Compare(a.CSIAddonsNode, b.CSIAddonsNode))
	})
	return nil
}

// driverTier is the tier and probe source the controller recorded on n, or TierUnknown.
func driverTier(n *csiaddonsv1alpha1.CSIAddonsNode) (tier, probeSource string) {
	var t healer.DriverTier
	raw, ok := annotations.Get(n.Annotations, annotations.DriverTier)
	if !ok || json.Unmarshal([]byte(raw), &t) != nil || t.Tier == "" {
		return TierUnknown, ""
	}
	return t.Tier, t.ProbeSource
}

// restartSweepResult is what the controller recorded on n of its last finished restart sweep, or
// nil.
func restartSweepResult(n *csiaddonsv1alpha1.CSIAddonsNode) *healer.RestartSweepResult {
	raw, ok := annotations.Get(n.Annotations, annotations.RestartSweep)
	if !ok {
		return nil
	}
	var r healer.RestartSweepResult
	if json.Unmarshal([]byte(raw), &r) != nil {
		return nil
	}
	return &r
}

// sweepEventRank orders the Events of one restart sweep: started, then pending, then finished or
// stopped.
var sweepEventRank = map[string]int{healer.ReasonRestartSweepStarted: 1, healer.ReasonRestartSweepPending: 2, healer.ReasonRestartSweepFinished: 3, healer.ReasonRestartSweepStopped: 3}

// restartTime is the newest start time the marker annotations hold: the healer sidecar's and the
// csi-addons sidecar's.
func restartTime(n *csiaddonsv1alpha1.CSIAddonsNode) (time.Time, bool) {
	var newest time.Time
	if t, ok := annotations.HealerRestartTime(annotations.Value(n.Annotations, annotations.HealerRestart)); ok {
		newest = t
	}
	if t, err := time.Parse(time.RFC3339Nano, n.Annotations[annotations.CSIAddonsRestart]); err == nil && t.After(newest) {
		newest = t
	}
	return newest.UTC(), !newest.IsZero()
}

func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	default:
		return e.CreationTimestamp.Time
	}
}

func (s *Status) readVolumes(ctx context.Context, c client.Client) error {
	// Page through the claims, as kubectl does, so that a large cluster is read in bounded pieces.
	var claims []corev1.PersistentVolumeClaim
	opts := []client.ListOption{client.Limit(500)}
	for {
		var page corev1.PersistentVolumeClaimList
		if err := c.List(ctx, &page, opts...); err != nil {
			return fmt.Errorf("list PVCs: %w", err)
		}
		for _, pvc := range page.Items {
			if _, ok := annotations.Get(pvc.Annotations, annotations.VolumeStatus); ok {
				claims = append(claims, pvc)
			}
		}
		if page.Continue == "" {
			break
		}
		opts = []client.ListOption{client.Limit(500), client.Continue(page.Continue)}
	}
	for _, pvc := range claims {
		key := pvc.Namespace + "/" + pvc.Name
		var st healer.VolumeStatus
		if err := json.Unmarshal([]byte(annotations.Value(pvc.Annotations, annotations.VolumeStatus)), &st); err != nil {
			s.Problems = append(s.Problems, fmt.Sprintf("PVC %s: annotation %s is not a volume status (%v); fix or remove it", key, annotations.VolumeStatus, err))
			continue
		}
		if st.Result == healer.StatusHealed {
			s.HealedVolumes++
			continue
		}
		v := Volume{PVC: key, PV: pvc.Spec.VolumeName, Status: st}
		if st.Result == healer.StatusRecycling {
			if r := st.Recycle; r != nil && r.Blocked+r.Left > 0 {
				s.Problems = append(s.Problems, fmt.Sprintf("PVC %s on node %s: recycle held: %s; read the PVC's Events (VolumeRecycleBlocked): a PodDisruptionBudget or the policy keeps pods on the dead volume",
					key, cmp.Or(st.Node, "?"), recycleProgress(st)))
			}
			s.Recycling = append(s.Recycling, v)
			continue
		}
		if v.PV != "" {
			var pv corev1.PersistentVolume
			switch err := c.Get(ctx, client.ObjectKey{Name: v.PV}, &pv); {
			case err == nil && pv.Spec.CSI != nil:
				v.Driver = pv.Spec.CSI.Driver
			case err != nil && !apierrors.IsNotFound(err):
				return fmt.Errorf("get PV %s of PVC %s: %w", v.PV, key, err)
			}
		}
		v.DataLoss = slices.ContainsFunc(st.Health, func(h probe.Health) bool { return h.Status == string(policy.HealthDataLoss) })
		v.Action = action(v)
		s.Volumes = append(s.Volumes, v)
		s.Problems = append(s.Problems, fmt.Sprintf("PVC %s on node %s: %s: %s", key, cmp.Or(st.Node, "?"), describeVolume(v), v.Action))
	}
	slices.SortFunc(s.Volumes, func(a, b Volume) int { return cmp.Compare(a.PVC, b.PVC) })
	slices.SortFunc(s.Recycling, func(a, b Volume) int { return cmp.Compare(a.PVC, b.PVC) })
	return nil
}

// recycleProgress says how far a recycle has come: pods evicted, waiting, blocked, left alone.
func recycleProgress(st healer.VolumeStatus) string {
	r := st.Recycle
	if r == nil {
		return "no progress recorded"
	}
	return fmt.Sprintf("%d evicted, %d waiting, %d blocked, %d left alone", r.Evicted, r.Waiting, r.Blocked, r.Left)
}

// describeVolume says what the status found.
func describeVolume(v Volume) string {
	st := v.Status
	switch {
	case st.Result == healer.StatusHealFailed:
		return "heal failed: " + cmp.Or(st.Message, "no message")
	case v.DataLoss:
		return "data lost (" + healthText(st.Health) + ")"
	default:
		return "unhealthy and not healed (" + cmp.Or(healthText(st.Health), st.Result) + ")"
	}
}

// action says what a human should do about v.
func action(v Volume) string {
	st := v.Status
	switch {
	case v.DataLoss:
		return "restore its data from a snapshot or replica; the healer does not heal lost data"
	case slices.ContainsFunc(st.Health, func(h probe.Health) bool { return h.Reason == healerv1alpha1.ReasonStaleMountInPods }):
		return "restart the pods on node " + st.Node + " that use it: they still see its dead mount"
	case st.Result == healer.StatusHealFailed:
		return "read the PVC's Events and the controller's log; the next sweep tries again"
	default:
		return "read the PVC's Events: the policy or the driver left it alone"
	}
}

func healthText(hs []probe.Health) string {
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		p := h.Status
		if h.Reason != "" {
			p += " " + h.Reason
		}
		if h.Message != "" {
			p += ": " + h.Message
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

func (s *Status) readPolicy(ctx context.Context, c client.Client, o statusOptions) error {
	p := &s.Policy
	p.Namespace, p.Selector, p.ConfigMaps = o.policyNamespace, o.policySelector, []PolicyConfigMap{}
	items, err := policyConfigMaps(o.policySelector, func(sel labels.Selector) ([]corev1.ConfigMap, error) {
		var cms corev1.ConfigMapList
		if err := c.List(ctx, &cms, client.InNamespace(o.policyNamespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return nil, fmt.Errorf("list the policy ConfigMaps in namespace %s: %w", o.policyNamespace, err)
		}
		return cms.Items, nil
	})
	if err != nil {
		return fmt.Errorf("--policy-selector: %w", err)
	}
	var lastGood corev1.ConfigMap
	switch err := c.Get(ctx, client.ObjectKey{Namespace: o.policyNamespace, Name: policy.DefaultLastGoodName}, &lastGood); {
	case err == nil:
		p.LastGoodRevision = annotations.Value(lastGood.Annotations, annotations.PolicyLastGoodRevision)
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("get ConfigMap %s/%s: %w", o.policyNamespace, policy.DefaultLastGoodName, err)
	}
	if len(items) == 0 {
		p.InForce, p.Serving = true, "the built-in default policy (no policy ConfigMap)"
		return nil
	}
	p.InForce = true
	var rejected []string
	for _, cm := range items {
		name := cm.Namespace + "/" + cm.Name
		entry := PolicyConfigMap{Name: name}
		raw, ok := annotations.Get(cm.Annotations, annotations.PolicyStatus)
		if !ok {
			p.InForce = false
			s.Problems = append(s.Problems, fmt.Sprintf("Policy ConfigMap %s has no status: the controller has not loaded it (is it running, and is its policy.namespace %s?)", name, o.policyNamespace))
			p.ConfigMaps = append(p.ConfigMaps, entry)
			continue
		}
		var st policy.PolicyStatus
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			p.InForce = false
			s.Problems = append(s.Problems, fmt.Sprintf("Policy ConfigMap %s: annotation %s is not a policy status (%v)", name, annotations.PolicyStatus, err))
			p.ConfigMaps = append(p.ConfigMaps, entry)
			continue
		}
		entry.Status = &st
		p.ConfigMaps = append(p.ConfigMaps, entry)
		switch st.Status {
		case policy.StatusOK:
			p.Revision = st.Revision
		case policy.StatusRejected:
			p.InForce = false
			rejected = append(rejected, name)
			s.Problems = append(s.Problems, fmt.Sprintf("Policy ConfigMap %s is rejected (%s): %s", name, st.Reason, st.Error))
		case policy.StatusBlocked:
			p.InForce = false
		case policy.StatusIgnored:
			// A label on a ConfigMap without Rego: nothing serves from it, nothing breaks.
		default:
			p.InForce = false
			s.Problems = append(s.Problems, fmt.Sprintf("Policy ConfigMap %s has status %q, which this healerctl does not know", name, st.Status))
		}
	}
	switch {
	case p.InForce && p.Revision != "":
		p.Serving = "policy ConfigMaps, revision " + p.Revision
	case p.InForce:
		// Only ignored ConfigMaps: the default serves.
		p.Serving = "the built-in default policy (no policy ConfigMap holds Rego)"
	case len(rejected) > 0 && p.LastGoodRevision != "":
		p.Serving = "the last good revision " + p.LastGoodRevision + ", kept while " + strings.Join(rejected, ", ") + " is rejected"
	case len(rejected) > 0:
		p.Serving = "a fail-closed policy that skips every volume, while " + strings.Join(rejected, ", ") + " is rejected"
	default:
		p.Serving = "unknown: the controller has not written the status of every policy ConfigMap"
	}
	return nil
}

// write prints the report in format.
func (s *Status) write(w io.Writer, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	case "yaml":
		out, err := yaml.Marshal(s)
		if err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	}
	return s.writeTable(w)
}

func (s *Status) writeTable(out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return duration.HumanDuration(s.Time.Sub(t)) + " ago"
	}
	pending, healed, kept := 0, 0, 0
	for _, r := range s.Restarts {
		if r.State == RestartPending {
			pending++
		}
		if res := r.LastSweepResult; res != nil {
			healed, kept = healed+res.Healed, kept+res.Kept
		}
	}
	fmt.Fprintf(w, "NODE PLUGIN RESTARTS (%d, %d pending); their last sweeps: %d healed, %d kept\n", len(s.Restarts), pending, healed, kept)
	if len(s.Restarts) > 0 {
		fmt.Fprintln(w, "DRIVER\tNODE\tTIER\tSTATE\tHEALED\tKEPT\tRESTARTED\tLAST SWEEP EVENT")
	}
	for _, r := range s.Restarts {
		restarted := "-"
		if r.RestartedAt != nil {
			restarted = ago(*r.RestartedAt)
		}
		state := r.State
		if r.NeedsHuman {
			state += " (needs a human)"
		}
		last := "-"
		if r.LastSweep != nil {
			last = r.LastSweep.Reason + " " + ago(r.LastSweep.Time) + ": " + r.LastSweep.Message
		}
		healedCol, keptCol := "-", "-"
		if res := r.LastSweepResult; res != nil {
			healedCol, keptCol = fmt.Sprint(res.Healed), fmt.Sprint(res.Kept)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Driver, r.Node, r.Tier, state, healedCol, keptCol, restarted, last)
	}
	if len(s.Restarts) > 0 {
		fmt.Fprintln(w, "TIER: healer = the driver probes and heals in place; probe-only = the driver probes and does not heal;")
		fmt.Fprintln(w, "none = the driver serves no Healer probe and the sidecar probes on the node; unknown = not asked yet")
		fmt.Fprintln(w, "HEALED, KEPT: the volumes the last finished sweep of the restart healed, and found alive and healthy because the driver kept them across it")
	}
	fmt.Fprintf(w, "\nVOLUMES LEFT BROKEN (%d; %d healed since their last problem)\n", len(s.Volumes), s.HealedVolumes)
	if len(s.Volumes) > 0 {
		fmt.Fprintln(w, "PVC\tDRIVER\tNODE\tRESULT\tSINCE\tHEALTH")
	}
	for _, v := range s.Volumes {
		result := v.Status.Result
		if v.DataLoss {
			result = "DATA_LOSS"
		}
		health := make([]string, 0, len(v.Status.Health))
		for _, h := range v.Status.Health {
			health = append(health, strings.TrimSpace(h.Status+" "+h.Reason))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", v.PVC, cmp.Or(v.Driver, "-"), cmp.Or(v.Status.Node, "-"), result,
			ago(v.Status.Time), cmp.Or(strings.Join(health, ", "), "-"))
	}
	if len(s.Recycling) > 0 {
		fmt.Fprintf(w, "\nVOLUMES BEING RECYCLED (%d)\n", len(s.Recycling))
		fmt.Fprintln(w, "PVC\tNODE\tSINCE\tFINDING\tPODS")
		for _, v := range s.Recycling {
			since, finding := "-", "-"
			if r := v.Status.Recycle; r != nil {
				since, finding = ago(r.Since), cmp.Or(r.Finding, "-")
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", v.PVC, cmp.Or(v.Status.Node, "-"), since, finding, recycleProgress(v.Status))
		}
	}
	p := s.Policy
	inForce := "in force"
	if !p.InForce {
		inForce = "NOT in force"
	}
	fmt.Fprintf(w, "\nPOLICY (namespace %s, %s): %s\n", p.Namespace, inForce, p.Serving)
	if len(p.ConfigMaps) > 0 {
		fmt.Fprintln(w, "CONFIGMAP\tSTATUS\tREVISION\tERROR")
	}
	for _, cm := range p.ConfigMaps {
		if cm.Status == nil {
			fmt.Fprintf(w, "%s\t%s\t-\t-\n", cm.Name, "no status")
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", cm.Name, cm.Status.Status, cmp.Or(cm.Status.Revision, "-"), cmp.Or(cm.Status.Error, "-"))
	}
	if len(s.Problems) == 0 {
		fmt.Fprintln(w, "\nNothing needs a human.")
	} else {
		fmt.Fprintf(w, "\nNEEDS A HUMAN (%d)\n", len(s.Problems))
		for _, p := range s.Problems {
			fmt.Fprintf(w, "- %s\n", p)
		}
	}
	return w.Flush()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
