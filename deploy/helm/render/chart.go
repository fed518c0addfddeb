package main

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/Masterminds/semver"
	"github.com/ghodss/yaml"
)

// chartMeta is Chart.yaml, with the field names templates use (.Chart.Name, .Chart.AppVersion).
type chartMeta struct {
	APIVersion   string                   `json:"apiVersion"`
	Name         string                   `json:"name"`
	Version      string                   `json:"version"`
	AppVersion   string                   `json:"appVersion"`
	KubeVersion  string                   `json:"kubeVersion"`
	Description  string                   `json:"description"`
	Type         string                   `json:"type"`
	Home         string                   `json:"home"`
	Keywords     []string                 `json:"keywords"`
	Sources      []string                 `json:"sources"`
	Annotations  map[string]string        `json:"annotations"`
	Icon         string                   `json:"icon"`
	Deprecated   bool                     `json:"deprecated"`
	Maintainers  []map[string]string      `json:"maintainers"`
	Dependencies []map[string]interface{} `json:"dependencies"`
}

type chart struct {
	dir        string
	meta       chartMeta
	valuesYAML []byte
	schema     []byte            // values.schema.json, nil if absent
	templates  map[string]string // "templates/x.yaml" -> text
	files      files             // everything else, for .Files
}

func loadChart(dir string) (*chart, error) {
	c := &chart{dir: dir, templates: map[string]string{}, files: files{}}
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, fmt.Errorf("not a chart: %w", err)
	}
	if err := yaml.UnmarshalStrict(raw, &c.meta); err != nil {
		return nil, fmt.Errorf("%s/Chart.yaml: %w", dir, err)
	}
	if c.meta.Name == "" || c.meta.Version == "" || c.meta.APIVersion != "v2" {
		return nil, fmt.Errorf("%s/Chart.yaml: needs apiVersion v2, a name and a version", dir)
	}
	if _, err := semver.StrictNewVersion(c.meta.Version); err != nil {
		return nil, fmt.Errorf("%s/Chart.yaml: version %q is not SemVer 2", dir, c.meta.Version)
	}
	if c.valuesYAML, err = os.ReadFile(filepath.Join(dir, "values.yaml")); err != nil {
		return nil, err
	}
	if c.schema, err = os.ReadFile(filepath.Join(dir, "values.schema.json")); os.IsNotExist(err) {
		c.schema, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	return c, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		text, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(rel, "templates/"):
			c.templates[rel] = string(text)
		case rel != "Chart.yaml" && rel != "values.yaml" && rel != "values.schema.json":
			c.files[rel] = text
		}
		return nil
	})
}

// files is .Files: the chart's files outside templates/.
type files map[string][]byte

func (f files) Get(name string) string      { return string(f[name]) }
func (f files) GetBytes(name string) []byte { return f[name] }
func (f files) Lines(name string) []string {
	return strings.Split(strings.TrimSuffix(f.Get(name), "\n"), "\n")
}

// Glob returns the files whose path matches pattern (path.Match syntax, '**' for any depth).
func (f files) Glob(pattern string) files {
	out := files{}
	for name, data := range f {
		if globMatch(pattern, name) {
			out[name] = data
		}
	}
	return out
}

func globMatch(pattern, name string) bool {
	if ok, _ := path.Match(pattern, name); ok {
		return true
	}
	if prefix, suffix, deep := strings.Cut(pattern, "**"); deep {
		rest := strings.TrimPrefix(name, prefix)
		if rest == name && prefix != "" {
			return false
		}
		ok, _ := path.Match("*"+strings.TrimPrefix(suffix, "/"), path.Base(rest))
		return ok
	}
	return false
}

// AsConfig renders the files as a ConfigMap's data: base name -> content.
func (f files) AsConfig() string { return f.asMap(func(b []byte) string { return string(b) }) }

// AsSecrets renders the files as a Secret's data: base name -> base64 content.
func (f files) AsSecrets() string { return f.asMap(func(b []byte) string { return base64(b) }) }

func (f files) asMap(conv func([]byte) string) string {
	m := map[string]string{}
	for name, data := range f {
		m[path.Base(name)] = conv(data)
	}
	if len(m) == 0 {
		return ""
	}
	return toYAML(m)
}

func (f files) sortedNames() []string {
	names := make([]string, 0, len(f))
	for n := range f {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// capabilities is .Capabilities: the cluster version and the API versions it serves.
type capabilities struct {
	KubeVersion kubeVersion
	APIVersions apiVersions
}

type kubeVersion struct {
	Version, Major, Minor, GitVersion string
}

func (k kubeVersion) String() string { return k.Version }

// apiVersions lists "group/version" and "group/version/Kind" entries.
type apiVersions []string

func (a apiVersions) Has(v string) bool { return contains(a, v) }

// builtinAPIVersions are the group/versions every Kubernetes from 1.25 serves that the chart
// may ask about; CRD groups (monitoring.coreos.com, keda.sh, gateway.networking.k8s.io) are
// added with --api-versions as with `helm template`.
var builtinAPIVersions = []string{
	"v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v1", "autoscaling/v2",
	"networking.k8s.io/v1", "rbac.authorization.k8s.io/v1", "storage.k8s.io/v1",
	"apiextensions.k8s.io/v1", "coordination.k8s.io/v1", "discovery.k8s.io/v1",
	"scheduling.k8s.io/v1", "node.k8s.io/v1",
}

func newCapabilities(version string, extra []string) (capabilities, error) {
	v, err := semver.NewVersion(version)
	if err != nil {
		return capabilities{}, fmt.Errorf("--kube-version %q: %w", version, err)
	}
	canonical := fmt.Sprintf("v%d.%d.%d", v.Major(), v.Minor(), v.Patch())
	return capabilities{
		KubeVersion: kubeVersion{Version: canonical, Major: fmt.Sprint(v.Major()),
			Minor: fmt.Sprint(v.Minor()), GitVersion: canonical},
		APIVersions: append(append(apiVersions{}, builtinAPIVersions...), extra...),
	}, nil
}
