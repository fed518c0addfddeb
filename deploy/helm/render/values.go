package main

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/ghodss/yaml"
	"github.com/xeipuuv/gojsonschema"
)

// userValues is the chart's values.yaml, then each -f file, then each --set, later ones winning
// key by key; a null removes a key, as with Helm.
func userValues(c *chart, valueFiles []string, sets []string) (map[string]interface{}, error) {
	values, err := parseValues(c.valuesYAML, "values.yaml")
	if err != nil {
		return nil, err
	}
	for _, f := range valueFiles {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		layer, err := parseValues(raw, f)
		if err != nil {
			return nil, err
		}
		values = mergeValues(values, layer)
	}
	for _, s := range sets {
		kind, expr, _ := strings.Cut(s, ":")
		layer := map[string]interface{}{}
		if err := parseSet(expr, kind == "string", layer); err != nil {
			return nil, fmt.Errorf("--set %s: %w", expr, err)
		}
		values = mergeValues(values, layer)
	}
	return values, nil
}

func parseValues(raw []byte, name string) (map[string]interface{}, error) {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return m, nil
}

// mergeValues returns base overlaid with top: maps merge recursively, anything else replaces,
// and a nil in top deletes the key.
func mergeValues(base, top map[string]interface{}) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range top {
		if v == nil {
			delete(out, k)
			continue
		}
		bm, baseIsMap := out[k].(map[string]interface{})
		tm, topIsMap := v.(map[string]interface{})
		if baseIsMap && topIsMap {
			out[k] = mergeValues(bm, tm)
		} else {
			out[k] = v
		}
	}
	return out
}

// parseSet applies one --set expression, "a.b=1,c[0].d=x,e={x,y}", to into. Backslash escapes
// ',', '.', '=' and itself; values are typed (true/false, null, integers) unless asString.
func parseSet(expr string, asString bool, into map[string]interface{}) error {
	for _, assignment := range splitUnescaped(expr, ',', true) {
		if assignment == "" {
			continue
		}
		parts := splitUnescaped(assignment, '=', false)
		if len(parts) < 2 {
			return fmt.Errorf("%q has no '='", assignment)
		}
		key, raw := parts[0], strings.Join(parts[1:], "=")
		path, err := parseKeyPath(key)
		if err != nil {
			return err
		}
		var value interface{}
		if strings.HasPrefix(raw, "{") && strings.HasSuffix(raw, "}") {
			var list []interface{}
			for _, item := range splitUnescaped(raw[1:len(raw)-1], ',', false) {
				list = append(list, typedValue(unescape(item), asString))
			}
			value = list
		} else {
			value = typedValue(unescape(raw), asString)
		}
		setPath(into, path, value)
	}
	return nil
}

// splitUnescaped splits s at sep where sep is not backslash-escaped (and, if skipBraces, not
// inside {...}); the escapes stay in the pieces.
func splitUnescaped(s string, sep byte, skipBraces bool) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\':
			i++
		case skipBraces && s[i] == '{':
			depth++
		case skipBraces && s[i] == '}' && depth > 0:
			depth--
		case s[i] == sep && depth == 0:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func typedValue(s string, asString bool) interface{} {
	if asString {
		return s
	}
	switch s {
	case "true":
		return true
	case "false":
		return false
	case "null":
		return nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && (s == "0" || s[0] != '0') {
		return n
	}
	return s
}

// pathStep is a map key, or a list index when index >= 0.
type pathStep struct {
	key   string
	index int
}

func parseKeyPath(key string) ([]pathStep, error) {
	var steps []pathStep
	for _, part := range splitUnescaped(key, '.', false) {
		name, rest, _ := strings.Cut(part, "[")
		steps = append(steps, pathStep{key: unescape(name), index: -1})
		for rest != "" {
			num, after, ok := strings.Cut(rest, "]")
			i, err := strconv.Atoi(num)
			if !ok || err != nil || i < 0 || i > 65536 {
				return nil, fmt.Errorf("bad list index in %q", key)
			}
			steps = append(steps, pathStep{index: i})
			rest = strings.TrimPrefix(after, "[")
		}
		if name == "" {
			return nil, fmt.Errorf("empty key in %q", key)
		}
	}
	return steps, nil
}

// setPath returns node with value set at path, creating maps and growing lists on the way.
func setPath(node interface{}, path []pathStep, value interface{}) interface{} {
	if len(path) == 0 {
		return value
	}
	step := path[0]
	if step.index >= 0 {
		list, _ := node.([]interface{})
		for len(list) <= step.index {
			list = append(list, nil)
		}
		list[step.index] = setPath(list[step.index], path[1:], value)
		return list
	}
	m, ok := node.(map[string]interface{})
	if !ok {
		m = map[string]interface{}{}
	}
	m[step.key] = setPath(m[step.key], path[1:], value)
	return m
}

// validateValues checks the merged values against values.schema.json, as Helm does before
// rendering, and lists every violation.
func validateValues(c *chart, values map[string]interface{}) error {
	if c.schema == nil {
		return nil
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(c.schema),
		gojsonschema.NewGoLoader(values))
	if err != nil {
		return fmt.Errorf("values.schema.json: %w", err)
	}
	if result.Valid() {
		return nil
	}
	var lines []string
	for _, e := range result.Errors() {
		lines = append(lines, "- "+e.String())
	}
	sort.Strings(lines)
	return fmt.Errorf("values don't meet the specifications of the schema(s) in the following "+
		"chart(s):\n%s:\n%s", c.meta.Name, strings.Join(lines, "\n"))
}
