package main

import (
	"bytes"
	b64 "encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/semver"
	"github.com/Masterminds/sprig"
	"github.com/ghodss/yaml"
)

// topLevel is the object templates see as ".".
type topLevel struct {
	Values       map[string]interface{}
	Chart        chartMeta
	Release      release
	Capabilities capabilities
	Files        files
	Template     templateInfo
}

type release struct {
	Name, Namespace, Service string
	IsInstall, IsUpgrade     bool
	Revision                 int
}

type templateInfo struct{ Name, BasePath string }

type renderedFile struct {
	path string // "templates/x.yaml"
	text string
}

func isNotes(p string) bool { return path.Base(p) == "NOTES.txt" }

// isPartial: files whose name starts with '_' only define named templates.
func isPartial(p string) bool { return strings.HasPrefix(path.Base(p), "_") }

// renderChart executes every template of the chart (partials only define) and returns the
// non-empty results in path order, NOTES.txt included.
func renderChart(c *chart, top topLevel) ([]renderedFile, error) {
	if err := checkKubeVersion(c.meta, top.Capabilities.KubeVersion); err != nil {
		return nil, err
	}
	root := template.New(c.meta.Name).Option("missingkey=zero")
	root.Funcs(funcMap(root))
	names := make([]string, 0, len(c.templates))
	for p := range c.templates {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		if _, err := root.New(c.meta.Name + "/" + p).Parse(c.templates[p]); err != nil {
			return nil, err
		}
	}
	var out []renderedFile
	for _, p := range names {
		if isPartial(p) {
			continue
		}
		name := c.meta.Name + "/" + p
		top.Template = templateInfo{Name: name, BasePath: c.meta.Name + "/templates"}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, top); err != nil {
			return nil, cleanError(err)
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if strings.TrimSpace(text) != "" {
			out = append(out, renderedFile{path: p, text: text})
		}
	}
	return out, nil
}

func checkKubeVersion(meta chartMeta, kv kubeVersion) error {
	if meta.KubeVersion == "" {
		return nil
	}
	constraint, err := semver.NewConstraint(meta.KubeVersion)
	if err != nil {
		return fmt.Errorf("Chart.yaml kubeVersion %q: %w", meta.KubeVersion, err)
	}
	if !constraint.Check(semver.MustParse(kv.Version)) {
		return fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s",
			meta.KubeVersion, kv.Version)
	}
	return nil
}

// failError carries `fail` and `required` messages out of the template engine unwrapped.
type failError struct{ msg string }

func (e failError) Error() string { return e.msg }

func cleanError(err error) error {
	var f failError
	if errors.As(err, &f) {
		return fmt.Errorf("execution error: %s (%s)", f.msg, err)
	}
	return err
}

// funcMap is Sprig's text functions without env/expandenv (as in Helm) plus Helm's own.
func funcMap(root *template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = toYAML
	f["fromYaml"] = fromYAML
	f["fromYamlArray"] = fromYAMLArray
	f["toJson"] = toJSON
	f["fromJson"] = fromJSON
	f["fromJsonArray"] = fromJSONArray
	f["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil || v == "" {
			return nil, failError{msg}
		}
		return v, nil
	}
	f["fail"] = func(msg string) (string, error) { return "", failError{msg} }
	f["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	f["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err == nil {
			t, err = t.New("tpl").Parse(text)
		}
		if err != nil {
			return "", fmt.Errorf("tpl: %w", err)
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return strings.ReplaceAll(buf.String(), "<no value>", ""), err
	}
	f["lookup"] = func(apiVersion, kind, namespace, name string) map[string]interface{} {
		return map[string]interface{}{} // as `helm template`: no cluster to ask
	}
	return f
}

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromYAMLArray(s string) []interface{} {
	var a []interface{}
	if err := yaml.Unmarshal([]byte(s), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(s string) []interface{} {
	var a []interface{}
	if err := json.Unmarshal([]byte(s), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func base64(b []byte) string { return b64.StdEncoding.EncodeToString(b) }

// splitDocuments splits a rendered file at its "---" lines, dropping empty documents.
func splitDocuments(text string) []string {
	var docs []string
	var cur []string
	flush := func() {
		doc := strings.TrimSpace(strings.Join(cur, "\n"))
		if doc != "" && !onlyComments(doc) {
			docs = append(docs, doc)
		}
		cur = nil
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "---") && strings.TrimSpace(strings.TrimLeft(line, "-")) == "" {
			flush()
			continue
		}
		cur = append(cur, line)
	}
	flush()
	return docs
}

func onlyComments(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			return false
		}
	}
	return true
}
