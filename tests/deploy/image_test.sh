#!/usr/bin/env bash
# The CPU image, built and run for real with podman: a Debian 12 base made with debootstrap
# (no registry is reachable) and `podman import`, deploy/docker/Dockerfile.cpu built on it, then
# a router and two workers from the image (host network, their links authenticated with CURVE
# keys from the image's kvserve-keygen) answer a chat completion; the image
# runs as a non-root user with tini as PID 1 and no build tools, a worker recycles (re-exec)
# inside its container and serves again, and `podman stop` drains a worker to a clean exit.
#
#   bash tests/deploy/image_test.sh REPO_ROOT TOKENIZER_DIR [HOST_BUILD_DIR]
# With HOST_BUILD_DIR (as ctest runs it) the binaries are compiled on this host, CUDA off, into
# that folder (scripts/build.sh: through ccache, which the main build has filled, so seconds where
# the image's own compile takes minutes) and the image is built from a context of those binaries;
# without it, or with KVSERVE_IMAGE_COMPILE=1, the image's build stage compiles them.
# Needs root, podman, runc and debootstrap (scripts/install-deps.sh). The base is cached in
# ${XDG_CACHE_HOME:-~/.cache}/kvserve; KVSERVE_IMAGE_KEEP=1 keeps the images afterwards.
set -euo pipefail
root=$(cd "$1" && pwd)
tokenizer=$(cd "$2" && pwd)
host_build=${3:-}
[[ -n ${KVSERVE_IMAGE_COMPILE:-} ]] && host_build=
say() { echo "image_test: $*"; }
fail() { echo "image_test: FAIL: $*" >&2; exit 1; }
trap 'echo "image_test: FAIL: line $LINENO: $BASH_COMMAND" >&2' ERR

for tool in podman runc debootstrap curl; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (scripts/install-deps.sh)"
done
[[ $(id -u) -eq 0 ]] || { echo "image_test: SKIP: needs root for podman with runc"; exit 77; }

tmp=$(mktemp -d)
base=localhost/kvserve-test/debian:bookworm-minbase
image=localhost/kvserve-test/kvserve:cpu
containers=()
cleanup() {
  for c in "${containers[@]}"; do podman rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  if [[ -z ${KVSERVE_IMAGE_KEEP:-} ]]; then podman rmi -f "$image" >/dev/null 2>&1 || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

source "$root/scripts/lib/podman.sh"
use_host_podman_config "$tmp"

# debootstrap from the mirror apt uses here (and through its proxy, if it has one).
mirror=$(sed -n 's/^URIs: *\([^ ]*\/debian\)\/*$/\1/p; s/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\/debian\)\/* bookworm .*/\2/p' \
  /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null | head -n1 || true)
mirror=${mirror:-http://deb.debian.org/debian}
proxy=$(apt-config dump 2>/dev/null | sed -n 's/^Acquire::http::Proxy "\(.*\)";$/\1/p' | head -n1 || true)
if [[ -n $proxy && -z ${http_proxy:-} ]]; then export http_proxy=$proxy; fi

cache="${XDG_CACHE_HOME:-$HOME/.cache}/kvserve"
mkdir -p "$cache"
if ! podman image exists "$base"; then
  if [[ ! -s $cache/bookworm-minbase.tar ]]; then
    say "debootstrap --variant=minbase bookworm"
    debootstrap --variant=minbase bookworm "$tmp/rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
      { tail -20 "$tmp/debootstrap.log"; fail "debootstrap failed"; }
    tar -C "$tmp/rootfs" -cf "$cache/bookworm-minbase.tar.tmp" . && mv "$cache/bookworm-minbase.tar.tmp" "$cache/bookworm-minbase.tar"
    rm -rf "$tmp/rootfs"
  fi
  podman import "$cache/bookworm-minbase.tar" "$base" >/dev/null
fi

# Whether this sandbox can run a container at all: if not, say why and skip, as nothing after
# this point could tell a broken image from a host that cannot run one.
if ! podman run --rm --network host "$base" true >"$tmp/probe.log" 2>&1; then
  echo "image_test: SKIP: this host cannot run a container from the debootstrapped base:"
  sed 's/^/  /' "$tmp/probe.log"
  exit 77
fi

# The build context: the sources (the image compiles), or a folder of binaries compiled here.
build_args=(--build-arg BASE="$base")
if [[ -n $host_build ]]; then
  say "compiling $(grep -vc '^#' "$root/deploy/docker/binaries.txt") binaries here, CUDA off, in $host_build"
  mapfile -t targets < <(grep -v '^#' "$root/deploy/docker/binaries.txt")
  KVSERVE_CUDA=OFF KVSERVE_BUILD_DIR="$host_build" bash "$root/scripts/build.sh" --target "${targets[@]}" \
    >"$tmp/host-build.log" 2>&1 || { tail -40 "$tmp/host-build.log"; fail "the host build failed"; }
  context="$tmp/context"
  mkdir -p "$context/bin"
  for t in "${targets[@]}"; do install -m 0755 -s "$host_build/bin/$t" "$context/bin/"; done
  sh "$root/deploy/docker/runtime-packages.sh" "$context/bin" >"$context/runtime-packages"
else
  context=$root
  build_args+=(--build-arg KVSERVE_JOBS="${KVSERVE_JOBS:-2}")
fi
say "podman build (deploy/docker/Dockerfile.cpu on $base, ${host_build:+binaries from this host}${host_build:-compiling in the image})"
podman build --network host "${build_args[@]}" -f "$root/deploy/docker/Dockerfile.cpu" -t "$image" \
  "$context" >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; fail "podman build failed"; }

run() { podman run --rm --network host "$image" "$@"; }
# Non-root, tini as PID 1, no compiler or build system in the final stage.
[[ $(run id -u) == 10001 ]] || fail "the image does not run as uid 10001"
[[ $(run cat /proc/1/comm) == tini ]] || fail "PID 1 is not tini"
run sh -c 'for t in cc gcc g++ c++ cmake ninja make nvcc; do command -v $t && exit 1; done; exit 0' ||
  fail "build tools in the final stage"
for b in $(grep -v '^#' "$root/deploy/docker/binaries.txt"); do
  run "$b" --version >/dev/null 2>&1 || fail "$b does not start in the image"
done

mkdir -m 0777 "$tmp/models"
run_model=(podman run --rm --network host -v "$tokenizer:/tokenizer:ro" -v "$tmp/models:/models" "$image")
"${run_model[@]}" kvserve-make-model --tokenizer /tokenizer --out /models/tiny >/dev/null ||
  fail "kvserve-make-model failed in the image"

# CURVE keys made in the image; the workers admit the router's public key only.
mkdir -m 0777 "$tmp/keys"
podman run --rm -v "$tmp/keys:/keys" "$image" kvserve-keygen --dir /keys router worker >/dev/null ||
  fail "kvserve-keygen failed in the image"
mkdir -m 0755 "$tmp/keys/clients" && cp "$tmp/keys/router.pub" "$tmp/keys/clients/"

# A port nothing listens on (bash's /dev/tcp: no connection means free).
used=" "
free_port() {
  local p
  while :; do
    p=$(shuf -i 10000-32000 -n 1)  # below the ephemeral range: no outgoing connection takes it
    [[ $used == *" $p "* ]] && continue
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { used+="$p "; echo "$p"; return; }
  done
}
# Runs a container from the image: read-only root, writable /tmp, the model read-only.
start() {
  local name=$1; shift
  podman run -d --name "$name" --network host --read-only --tmpfs /tmp -v "$tmp/models:/models:ro" \
    -v "$tmp/keys:/keys:ro" "$image" "$@" >/dev/null
  containers+=("$name")
}
workers=()
metrics=()
for i in 0 1; do
  free_port >"$tmp/port"; p=$(<"$tmp/port"); used+="$p "
  free_port >"$tmp/port"; e=$(<"$tmp/port"); used+="$e "
  free_port >"$tmp/port"; m=$(<"$tmp/port"); used+="$m "
  start "kvserve-test-w$i-$$" kvserve-worker --model /models/tiny --host 127.0.0.1 --port "$p" \
    --events-port "$e" --metrics-port "$m" --worker-id "w$i" --num-blocks 256 --max-model-len 1024 \
    --recycle-after-requests 3 --curve-secret-key-file /keys/worker.key \
    --curve-allowed-clients-dir /keys/clients
  workers+=("127.0.0.1:$p:$e")
  metrics[i]=$m
done
free_port >"$tmp/port"; http=$(<"$tmp/port")
start "kvserve-test-router-$$" kvserve-router --model /models/tiny --host 127.0.0.1 --port "$http" \
  --workers "$(IFS=,; echo "${workers[*]}")" --max-model-len 1024 \
  --curve-secret-key-file /keys/router.key --curve-server-key-file /keys/worker.pub

for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$http/ready?min_workers=2" >/dev/null && break
  sleep 0.2
done
curl -sf "http://127.0.0.1:$http/ready?min_workers=2" >/dev/null ||
  { podman logs "kvserve-test-router-$$" | tail -20; fail "the router never had 2 workers ready"; }

chat() {
  curl -s -w '\n%{http_code}' "http://127.0.0.1:$http/v1/chat/completions" -H 'content-type: application/json' \
    -d "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Say hello $1\"}],\"max_tokens\":8}"
}
reply=$(chat 0)
[[ $(tail -n1 <<<"$reply") == 200 ]] || fail "chat completion: $reply"
grep -q '"object":"chat.completion"' <<<"$reply" || fail "not a chat completion: $reply"
grep -q '"completion_tokens":8' <<<"$reply" || fail "expected 8 completion tokens: $reply"
say "chat completion from the containers: OK"

# Past --recycle-after-requests the workers recycle in their containers (one at a time) and
# serve again; requests keep being answered meanwhile (a retry covers a moment with none ready).
ok=0
for i in $(seq 1 12); do
  for attempt in 1 2 3 4 5; do
    if [[ $(chat "$i" | tail -n1) == 200 ]]; then ok=$((ok + 1)); break; fi
    sleep 1
  done
done
[[ $ok == 12 ]] || fail "only $ok of 12 requests answered around the recycles"
recycled=0
for i in 0 1; do
  for _ in $(seq 300); do
    if curl -sf "http://127.0.0.1:${metrics[i]}/ready" >/dev/null; then break; fi
    sleep 0.2
  done
  n=$(curl -sf "http://127.0.0.1:${metrics[i]}/metrics" | awk '/^kvserve_recycles_total\{/{s+=$2} END{print s+0}')
  recycled=$((recycled + ${n%.*}))
done
[[ $recycled -ge 1 ]] || fail "no worker recycled in its container"
say "$recycled recycle(s) inside the containers, all requests answered: OK"

# podman stop sends SIGTERM through tini: the worker drains and exits 0.
podman stop -t 30 "kvserve-test-w0-$$" >/dev/null
code=$(podman inspect --format '{{.State.ExitCode}}' "kvserve-test-w0-$$")
[[ $code == 0 ]] || { podman logs "kvserve-test-w0-$$" | tail -20; fail "worker exit code $code after SIGTERM"; }
podman logs "kvserve-test-w0-$$" 2>&1 | grep -q "draining: sigterm" || fail "the worker did not drain on SIGTERM"
say "SIGTERM drained the worker to exit 0: OK"
