#!/bin/bash
# Static cost of the tensor-core attention kernels without a GPU: compiles
# kernels/cuda/paged_attention_mma.cu (as of git revision REV, or the working tree) to sm_90
# PTX and prints, per instantiation, its PTX instruction count and ptxas's registers / spills.
# --per-token cuts the per-group and per-channel branches first, so the count is the path the
# benchmark's per-token formats take. Needs nvcc and ptxas; a build directory for generated
# headers is not needed (the kernels include only sources).
#
#   tools/ptx_stats.sh [--per-token] [REV]
set -euo pipefail
per_token=0
if [[ ${1:-} == --per-token ]]; then
  per_token=1
  shift
fi
rev=${1:-}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
if [[ -n $rev ]]; then
  git -C "$root" archive "$rev" kernels common | tar -x -C "$work/src"
else
  cp -r "$root/kernels" "$root/common" "$work/src/"
fi
if ((per_token)); then
  sed -i 's/l\.granularity == KvGranularity::kPer\(Channel\|Group\)/false/g' \
    "$work"/src/kernels/cuda/paged_attention_mma.cu* "$work/src/kernels/cuda/attention_common.cuh"
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
"$cuda/bin/nvcc" -I"$work/src" -O2 -DNDEBUG -std=c++17 -arch=sm_90 -ptx -x cu \
  "$work/src/kernels/cuda/paged_attention_mma.cu" -o "$work/k.ptx"
"$cuda/bin/ptxas" -arch=sm_90 -O3 -v "$work/k.ptx" -o "$work/k.cubin" 2>"$work/ptxas.txt"
# Kernel names carry the template arguments: KvDType (0 fp32 ... 5 int4) and head_dim.
awk -v ptxas="$work/ptxas.txt" '
  BEGIN {
    split("fp32 fp16 bf16 fp8 int8 int4", names, " ")
    while ((getline line < ptxas) > 0) {
      if (match(line, /entry function .[^ ]*/)) fn = substr(line, RSTART + 16, RLENGTH - 17)
      if (match(line, /Used [0-9]+ registers/)) regs[fn] = substr(line, RSTART + 5, RLENGTH - 15)
      if (match(line, /[0-9]+ bytes spill stores/)) spills[fn] = substr(line, RSTART, RLENGTH - 19)
    }
    printf "%-6s %-5s %8s %6s %7s\n", "format", "hd", "ptx_ins", "regs", "spills"
  }
  function flush() {
    if (name ~ /PagedAttentionMma/) {
      match(name, /KvDTypeE[0-9]E/); dt = names[substr(name, RSTART + 8, 1) + 1]
      match(name, /ELi[0-9]+EEE/); hd = substr(name, RSTART + 3, RLENGTH - 6)
      printf "%-6s %-5s %8d %6s %7s\n", dt, hd, count, regs[name], spills[name]
    }
  }
  /^\.visible \.entry|^\.entry/ { flush(); name = $NF; sub(/\(.*/, "", name); count = 0; next }
  { sub(/^[ \t{]+/, "") }
  /^[a-z@][^:]*;$/ && $0 !~ /^\/\// { count++ }
  END { flush() }
' "$work/k.ptx"
