#!/usr/bin/env bash
# Times `bash scripts/demo.sh` of one commit on a fresh Debian 12: a podman container from the
# debootstrapped minbase that tests/deploy/image_test.sh caches, with this host's CUDA toolkit
# and its local CA certificates (this network's egress proxy signs TLS with them) mounted
# read-only, as the project's machines come with both, and nothing else of the host's.
# The container starts without g++, CMake or Node.js, which the project's machines have, so its
# install phase is longer than theirs: compare commits with each other, not with a real machine.
#
#   bash tools/demo_fresh_time.sh COMMIT [LOG]      # needs root, podman, runc, git
# Prints the demo's wall time (and its phases, from the log's timestamps) on the last line.
set -euo pipefail
commit=${1:?usage: demo_fresh_time.sh COMMIT [LOG]}
root=$(cd "$(dirname "$0")/.." && pwd)
log=${2:-/tmp/demo-fresh-$commit.log}
base=localhost/kvserve-test/debian:bookworm-minbase
tar_cache="${XDG_CACHE_HOME:-$HOME/.cache}/kvserve/bookworm-minbase.tar"
cuda=$(readlink -f /usr/local/cuda)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$root/scripts/lib/podman.sh"
use_host_podman_config "$tmp"
if ! podman image exists "$base"; then
  [[ -s $tar_cache ]] || { echo "no $tar_cache: run tests/deploy/image_test.sh once" >&2; exit 1; }
  podman import "$tar_cache" "$base" >/dev/null
fi
mkdir "$tmp/src"
git -C "$root" archive "$commit" | tar -x -C "$tmp/src"
proxy=$(apt-config dump 2>/dev/null | sed -n 's/^Acquire::http::Proxy "\(.*\)";$/\1/p' | head -n1 || true)

start=$(date +%s)
podman run --rm --network host -e http_proxy="${proxy:-}" -e DEBIAN_FRONTEND=noninteractive \
  -e PATH="/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  -e NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
  -v /usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro \
  -v "$cuda:$cuda:ro" -v "$tmp/src:/src" -w /src "$base" \
  bash -c "ln -s $cuda /usr/local/cuda && bash scripts/demo.sh" >"$log" 2>&1 || {
  tail -30 "$log"
  echo "demo of $commit failed after $(($(date +%s) - start)) s (log: $log)" >&2
  exit 1
}
elapsed=$(($(date +%s) - start))
echo "demo of $commit on a fresh container: ${elapsed} s ($((elapsed / 60)) min $((elapsed % 60)) s); log: $log"
