# Sourced by tools/ptx_stats.sh and tools/pipelined_budget.sh: a kernel source compiled to sm_90
# PTX and ptxas's registers and spills per kernel, without a GPU (needs nvcc and ptxas).

# ptx_sources DIR [REV]: kernels/ and common/ as of git revision REV (else the working tree)
# under DIR/src.
ptx_sources() {
  local dir=$1 rev=${2:-} root
  root=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
  mkdir -p "$dir/src"
  if [[ -n $rev ]]; then
    git -C "$root" archive "$rev" kernels common | tar -x -C "$dir/src"
  else
    cp -r "$root/kernels" "$root/common" "$dir/src/"
  fi
}

# ptx_compile DIR SOURCE NVCC_OPT: DIR/k.ptx from DIR/src/SOURCE, and DIR/resources.txt with a
# line "KERNEL REGISTERS SPILL_BYTES" per kernel (mangled names, from ptxas -v).
ptx_compile() {
  local dir=$1 source=$2 opt=$3 cuda=${CUDA_HOME:-/usr/local/cuda}
  "$cuda/bin/nvcc" -I"$dir/src" "$opt" -DNDEBUG -std=c++17 -arch=sm_90 -ptx -x cu \
    "$dir/src/$source" -o "$dir/k.ptx"
  "$cuda/bin/ptxas" -arch=sm_90 -O3 -v "$dir/k.ptx" -o "$dir/k.cubin" 2>"$dir/ptxas.txt"
  awk '
    match($0, /entry function .[^ ]*/) { fn = substr($0, RSTART + 16, RLENGTH - 17) }
    match($0, /[0-9]+ bytes spill stores/) { spills[fn] = substr($0, RSTART, RLENGTH - 19) }
    match($0, /Used [0-9]+ registers/) { print fn, substr($0, RSTART + 5, RLENGTH - 15), spills[fn] }
  ' "$dir/ptxas.txt" >"$dir/resources.txt"
}
