package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// Load builds the effective configuration: built-in defaults, then the YAML file named by
// --config or VOLUME_HEALER_CONFIG (if any), then VOLUME_HEALER_* environment variables, then
// the flags of fs that were set on the command line. fs should have been filled by
// RegisterFlags and parsed; it may be nil. env looks up one environment variable (pass
// os.LookupEnv); nil means an empty environment. A variable that is set but empty counts as set,
// so VOLUME_HEALER_SCHEDULE_DEFAULT= turns the default schedule off.
//
// Every problem is reported, each on its own line, naming the key, where its value came from,
// the value and what is allowed. The errors wrap ErrConfigFile, ErrUnknownKey or
// ErrInvalidValue.
func Load(fs *pflag.FlagSet, env func(string) (string, bool)) (*Config, error) {
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	l := &loader{fs: fs, env: env, v: viper.New(), sources: map[string]source{}}
	if err := l.readFile(); err != nil {
		return nil, err
	}
	l.layer()

	cfg := Default()
	var errs []error
	failed := map[string]bool{}
	for _, s := range settings {
		if fe := l.decode(s, &cfg); fe != nil {
			failed[s.path] = true
			errs = append(errs, fe)
		}
	}
	for _, is := range cfg.validate() {
		// A rule about a value that could not be parsed would judge the default instead, and
		// only confuse.
		if failed[is.key] || anyFailed(failed, is.related) {
			continue
		}
		errs = append(errs, is.fieldError(l.sources[is.key].String()))
	}
	if err := errors.Join(append(l.fileErrs, errs...)...); err != nil {
		return nil, err
	}
	return &cfg, nil
}

func anyFailed(failed map[string]bool, keys []string) bool {
	for _, k := range keys {
		if failed[k] {
			return true
		}
	}
	return false
}

// sourceKind orders the places a value can come from, lowest precedence first.
type sourceKind int

const (
	sourceDefault sourceKind = iota
	sourceFile
	sourceEnv
	sourceFlag
)

// source is where one key's effective value came from.
type source struct {
	kind sourceKind
	// name is the file path, the environment variable or the flag (with its dashes).
	name string
	// line is the line of the key in the file, or 0.
	line int
}

// String renders the source for error messages.
func (s source) String() string {
	switch s.kind {
	case sourceFile:
		if s.line > 0 {
			return fmt.Sprintf("file %s, line %d", s.name, s.line)
		}
		return "file " + s.name
	case sourceEnv:
		return "env " + s.name
	case sourceFlag:
		return "flag " + s.name
	default:
		return "default"
	}
}

// loader carries the state of one Load call.
type loader struct {
	fs  *pflag.FlagSet
	env func(string) (string, bool)
	v   *viper.Viper

	// path is the configuration file, empty if none.
	path string
	// fileValues holds, per key path, the YAML node of each key the file sets.
	fileValues map[string]fileValue
	// fileErrs are problems with the file's keys (unknown keys, wrong shapes).
	fileErrs []error
	// sources records, per key path, where the effective value comes from.
	sources map[string]source
}

// fileValue is one key set in the file.
type fileValue struct {
	node *yaml.Node
	line int
}

// flag returns the flag called name, or nil when fs is nil or lacks it.
func (l *loader) flag(name string) *pflag.Flag {
	if l.fs == nil {
		return nil
	}
	return l.fs.Lookup(name)
}

// readFile finds the configuration file, checks its keys against the table and hands it to
// viper.
func (l *loader) readFile() error {
	var from source
	if f := l.flag(configFlag); f != nil && f.Changed {
		l.path, from = f.Value.String(), source{kind: sourceFlag, name: "--" + configFlag}
	} else if p, ok := l.env(configEnv); ok {
		l.path, from = p, source{kind: sourceEnv, name: configEnv}
	}
	if l.path == "" {
		return nil
	}
	data, err := os.ReadFile(l.path)
	if err != nil {
		return fmt.Errorf("config: %w %s (named by %s): %w", ErrConfigFile, l.path, from, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc, extra yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config: %w %s (named by %s): not valid YAML: %s", ErrConfigFile, l.path, from, yamlMessage(err))
	}
	// viper reads the first document only; settings in a second one would be silently lost.
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return fmt.Errorf("config: %w %s (named by %s): not valid YAML: %s", ErrConfigFile, l.path, from, yamlMessage(err))
	default:
		return fmt.Errorf("config: %w %s (named by %s): line %d: the file must hold one YAML document; remove the \"---\" separator",
			ErrConfigFile, l.path, from, extra.Line)
	}
	l.fileValues = map[string]fileValue{}
	if len(doc.Content) > 0 {
		root := resolve(doc.Content[0])
		switch {
		case isNull(root):
			// A file holding only comments sets nothing.
		case root.Kind != yaml.MappingNode:
			return fmt.Errorf("config: %w %s (named by %s): line %d: the file must be a mapping of keys, such as \"budgets:\" followed by indented \"global: 64\"",
				ErrConfigFile, l.path, from, root.Line)
		default:
			l.walk(root, "", children())
		}
	}
	// viper parses the file once more for its own layer; the walk above has already seen it parse,
	// so an error here means YAML that decodes as a tree but not as a map, like a repeated key.
	l.v.SetConfigType("yaml")
	if err := l.v.ReadConfig(bytes.NewReader(data)); err != nil {
		return fmt.Errorf("config: %w %s (named by %s): not valid YAML: %s", ErrConfigFile, l.path, from, yamlMessage(err))
	}
	return nil
}

// yamlMessage extracts the YAML parser's message, with its line numbers, from viper's wrapper,
// on one line so that it stays one line of the joined errors.
func yamlMessage(err error) string {
	var typeErr *yaml.TypeError
	if errors.As(err, &typeErr) {
		return strings.Join(typeErr.Errors, "; ")
	}
	if inner := errors.Unwrap(err); inner != nil {
		err = inner
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// walk checks a mapping of the file against the key table. prefix is the section path ("" at the
// top level). Known leaves are recorded; unknown keys and sections that are not mappings are
// reported.
func (l *loader) walk(node *yaml.Node, prefix string, tree map[string][]string) {
	for i := 0; i+1 < len(node.Content); i += 2 {
		keyNode, valueNode := node.Content[i], resolve(node.Content[i+1])
		name := keyNode.Value
		if keyNode.Kind != yaml.ScalarNode {
			name = "<" + describeNode(keyNode) + ">"
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		src := source{kind: sourceFile, name: l.path, line: keyNode.Line}
		if s, ok := lookupSetting(path); ok && !strings.Contains(name, ".") {
			var scratch Config
			field := s.field(&scratch)
			if _, isMap := field.(*map[string]string); isNull(valueNode) && !isMap {
				// viper treats a key without a value as absent and would quietly use the
				// default; an operator who wrote "caFile:" meant something, so say so.
				hint := "; write a value or remove the key"
				if _, isString := field.(*string); isString {
					hint = `; write "" for an empty string or remove the key`
				}
				l.fileErrs = append(l.fileErrs, &FieldError{
					Key: path, Source: src.String(), Value: "null", Reason: expected(field) + hint,
					Err: ErrInvalidValue,
				})
			}
			l.fileValues[path] = fileValue{node: valueNode, line: keyNode.Line}
			continue
		}
		if names, ok := tree[path]; ok && !strings.Contains(name, ".") {
			switch {
			case isNull(valueNode):
				// An empty section, e.g. everything under it commented out, sets nothing.
			case valueNode.Kind != yaml.MappingNode:
				l.fileErrs = append(l.fileErrs, &FieldError{
					Key: path, Source: src.String(), Value: describeNode(valueNode),
					Reason: "must be a mapping with the keys " + strings.Join(names, ", "),
					Err:    ErrInvalidValue,
				})
			default:
				l.walk(valueNode, path, tree)
			}
			continue
		}
		l.fileErrs = append(l.fileErrs, &FieldError{
			Key: path, Source: src.String(), Reason: "unknown key" + suggest(path, tree),
			Err: ErrUnknownKey,
		})
	}
}

// suggest returns a hint naming the known key closest to an unknown one, or "".
func suggest(unknown string, tree map[string][]string) string {
	if _, ok := lookupSetting(unknown); ok || tree[unknown] != nil {
		// Only reachable for a dotted key such as "budgets.perNode: 4" written as one name.
		return "; write it as nested keys, one level per dot"
	}
	best, bestDist := "", math.MaxInt
	consider := func(candidate string) {
		d := editDistance(strings.ToLower(unknown), strings.ToLower(candidate))
		if d < bestDist {
			best, bestDist = candidate, d
		}
	}
	for _, s := range settings {
		consider(s.path)
	}
	sectionNames := make([]string, 0, len(tree))
	for section := range tree {
		if section != "" {
			sectionNames = append(sectionNames, section)
		}
	}
	// Sorted, so that ties between equally close keys always resolve the same way.
	sort.Strings(sectionNames)
	for _, section := range sectionNames {
		consider(section)
	}
	if bestDist > 3 {
		return "; see docs/configuration.md for the list of keys"
	}
	return "; did you mean " + best + "?"
}

// editDistance is the Levenshtein distance between a and b, counted in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// resolve follows a YAML alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// describeNode renders a YAML node for an error message without dumping large values.
func describeNode(n *yaml.Node) string {
	switch {
	case isNull(n):
		return "null"
	case n.Kind == yaml.ScalarNode:
		if n.ShortTag() == "!!str" {
			return strconv.Quote(n.Value)
		}
		return n.Value
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	default:
		return "an unsupported YAML value"
	}
}

// layer gives viper the defaults, flags and environment, and records each key's source.
func (l *loader) layer() {
	defaults := Default()
	for _, s := range settings {
		key := s.viperKey()
		l.v.SetDefault(key, rawDefault(s.field(&defaults)))
		if f := l.flag(s.flagName()); f != nil {
			// BindPFlag only fails for a nil flag.
			_ = l.v.BindPFlag(key, f)
			if f.Changed {
				l.sources[s.path] = source{kind: sourceFlag, name: "--" + f.Name}
				continue
			}
		}
		// viper's BindEnv can only read the process environment, and Load takes a lookup
		// function instead. The value goes into viper's override layer, which outranks flags;
		// the documented order holds only because keys whose flag was set were skipped above.
		if val, ok := l.env(s.envName()); ok {
			l.v.Set(key, val)
			l.sources[s.path] = source{kind: sourceEnv, name: s.envName()}
			continue
		}
		if fv, ok := l.fileValues[s.path]; ok {
			l.sources[s.path] = source{kind: sourceFile, name: l.path, line: fv.line}
			continue
		}
		l.sources[s.path] = source{kind: sourceDefault}
	}
}

// rawDefault converts a default to the form a user would write, so that defaults go through
// the same parsing as every other source.
func rawDefault(field any) any {
	switch p := field.(type) {
	case *string:
		return *p
	case *bool:
		return *p
	case *int:
		return *p
	case *time.Duration:
		return formatDuration(*p)
	case *map[string]string:
		out := make(map[string]any, len(*p))
		for k, v := range *p {
			out[k] = v
		}
		return out
	}
	panic(fmt.Sprintf("config: unsupported field type %T", field))
}

// decode parses the effective value of one key into cfg.
func (l *loader) decode(s setting, cfg *Config) *FieldError {
	src := l.sources[s.path]
	raw := l.v.Get(s.viperKey())
	switch s.field(cfg).(type) {
	case *string:
		// viper hands over YAML's typed value, so "leaseName: 0x1F" would arrive as 31; a string
		// key takes the scalar as written.
		if fv, ok := l.fileValues[s.path]; ok && src.kind == sourceFile && fv.node.Kind == yaml.ScalarNode {
			raw = fv.node.Value
		}
	case *map[string]string:
		// viper folds map keys to lower case and re-parses the flag's printed text; StorageClass
		// names are case-sensitive, so the map comes straight from its source.
		switch src.kind {
		case sourceFile:
			raw = l.fileValues[s.path].node
		case sourceFlag:
			raw, _ = l.fs.GetStringToString(s.flagName())
		}
	}
	if raw == nil {
		// Only when the file's shape hides the key (e.g. "budgets: 5"), which is already reported.
		return nil
	}
	if value, reason := assign(s.field(cfg), raw); reason != "" {
		return &FieldError{Key: s.path, Source: src.String(), Value: value, Reason: reason, Err: ErrInvalidValue}
	}
	return nil
}

// expected describes the type a field needs.
func expected(field any) string {
	switch field.(type) {
	case *string:
		return "must be a string"
	case *bool:
		return "must be true or false"
	case *int:
		return "must be an integer"
	case *time.Duration:
		return "must be a duration with a unit, such as 500ms, 10s, 2m or 1h30m"
	default:
		return "must be a mapping of StorageClass name to cron spec in the file, or name=spec pairs separated by commas in the environment and on the command line"
	}
}

// assign stores raw into the field. On failure it returns the rejected value as text and the
// reason.
func assign(field, raw any) (value, reason string) {
	switch p := field.(type) {
	case *string:
		switch v := raw.(type) {
		case string:
			*p = v
			return "", ""
		}
	case *bool:
		switch v := raw.(type) {
		case bool:
			*p = v
			return "", ""
		case string:
			if b, err := strconv.ParseBool(v); err == nil {
				*p = b
				return "", ""
			}
		}
	case *int:
		switch v := raw.(type) {
		case int:
			*p = v
			return "", ""
		case int64:
			if v >= math.MinInt && v <= math.MaxInt {
				*p = int(v)
				return "", ""
			}
		case uint64:
			if v <= math.MaxInt {
				*p = int(v)
				return "", ""
			}
		case string:
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				*p = n
				return "", ""
			}
		}
	case *time.Duration:
		switch v := raw.(type) {
		case string:
			if d, err := time.ParseDuration(strings.TrimSpace(v)); err == nil {
				*p = d
				return "", ""
			}
		case int:
			// A bare 0 is unambiguous; any other bare number lacks its unit.
			if v == 0 {
				*p = 0
				return "", ""
			}
		}
	case *map[string]string:
		m, value, reason := toStringMap(raw)
		if reason != "" {
			return value, reason
		}
		*p = m
		return "", ""
	}
	return describeRaw(raw), expected(field)
}

// toStringMap accepts the map forms of each source: a YAML mapping from the file, name=spec
// pairs from the environment, the parsed flag, and viper's form of the default.
func toStringMap(raw any) (m map[string]string, value, reason string) {
	switch v := raw.(type) {
	case map[string]string:
		return copyMap(v), "", ""
	case map[string]any:
		out := make(map[string]string, len(v))
		for name, spec := range v {
			s, ok := spec.(string)
			if !ok {
				return nil, describeRaw(spec) + " for StorageClass " + strconv.Quote(name), "must be a cron spec string"
			}
			out[name] = s
		}
		return out, "", ""
	case string:
		out, err := parsePairs(v)
		if err != nil {
			return nil, strconv.Quote(v), "must be name=spec pairs separated by commas, such as fast=@hourly,slow=0 3 * * * (quote a pair that contains a comma): " + err.Error()
		}
		return out, "", ""
	case *yaml.Node:
		if isNull(v) {
			return map[string]string{}, "", ""
		}
		if v.Kind != yaml.MappingNode {
			return nil, describeNode(v), "must be a mapping of StorageClass name to cron spec"
		}
		out := make(map[string]string, len(v.Content)/2)
		for i := 0; i+1 < len(v.Content); i += 2 {
			k, spec := resolve(v.Content[i]), resolve(v.Content[i+1])
			if k.Kind != yaml.ScalarNode {
				return nil, describeNode(k), "must be a StorageClass name"
			}
			if spec.Kind != yaml.ScalarNode || spec.ShortTag() != "!!str" {
				return nil, describeNode(spec) + " for StorageClass " + strconv.Quote(k.Value), `must be a cron spec string, or "" for no periodic sweep`
			}
			out[k.Value] = spec.Value
		}
		return out, "", ""
	}
	return nil, describeRaw(raw), expected(new(map[string]string))
}

// parsePairs reads name=spec pairs with pflag's own parser, so the environment accepts exactly
// what --schedule-storage-classes accepts. An empty string is an empty map.
func parsePairs(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return map[string]string{}, nil
	}
	fs := pflag.NewFlagSet("pairs", pflag.ContinueOnError)
	m := fs.StringToString("pairs", nil, "")
	if err := fs.Lookup("pairs").Value.Set(s); err != nil {
		return nil, err
	}
	return copyMap(*m), nil
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// describeRaw renders a raw value for an error message.
func describeRaw(raw any) string {
	switch v := raw.(type) {
	case nil:
		return "null"
	case string:
		return strconv.Quote(v)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	case *yaml.Node:
		return describeNode(v)
	}
	return fmt.Sprint(raw)
}

// sortedKeys returns the keys of m in order, for stable messages and output.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
