package config

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// YAML renders the configuration in the file's key layout, in the order of the reference
// documentation. Loading the output as the configuration file yields the same Config, which
// makes it suitable both for showing the effective settings and as a starting file.
func (c *Config) YAML() ([]byte, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	for _, s := range settings {
		parts := strings.Split(s.path, ".")
		parent := root
		for _, section := range parts[:len(parts)-1] {
			parent = childMapping(parent, section)
		}
		parent.Content = append(parent.Content, stringNode(parts[len(parts)-1]), valueNode(s.field(c)))
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, fmt.Errorf("config: rendering YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: rendering YAML: %w", err)
	}
	return buf.Bytes(), nil
}

// childMapping returns the mapping stored under name in parent, adding it if missing.
func childMapping(parent *yaml.Node, name string) *yaml.Node {
	for i := 0; i+1 < len(parent.Content); i += 2 {
		if parent.Content[i].Value == name {
			return parent.Content[i+1]
		}
	}
	child := &yaml.Node{Kind: yaml.MappingNode}
	parent.Content = append(parent.Content, stringNode(name), child)
	return child
}

func stringNode(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
}

// valueNode renders one field; strings are tagged so that the encoder quotes values such as "0"
// or "true" that would otherwise read back as another type.
func valueNode(field any) *yaml.Node {
	switch p := field.(type) {
	case *string:
		return stringNode(*p)
	case *bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(*p)}
	case *int:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(*p)}
	case *time.Duration:
		return stringNode(formatDuration(*p))
	case *map[string]string:
		m := &yaml.Node{Kind: yaml.MappingNode}
		if len(*p) == 0 {
			m.Style = yaml.FlowStyle
		}
		for _, name := range sortedKeys(*p) {
			m.Content = append(m.Content, stringNode(name), stringNode((*p)[name]))
		}
		return m
	}
	panic(fmt.Sprintf("config: unsupported field type %T", field))
}
