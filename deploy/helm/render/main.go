// Command render prints a Helm chart's manifests the way `helm template` does, with Go's
// text/template and the Sprig library (the engine Helm is built on) plus the functions and
// objects Helm adds. It exists because Helm is not packaged for Debian: CI renders and validates
// the chart with it, users run the real `helm template` / `helm install`.
//
//	render [--chart DIR] [-f VALUES]... [--set k=v]... [--set-string k=v]...
//	       [--release-name NAME] [--namespace NS] [--kube-version vX.Y.Z]
//	       [--api-versions GROUP/VERSION]... [--notes] [--show-only templates/FILE]...
//	render --values-doc [--chart DIR]    the values reference, as a Markdown table
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

type options struct {
	chartDir    string
	valueFiles  []string
	sets        []string // "typed:k=v" (--set) or "string:k=v" (--set-string)
	releaseName string
	namespace   string
	kubeVersion string
	apiVersions []string
	notes       bool
	showOnly    []string
	valuesDoc   bool
}

// valueFlags are the flags that take a value ("--flag value" or "--flag=value"), and where
// each value goes.
func valueFlags(o *options) map[string]func(string) {
	appendTo := func(list *[]string, prefix string) func(string) {
		return func(v string) { *list = append(*list, prefix+v) }
	}
	set := func(field *string) func(string) { return func(v string) { *field = v } }
	return map[string]func(string){
		"--chart": set(&o.chartDir), "-f": appendTo(&o.valueFiles, ""),
		"--values": appendTo(&o.valueFiles, ""), "--set": appendTo(&o.sets, "typed:"),
		"--set-string": appendTo(&o.sets, "string:"), "--release-name": set(&o.releaseName),
		"--name": set(&o.releaseName), "-n": set(&o.namespace), "--namespace": set(&o.namespace),
		"--kube-version": set(&o.kubeVersion), "-a": appendTo(&o.apiVersions, ""),
		"--api-versions": appendTo(&o.apiVersions, ""), "-s": appendTo(&o.showOnly, ""),
		"--show-only": appendTo(&o.showOnly, ""),
	}
}

func parseArgs(args []string) (options, error) {
	o := options{chartDir: ".", releaseName: "release-name", namespace: "default",
		kubeVersion: "v1.30.0"}
	flags := valueFlags(&o)
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--notes":
			o.notes = true
			continue
		case "--values-doc":
			o.valuesDoc = true
			continue
		}
		name, value, hasValue := strings.Cut(args[i], "=")
		store, known := flags[name]
		if !known {
			return o, fmt.Errorf("unknown flag %q", args[i])
		}
		if !hasValue {
			if i+1 >= len(args) {
				return o, fmt.Errorf("flag %s needs a value", name)
			}
			i++
			value = args[i]
		}
		store(value)
	}
	return o, nil
}

func run(o options) error {
	chart, err := loadChart(o.chartDir)
	if err != nil {
		return err
	}
	if o.valuesDoc {
		doc, err := valuesDoc(chart.valuesYAML)
		if err != nil {
			return fmt.Errorf("%s/values.yaml: %w", o.chartDir, err)
		}
		fmt.Print(doc)
		return nil
	}
	values, err := userValues(chart, o.valueFiles, o.sets)
	if err != nil {
		return err
	}
	if err := validateValues(chart, values); err != nil {
		return err
	}
	caps, err := newCapabilities(o.kubeVersion, o.apiVersions)
	if err != nil {
		return err
	}
	top := topLevel{
		Values:       values,
		Chart:        chart.meta,
		Release:      release{Name: o.releaseName, Namespace: o.namespace, Service: "Helm", IsInstall: true, Revision: 1},
		Capabilities: caps,
		Files:        chart.files,
	}
	docs, err := renderChart(chart, top)
	if err != nil {
		return err
	}
	return printDocs(chart.meta.Name, docs, o)
}

func printDocs(chartName string, docs []renderedFile, o options) error {
	shown := 0
	var notes *renderedFile
	for i, d := range docs {
		if isNotes(d.path) {
			notes = &docs[i]
			continue
		}
		if len(o.showOnly) > 0 && !contains(o.showOnly, d.path) {
			continue
		}
		shown++
		for _, part := range splitDocuments(d.text) {
			fmt.Printf("---\n# Source: %s/%s\n%s\n", chartName, d.path, part)
		}
	}
	if len(o.showOnly) > 0 && shown == 0 {
		return errors.New("could not find template " + strings.Join(o.showOnly, ", ") + " in chart")
	}
	if o.notes && notes != nil {
		fmt.Printf("NOTES:\n%s\n", notes.text)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func main() {
	o, err := parseArgs(os.Args[1:])
	if err == nil {
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}
