#!/bin/sh
# Lists the Debian packages that hold the shared libraries the binaries in BIN_DIR load, one per
# line, so that an image's final stage installs exactly those and no build tool. libc6 comes with
# every base; CUDA's libraries come with NVIDIA's runtime base image.
#   sh deploy/docker/runtime-packages.sh BIN_DIR >runtime-packages
set -eu
ldd "$1"/* | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
done | cut -d: -f1 | sort -u | grep -v -e '^libc6$' -e '^cuda-' -e '^libcublas' -e '^libnccl'
