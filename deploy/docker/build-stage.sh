#!/bin/sh
# The build stage of both images: installs deploy/docker/build-packages.txt, builds every kvserve
# binary (Release) into /out/bin, and lists in /out/runtime-packages the packages that hold the
# shared libraries they load, so the final stage installs exactly those and no build tool.
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
grep -v '^#' /src/deploy/docker/build-packages.txt | xargs apt-get install -y -qq --no-install-recommends >/dev/null
cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
targets="kvserve-router kvserve-worker kvserve-cluster kvserve-bench kvserve-plan kvserve-make-model kvserve-tokenize kvserve-run kvserve-keygen"
cmake --build /build -j "${KVSERVE_JOBS:-$(nproc)}" --target $targets
mkdir -p /out/bin
for t in $targets; do install -m 0755 -s "/build/bin/$t" /out/bin/; done
# Each shared library -> the package that ships it (CUDA's come with the runtime base image).
ldd /out/bin/* | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
done | cut -d: -f1 | sort -u | grep -v -e '^libc6$' -e '^cuda-' -e '^libcublas' -e '^libnccl' >/out/runtime-packages
echo "runtime packages: $(tr '\n' ' ' </out/runtime-packages)"
