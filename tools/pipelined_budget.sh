#!/bin/bash
# The static budget of the pipelined decode attention (kernels/cuda/attention/paged_attention_pipelined.cuh)
# per format and head_dim, without a GPU: what predicts its bandwidth on an H200.
# - regs: ptxas's registers per thread (sm_90, no spills expected: `spill` column);
# - smem: shared memory per block, stages × (K + V + their per-token parameters for a 64-token
#   tile) (mirrors PipelineShape: about 64 KiB, 3 to 8 stages);
# - blk/SM: blocks an SM holds, the least of what its 228 KiB of shared memory (1 KiB reserved
#   per block), its 64K registers (per warp in units of 256) and 16 blocks allow;
# - inflight: KiB per SM in flight while every block computes on one stage: blk/SM × (stages −
#   1) × stage bytes;
# - loop: PTX instructions of one warp's pass over its 16 tokens of a tile (the loop whose body
#   holds the mma instructions, both sides of its branches), and of those mma, ldmatrix,
#   ld.shared, cp.async, movmatrix, shfl. PTX, not SASS: this toolkit has no cuobjdump, and
#   ptxas may fuse or expand; a proxy for the GPU run to confirm;
# - ins/B: warp instructions per byte of the tile (4 warps × loop / stage bytes); an SM issues
#   4 per clock, so at 1.98 GHz over 132 SMs the issue rate alone caps the kernel at
#   `issue_TB/s` = 4 / (ins/B) × 132 × 1.98e9 — against the ~4.8 TB/s of an H200's HBM3e.
#
#   tools/pipelined_budget.sh [REV]    (the working tree without REV)
set -euo pipefail
rev=${1:-}
source "$(dirname "$0")/ptx_lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ptx_sources "$work" "$rev"
ptx_compile "$work" kernels/cuda/attention/paged_attention_pipelined.cu -O3
awk -v res="$work/resources.txt" '
  BEGIN {
    split("fp32 fp16 bf16 fp8 int8 int4", names, " ")
    while ((getline line < res) > 0) { split(line, f, " "); regs[f[1]] = f[2]; spills[f[1]] = f[3] }
    printf "%-6s %-4s %5s %6s %6s %6s %6s %8s %5s %5s %5s %4s %6s %5s %5s %6s %9s\n", "format",
      "hd", "regs", "spill", "stages", "smemKB", "blk/SM", "inflight", "loop", "mma", "ldsm",
      "lds", "cpasy", "movm", "shfl", "ins/B", "issue_TB/s"
  }
  function shape(dt, hd) {  # PipelineShape<DT, HD>
    row = dt == "int4" ? hd / 2 : (dt == "fp8" || dt == "int8") ? hd : 2 * hd
    param = dt == "int4" ? 4 : (dt == "fp8" || dt == "int8") ? 2 : 0
    stage = 2 * 64 * row + 2 * 64 * param
    stages = int(65536 / stage); if (stages < 3) stages = 3; if (stages > 8) stages = 8
    red = 4 * 8 * hd * 4
    smem = stages * stage > red ? stages * stage : red
  }
  function flush(   i, j, best, n, k, c) {
    if (name !~ /PagedAttentionPipelined/) return
    match(name, /KvDTypeE[0-9]E/); dt = names[substr(name, RSTART + 8, 1) + 1]
    match(name, /ELi[0-9]+E/); hd = substr(name, RSTART + 3, RLENGTH - 4)
    shape(dt, hd)
    # The tile loop: the backward branch whose range holds the most mma instructions.
    best = -1; lo = 0; hi = -1
    for (i = 0; i < count; i++) {
      if (!(i in target) || !(target[i] in label_at) || label_at[target[i]] > i) continue
      n = 0
      for (j = label_at[target[i]]; j <= i; j++) if (op[j] ~ /^mma/) n++
      if (n > best) { best = n; lo = label_at[target[i]]; hi = i }
    }
    delete c
    for (j = lo; j <= hi; j++) {
      k = op[j]; sub(/\..*/, "", k); if (op[j] ~ /^ld\.shared/) k = "lds"; c[k]++
    }
    loop = hi - lo + 1
    r = regs[name]; warp_regs = int((r * 32 + 255) / 256) * 256
    blocks = int(233472 / (smem + 1024)); if (blocks > 16) blocks = 16
    by_regs = int(65536 / (warp_regs * 4)); if (by_regs < blocks) blocks = by_regs
    per_byte = 4 * loop / stage
    printf "%-6s %-4s %5s %6s %6d %6.1f %6d %8.0f %5d %5d %5d %4d %6d %5d %5d %6.3f %9.1f\n", dt,
      hd, r, spills[name], stages, smem / 1024, blocks, blocks * (stages - 1) * stage / 1024,
      loop, c["mma"], c["ldmatrix"], c["lds"], c["cp"], c["movmatrix"], c["shfl"], per_byte,
      4 / per_byte * 132 * 1.98e9 / 1e12
  }
  /^\.visible \.entry|^\.entry/ {
    flush(); name = $NF; sub(/\(.*/, "", name); count = 0
    delete label_at; delete target; delete op
    next
  }
  { sub(/^[ \t{]+/, "") }
  /^\$L__BB[0-9_]+:$/ { l = $0; sub(/:$/, "", l); label_at[l] = count; next }
  /^[a-z@][^:]*;$/ && $0 !~ /^\/\// {
    line = $0; sub(/^@!?%p[0-9]+[ \t]+/, "", line)
    split(line, f, /[ \t;]+/); op[count] = f[1]
    if (f[1] ~ /^bra/ && match(line, /\$L__BB[0-9_]+/)) target[count] = substr(line, RSTART, RLENGTH)
    count++
  }
  END { flush() }
' "$work/k.ptx" | { read -r header; echo "$header"; sort -k1,1 -k2,2n; }
