package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseSetTypesAndPaths(t *testing.T) {
	got := map[string]interface{}{}
	err := parseSet(`a.b=1,a.c=true,d=null,e=007,f=x\,y,g\.h=2,l={p,3},m[1].n=v,o=k=v`, false, got)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]interface{}{
		"a":   map[string]interface{}{"b": int64(1), "c": true},
		"d":   nil,
		"e":   "007",
		"f":   "x,y",
		"g.h": int64(2),
		"l":   []interface{}{"p", int64(3)},
		"m":   []interface{}{nil, map[string]interface{}{"n": "v"}},
		"o":   "k=v",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v\nwant %#v", got, want)
	}
}

func TestSetStringKeepsText(t *testing.T) {
	got := map[string]interface{}{}
	if err := parseSet("a=1,b=true", true, got); err != nil {
		t.Fatal(err)
	}
	if got["a"] != "1" || got["b"] != "true" {
		t.Fatalf("got %#v", got)
	}
}

func TestParseSetRejectsBadInput(t *testing.T) {
	for _, expr := range []string{"novalue", "a[x]=1", "a[99999999]=1", ".a=1", "a[-1]=2"} {
		if err := parseSet(expr, false, map[string]interface{}{}); err == nil {
			t.Errorf("%q: no error", expr)
		}
	}
}

func TestMergeValuesDeepWithNullDeleting(t *testing.T) {
	base := map[string]interface{}{
		"w": map[string]interface{}{"engine": map[string]interface{}{"a": 1.0, "b": 2.0}, "n": 1.0},
		"x": "keep",
	}
	top := map[string]interface{}{
		"w": map[string]interface{}{"engine": map[string]interface{}{"a": nil, "c": 3.0}},
		"x": nil,
	}
	got := mergeValues(base, top)
	want := map[string]interface{}{
		"w": map[string]interface{}{"engine": map[string]interface{}{"b": 2.0, "c": 3.0}, "n": 1.0},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v", got)
	}
	if _, ok := base["w"].(map[string]interface{})["engine"].(map[string]interface{})["a"]; !ok {
		t.Fatal("the merge changed its input")
	}
}

func TestSplitDocumentsDropsEmptyAndCommentOnly(t *testing.T) {
	docs := splitDocuments("\n---\n# only a comment\n---\na: 1\n--- \nb: 2\n---\n")
	if len(docs) != 2 || docs[0] != "a: 1" || docs[1] != "b: 2" {
		t.Fatalf("got %q", docs)
	}
}

func TestGlobMatch(t *testing.T) {
	cases := map[[2]string]bool{
		{"dashboards/*.json", "dashboards/a.json"}:    true,
		{"dashboards/*.json", "dashboards/a/b.json"}:  false,
		{"dashboards/**.json", "dashboards/a/b.json"}: true,
		{"*.txt", "NOTES.txt"}:                        true,
	}
	for c, want := range cases {
		if got := globMatch(c[0], c[1]); got != want {
			t.Errorf("globMatch(%q, %q) = %v", c[0], c[1], got)
		}
	}
}

func TestValuesDocNeedsADescriptionPerLeaf(t *testing.T) {
	doc, err := valuesDoc([]byte("# -- The a.\na: 1\nb:\n  # -- A list.\n  c: [x]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(doc, "| `a` | int | `1` | The a. |") || !strings.Contains(doc, "| `b.c` | list | `[\"x\"]` | A list. |") {
		t.Fatalf("got\n%s", doc)
	}
	if _, err := valuesDoc([]byte("# -- ok\na: 1\nb: 2\n")); err == nil || !strings.Contains(err.Error(), "key b") {
		t.Fatalf("undocumented key: err = %v", err)
	}
}

func TestHelmFunctions(t *testing.T) {
	c := &chart{meta: chartMeta{Name: "c", Version: "1.0.0"}, templates: map[string]string{
		"templates/_h.tpl": `{{ define "c.x" }}x={{ . }}{{ end }}`,
		"templates/a.yaml": `v: {{ include "c.x" 2 | quote }}
y: {{ toYaml .Values.m | nindent 2 }}
r: {{ required "need q" .Values.q }}
t: {{ tpl "{{ .Values.q }}!" . }}
k: {{ .Capabilities.APIVersions.Has "policy/v1" }}`,
	}}
	top := topLevel{Values: map[string]interface{}{"m": map[string]interface{}{"b": 1.0, "a": "s"}, "q": "Q"}}
	caps, _ := newCapabilities("v1.30.0", nil)
	top.Capabilities = caps
	out, err := renderChart(c, top)
	if err != nil {
		t.Fatal(err)
	}
	want := "v: \"x=2\"\ny: \n  a: s\n  b: 1\nr: Q\nt: Q!\nk: true"
	if len(out) != 1 || out[0].text != want {
		t.Fatalf("got %q", out)
	}
	delete(top.Values, "q")
	if _, err := renderChart(c, top); err == nil || !strings.Contains(err.Error(), "need q") {
		t.Fatalf("required: err = %v", err)
	}
}

func TestParseArgs(t *testing.T) {
	o, err := parseArgs([]string{"-f", "a.yaml", "--set=x=1", "--set-string", "y=2", "--notes", "-n", "ns"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o.valueFiles, []string{"a.yaml"}) || !o.notes || o.namespace != "ns" ||
		!reflect.DeepEqual(o.sets, []string{"typed:x=1", "string:y=2"}) {
		t.Fatalf("got %+v", o)
	}
	for _, bad := range [][]string{{"--bogus"}, {"--bogus", "x"}, {"-f"}, {"positional"}} {
		if _, err := parseArgs(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
