package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Check tells whether the controller would accept its policy set with cm stored as given: created,
// or replacing old on an update (old is nil for a create). It builds the set as the controller
// does, from every policy ConfigMap the source's informer holds with cm in place of the stored
// one, and compiles and validates it with the engine's options, so that it refuses exactly what
// the controller would refuse, with the same message.
//
// It returns nil when the set would be accepted, when cm is not a policy ConfigMap of the source
// (another namespace, or labels the selector does not match: the change takes it out of the set,
// as a delete does), and when the change leaves the set's modules as they were (a label or an
// annotation written, such as the controller's own status on a set it rejected already).
// Otherwise it returns an error naming cm that wraps the *LoadError the controller would report;
// ErrNotSynced before the informer has read the ConfigMaps; and the context's error when ctx
// ends first. Check changes nothing: the engine, its metrics and the ConfigMaps stay as they are.
func (s *ConfigMapSource) Check(ctx context.Context, cm, old *corev1.ConfigMap) error {
	if s.informer == nil || !s.informer.HasSynced() {
		return ErrNotSynced
	}
	if !s.selects(cm) {
		return nil
	}
	stored, err := s.list()
	if err != nil {
		return err
	}
	set := replaced(stored, cm)
	modules := ModulesFromConfigMaps(set)
	if old != nil && s.selects(old) && slices.Equal(ModulesFromConfigMaps(replaced(stored, old)), modules) {
		return nil
	}

	var rejected error
	switch {
	case len(modules) == 0:
		rejected = noModulesError(len(set))
	case revisionID(modules) == s.engine.Revision().ID():
		return nil // the set serves already
	default:
		_, rejected = Compile(ctx, modules, s.engine.opts.Compile)
	}
	var le *LoadError
	if !errors.As(rejected, &le) {
		return rejected // nil, or not the policy's fault (ctx ended)
	}
	name := cm.Namespace + "/" + cm.Name
	bad := offending(set, le)
	if slices.Contains(bad, cm) {
		return fmt.Errorf("ConfigMap %s: %w", name, le)
	}
	names := make([]string, len(bad))
	for i, b := range bad {
		names[i] = b.Namespace + "/" + b.Name
	}
	return fmt.Errorf("ConfigMap %s: the policy set it joins is rejected because of ConfigMap %s: %w", name, strings.Join(names, ", "), le)
}

// selects reports whether cm is one of the source's policy ConfigMaps.
func (s *ConfigMapSource) selects(cm *corev1.ConfigMap) bool {
	if cm.Namespace != s.opts.Namespace {
		return false
	}
	for _, sel := range s.selectors {
		if sel.Matches(labels.Set(cm.Labels)) {
			return true
		}
	}
	return false
}

// list returns the policy ConfigMaps the informer holds.
func (s *ConfigMapSource) list() ([]*corev1.ConfigMap, error) {
	all, err := s.lister.ConfigMaps(s.opts.Namespace).List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing policy ConfigMaps: %w", err)
	}
	return slices.DeleteFunc(all, func(cm *corev1.ConfigMap) bool { return !s.selects(cm) }), nil
}

// replaced returns the ConfigMaps with cm in place of the one of its name, or added.
func replaced(cms []*corev1.ConfigMap, cm *corev1.ConfigMap) []*corev1.ConfigMap {
	out := make([]*corev1.ConfigMap, 0, len(cms)+1)
	for _, c := range cms {
		if c.Name != cm.Name {
			out = append(out, c)
		}
	}
	return append(out, cm)
}
