#!/bin/bash
# Static cost of the tensor-core attention kernels without a GPU: compiles
# kernels/cuda/attention/paged_attention_mma.cu (as of git revision REV, or the working tree) to sm_90
# PTX and prints, per instantiation, its PTX instruction count, ptxas's registers / spills,
# and the token loop's size: `loop` is the PTX between the loop's first label and its backward
# branch (one 16-token step of a warp, both sides of any branch inside; the K-prefetching
# variant, pf_k 1, holds two steps and is halved); `step` leaves out the block a warp vote skips
# on steps where no row's maximum moved (the accumulators' rescale).
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
source "$(dirname "$0")/ptx_lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ptx_sources "$work" "$rev"
if ((per_token)); then
  sed -i -e 's/l\.granularity == KvGranularity::kPer\(Channel\|Group\)/false/g' \
    -e 's/[a-z_.]*granularity == KvGranularity::kPerToken/true/g' \
    "$work"/src/kernels/cuda/paged_attention_mma.cu* "$work/src/kernels/cuda/attention_common.cuh"
fi
ptx_compile "$work" kernels/cuda/attention/paged_attention_mma.cu -O2
# Kernel names carry the template arguments: KvDType (0 fp32 ... 5 int4) and head_dim.
awk -v res="$work/resources.txt" '
  BEGIN {
    split("fp32 fp16 bf16 fp8 int8 int4", names, " ")
    while ((getline line < res) > 0) { split(line, f, " "); regs[f[1]] = f[2]; spills[f[1]] = f[3] }
    printf "%-6s %-5s %-4s %8s %6s %7s %5s %5s\n", "format", "hd", "pf_k", "ptx_ins", "regs",
      "spills", "loop", "step"
  }
  function flush() {
    if (name ~ /PagedAttentionMma/) {
      match(name, /KvDTypeE[0-9]E/); dt = names[substr(name, RSTART + 8, 1) + 1]
      match(name, /ELi[0-9]+E/); hd = substr(name, RSTART + 3, RLENGTH - 4)
      pf = match(name, /ELb[01]E/) ? substr(name, RSTART + 3, 1) : "-"
      steps = pf == "1" ? 2 : 1  # the K-prefetching loop holds two steps
      printf "%-6s %-5s %-4s %8d %6s %7s %5d %5d\n", dt, hd, pf, count, regs[name], spills[name],
        loop / steps, (loop - skipped) / steps
    }
  }
  /^\.visible \.entry|^\.entry/ {
    flush(); name = $NF; sub(/\(.*/, "", name)
    count = 0; loop = 0; skipped = 0; skip_to = ""; after_vote = 0; delete label_at
    next
  }
  { sub(/^[ \t{]+/, "") }
  /^\$L__BB[0-9_]+:$/ {
    label = $0; sub(/:$/, "", label); label_at[label] = count
    if (label == skip_to) { skipped += count - skip_from; skip_to = "" }
    next
  }
  /^[a-z@][^:]*;$/ && $0 !~ /^\/\// {
    count++
    if ($0 ~ /^vote\./) after_vote = 1
    if (after_vote && match($0, /bra(\.uni)?[ \t]+\$L__BB[0-9_]+;/)) {  # over the voted block
      skip_to = substr($0, RSTART, RLENGTH); sub(/.*[ \t]/, "", skip_to); sub(/;/, "", skip_to)
      skip_from = count; after_vote = 0
    }
    if (!loop && match($0, /bra(\.uni)?[ \t]+\$L__BB[0-9_]+;/)) {  # the first backward branch
      target = substr($0, RSTART, RLENGTH); sub(/.*[ \t]/, "", target); sub(/;/, "", target)
      if (target in label_at) loop = count - label_at[target]
    }
  }
  END { flush() }
' "$work/k.ptx"
