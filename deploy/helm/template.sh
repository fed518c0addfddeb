#!/usr/bin/env bash
# Prints the kvserve chart's manifests as `helm template` does, without Helm (not packaged for
# Debian): Go's text/template with Sprig, the engine Helm is built on (render/).
#   bash deploy/helm/template.sh [-f VALUES]... [--set k=v]... [--set-string k=v]...
#     [--release-name NAME] [--namespace NS] [--kube-version vX.Y.Z] [--api-versions G/V]...
#     [--notes] [--show-only templates/FILE]...
#   bash deploy/helm/template.sh --values-doc      the values reference (docs/DEPLOY.md)
# Needs Debian's golang-1.19-go, golang-github-masterminds-sprig-dev,
# golang-github-ghodss-yaml-dev, golang-gopkg-yaml.v3-dev, golang-github-xeipuuv-gojsonschema-dev.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
go=/usr/lib/go-1.19/bin/go
[[ -x $go ]] || go=$(command -v go) || { echo "template.sh: needs Go (golang-1.19-go)" >&2; exit 1; }
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kvserve"
mkdir -p "$cache"
bin="$cache/helm-render-$(cat "$here"/render/*.go | sha256sum | cut -c1-16)"
if [[ ! -x $bin ]]; then
  (cd "$here/render" && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$cache/go-build" \
    GOFLAGS= "$go" build -o "$bin.$$" .) && mv -f "$bin.$$" "$bin"
fi
exec "$bin" --chart "$here/kvserve" "$@"
