package main

import (
	"encoding/json"
	"fmt"
	"strings"

	yaml3 "gopkg.in/yaml.v3"
)

// valuesDoc renders the values reference from values.yaml: every key whose comment starts
// with "# --" (the helm-docs convention) is a row: key, type, default, description. A leaf key
// with no such comment, and not inside a documented map, is an error, so that the reference
// stays complete.
func valuesDoc(valuesYAML []byte) (string, error) {
	var doc yaml3.Node
	if err := yaml3.Unmarshal(valuesYAML, &doc); err != nil {
		return "", err
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml3.MappingNode {
		return "", fmt.Errorf("not a mapping")
	}
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Description |\n|---|---|---|---|\n")
	if err := docMapping(&b, doc.Content[0], "", false); err != nil {
		return "", err
	}
	return b.String(), nil
}

func docMapping(b *strings.Builder, m *yaml3.Node, prefix string, covered bool) error {
	for i := 0; i+1 < len(m.Content); i += 2 {
		key, value := m.Content[i], m.Content[i+1]
		name := prefix + key.Value
		description, documented := describedBy(key.HeadComment)
		if documented {
			fmt.Fprintf(b, "| `%s` | %s | `%s` | %s |\n", name, typeName(value),
				defaultOf(value), description)
		}
		if value.Kind == yaml3.MappingNode && len(value.Content) > 0 {
			if err := docMapping(b, value, name+".", covered || documented); err != nil {
				return err
			}
		} else if !documented && !covered {
			return fmt.Errorf("key %s has no \"# --\" description", name)
		}
	}
	return nil
}

// describedBy returns the text after "# --" in a head comment, joined into one line.
func describedBy(comment string) (string, bool) {
	_, after, found := strings.Cut(comment, "# --")
	if !found {
		return "", false
	}
	var lines []string
	for _, line := range strings.Split(after, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if line != "" {
			lines = append(lines, line)
		}
	}
	return strings.ReplaceAll(strings.Join(lines, " "), "|", "\\|"), true
}

func typeName(n *yaml3.Node) string {
	switch n.Kind {
	case yaml3.MappingNode:
		return "object"
	case yaml3.SequenceNode:
		return "list"
	}
	switch n.Tag {
	case "!!int":
		return "int"
	case "!!float":
		return "float"
	case "!!bool":
		return "bool"
	case "!!null":
		return "null"
	}
	return "string"
}

func defaultOf(n *yaml3.Node) string {
	var v interface{}
	if err := n.Decode(&v); err != nil {
		return "?"
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return strings.ReplaceAll(string(data), "|", "\\|")
}
