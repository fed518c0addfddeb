#!/bin/sh
# The build stage of both images: installs deploy/docker/build-packages.txt, builds the kvserve
# binaries of deploy/docker/binaries.txt (Release) into /out/bin, and lists in /out/runtime-packages the packages that hold the
# shared libraries they load (runtime-packages.sh), so the final stage installs exactly those.
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
grep -v '^#' /src/deploy/docker/build-packages.txt | xargs apt-get install -y -qq --no-install-recommends >/dev/null
cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
targets=$(grep -v '^#' /src/deploy/docker/binaries.txt)
cmake --build /build -j "${KVSERVE_JOBS:-$(nproc)}" --target $targets
mkdir -p /out/bin
for t in $targets; do install -m 0755 -s "/build/bin/$t" /out/bin/; done
sh /src/deploy/docker/runtime-packages.sh /out/bin >/out/runtime-packages
echo "runtime packages: $(tr '\n' ' ' </out/runtime-packages)"
