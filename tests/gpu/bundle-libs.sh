#!/usr/bin/env bash
# Copies into DEST the shared libraries that the given executables load, except the C runtime's
# and CUDA's (the GPU machine brings its own driver, CUDA runtime, cuBLAS and NCCL), so that
# binaries built here run there with LD_LIBRARY_PATH=DEST:/usr/local/cuda/lib64.
#
#   bundle-libs.sh DEST BINARY...
set -euo pipefail
dest=$1
shift
mkdir -p "$dest"
system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so'
cuda='^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia[-a-z]*)\.so'
for binary in "$@"; do
  # ldd prints "name => /path (address)" for each library it resolved.
  while read -r name arrow path _; do
    [[ $arrow == "=>" && $path == /* ]] || continue
    [[ $name =~ $system || $name =~ $cuda ]] && continue
    cp -Lu "$path" "$dest/$name"
  done < <(ldd "$binary")
done
du -sh "$dest"
