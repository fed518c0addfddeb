#!/usr/bin/env bash
# kVersion (common/version.h, served at GET /version) is the Helm chart's appVersion.
#
#   bash tests/repo/version_test.sh REPO_ROOT
set -euo pipefail
root=$1
chart=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$root/deploy/helm/kvserve/Chart.yaml")
code=$(sed -n 's/.*kVersion = "\([^"]*\)";.*/\1/p' "$root/common/version.h")
[[ -n $chart && -n $code ]] || { echo "version_test: no appVersion or no kVersion found" >&2; exit 1; }
[[ $chart == "$code" ]] || { echo "version_test: Chart.yaml appVersion $chart, common/version.h $code" >&2; exit 1; }
echo "version_test: $code"
