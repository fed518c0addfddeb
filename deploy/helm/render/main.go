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
	sets        []string // "k=v" (typed) or "string:k=v" (--set-string)
	releaseName string
	namespace   string
	kubeVersion string
	apiVersions []string
	notes       bool
	showOnly    []string
	valuesDoc   bool
}

func parseArgs(args []string) (options, error) {
	o := options{chartDir: ".", releaseName: "release-name", namespace: "default",
		kubeVersion: "v1.30.0"}
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(a, "=")
		next := func() (string, error) {
			if hasValue {
				return value, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("flag %s needs a value", name)
			}
			i++
			return args[i], nil
		}
		var err error
		var v string
		switch name {
		case "--notes":
			o.notes = true
			continue
		case "--values-doc":
			o.valuesDoc = true
			continue
		}
		if v, err = next(); err != nil {
			return o, err
		}
		switch name {
		case "--chart":
			o.chartDir = v
		case "-f", "--values":
			o.valueFiles = append(o.valueFiles, v)
		case "--set":
			o.sets = append(o.sets, "typed:"+v)
		case "--set-string":
			o.sets = append(o.sets, "string:"+v)
		case "--release-name", "--name":
			o.releaseName = v
		case "-n", "--namespace":
			o.namespace = v
		case "--kube-version":
			o.kubeVersion = v
		case "-a", "--api-versions":
			o.apiVersions = append(o.apiVersions, v)
		case "-s", "--show-only":
			o.showOnly = append(o.showOnly, v)
		default:
			return o, fmt.Errorf("unknown flag %q", a)
		}
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
