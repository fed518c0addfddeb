#!/usr/bin/env bash
# shellcheck disable=SC2054  # the commas are kvserve-bench's value lists, not array separators
# Runs every GPU check on a lent GPU machine from binaries built elsewhere (nothing heavy is
# built there) and prints a summary table last. Build and bundle on the development machine:
#
#   bash tests/gpu/prepare.sh          # → build-gpu/carry/{bin,libs}, carry.tar.xz
#
# then on the GPU machine (carry build-gpu/carry.tar.xz):
#
#   tar -C build-gpu -xJf build-gpu/carry.tar.xz
#   export LD_LIBRARY_PATH=$PWD/build-gpu/carry/libs:/usr/local/cuda/lib64
#   bash tests/gpu/run.sh build-gpu/carry [--quick]
#
# The whole script keeps within KVSERVE_GPU_BUDGET_S seconds (default 480, under a lent run's
# 540-second limit): each check's timeout is cut to the time left, a check that finds no time
# is listed as "no time", and the summaries always print. Benchmarks print and save each row
# as they measure it, so a check cut short still reports what it measured.
#
# Checks: the CUDA backend's conformance with the CPU backend (every op, every KV format),
# the tensor-core instructions against PTX's fragment layouts, the NCCL communicator with one rank, the engine on the GPU against transformers' fixtures,
# CUDA graphs (backend replays, decode graphs in the engine), GPU sampling against the CPU twin
# (time and token equality), the KV transfer's ends (pageable, pinned staging, device copy);
# then the whole engine on a Llama 3.1 8B-shaped model (issue 61's figures, first of the
# benchmarks), the decode-attention benchmark (SIMT, tensor-core and pipelined kernels) and
# PyTorch SDPA on the same shapes, and the engine on a Llama 3.2 1B-shaped model. Outputs land
# in $OUT (or /tmp) as well.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
build=${1:-build-gpu/carry}
quick=${2:-}
out=${OUT:-/tmp}
export KVSERVE_SOURCE_DIR=$PWD
export KVSERVE_FIXTURES=${KVSERVE_FIXTURES:-$PWD/tests/fixtures/models}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
# The GPU's dense bf16 peak (TFLOPS, NVIDIA's datasheets), for the prefill's share of it; 0 when
# the name is not one of these.
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case $gpu_name in
  *H100*PCIe*) peak_tflops=756 ;;
  *H100*NVL*) peak_tflops=835 ;;
  *H100* | *H200*) peak_tflops=989 ;;
  *) peak_tflops=0 ;;
esac
results=()
deadline=$((SECONDS + ${KVSERVE_GPU_BUDGET_S:-480} - 20))  # 20 s kept for the summaries
run_check() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local start r rc elapsed_ms cut=0 left=$((deadline - SECONDS))
  if ((left < 5)); then results+=("$name|no time"); return; fi
  ((limit > left)) && limit=$left cut=1
  start=$(date +%s%N)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    grep -q "SKIPPED \]" "$out/$name.log" && r=skipped || r=passed
  else
    # 124: timed out; "budget" when the script's budget, not the check's own limit, cut it.
    r=FAILED
    ((rc == 124)) && r=TIMEOUT && ((cut)) && r=budget
    tail -n 40 "$out/$name.log"
  fi
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  results+=("$name|$r|$((elapsed_ms / 1000)).$(( (elapsed_ms % 1000) / 100 ))s")
}
run_check cuda_backend_test 180 "$build/bin/cuda_backend_test" \
  --gtest_filter=-*TensorCore*:*Graph*:*Pipelined*
# The tensor-core kernel's mma.sync / movmatrix against PTX's documented layouts: if the
# attention test below fails, this says whether the fragment layouts are why.
run_check mma_probe_test 60 "$build/bin/mma_probe_test"
grep -hE "^\[ +(OK|FAILED|SKIPPED) +\]|lane [0-9]+" "$out/mma_probe_test.log" | head -12
# The tensor-core attention test runs in its own process: a fault there (it has not run on a
# GPU before) must not take the other conformance tests down with the CUDA context.
run_check cuda_backend_test_tc 180 "$build/bin/cuda_backend_test" --gtest_filter=*TensorCore*
# The same for the pipelined decode kernel (cp.async, ldmatrix, over 48 KiB of shared memory).
run_check cuda_backend_test_pl 120 "$build/bin/cuda_backend_test" --gtest_filter=*Pipelined*
if [[ -x $build/bin/nccl_communicator_test ]]; then
  run_check nccl_communicator_test 180 "$build/bin/nccl_communicator_test"
else results+=("nccl_communicator_test|missing"); fi
# The KV link between two workers' GPUs: with one GPU only its refusals run (NCCL refuses two
# ranks on one GPU; the moves need two, which the emulated build has).
run_check nccl_peer_link_test 60 "$build/bin/nccl_peer_link_test"
run_check engine_cuda_test 180 "$build/bin/engine_cuda_test" --gtest_filter=-*Graph*:*Pipelined*
run_check engine_cuda_test_pl 60 "$build/bin/engine_cuda_test" --gtest_filter=*Pipelined*
# KV blocks out of one engine's device pools and into another's through pinned staging (issue
# 44; the link cases need the emulator's two engines on one GPU, and are not built here).
run_check engine_cuda_transfer_test 90 "$build/bin/engine_cuda_transfer_test"
# CUDA graphs (stream capture, replays, decode graphs in the engine), which have not run on a
# GPU before: in their own processes, so that a fault there takes nothing else down.
run_check cuda_backend_test_graphs 60 "$build/bin/cuda_backend_test" --gtest_filter=*Graph*
run_check engine_cuda_test_graphs 120 "$build/bin/engine_cuda_test" --gtest_filter=*Graph*
grep -hE "^\[ +(OK|FAILED|SKIPPED) +\]" "$out/cuda_backend_test.log" "$out/cuda_backend_test_tc.log" \
  "$out/cuda_backend_test_pl.log" \
  "$out/engine_cuda_test.log" "$out/engine_cuda_test_pl.log" "$out/engine_cuda_transfer_test.log" \
  "$out/cuda_backend_test_graphs.log" "$out/engine_cuda_test_graphs.log" 2>/dev/null
# Issue 61 first, right after the conformance tests (the budget cuts what comes last): the
# engine on a random-weight model of Llama 3.1 8B's shape (16 GB of bf16 weights, made here),
# where weights dominate a decode step and the roofline is what users compare: eager and CUDA graphs, async scheduling off and on, one engine each. Its rows print
# the host's side of each step by phase (the null device's figures are in docs/PERF.md). Tensor-core attention once it passed conformance above (its prefills read
# 8x less than SIMT's; a 1K prompt on SIMT reads ~17 GB at this shape), else batch 1 only.
model8b=/tmp/kvserve-llama-8b
if [[ " ${results[*]} " == *" cuda_backend_test_tc|passed|"* ]]; then
  shapes8b=(--attention-kernel tensor-cores --batches 1,32,64 --contexts 1024)
  ops8b=(--attention-kernel tensor-cores --batches 1,32 --contexts 1024)
  gemv8b=(--attention-kernel tensor-cores --batches 1,8 --contexts 1024)
else
  shapes8b=(--batches 1 --contexts 1024) ops8b=(--batches 1 --contexts 1024)
  gemv8b=(--batches 1 --contexts 1024)
fi
run_check make_model_8b 150 "$build/bin/kvserve-make-model" --vocab-size 128256 \
  --hidden-size 4096 --num-layers 32 --num-heads 32 --num-kv-heads 8 --intermediate-size 14336 \
  --out "$model8b"
run_check engine_8b 240 "$build/bin/kvserve-bench" engine --model "$model8b" --device cuda \
  "${shapes8b[@]}" --decode-steps 16 --cuda-graph-max-batch 0,64 --async off,on \
  --json-out "$out/engine_8b_bench.json"
cat "$out/engine_8b.log" 2>/dev/null
# Where a step's time goes, kernel by kernel (CUDA events around each op, so apart from the
# timed rows above): eager, async off, batch 1 and 32 (batch 1 on SIMT).
run_check engine_8b_ops 120 "$build/bin/kvserve-bench" engine --model "$model8b" --device cuda \
  "${ops8b[@]}" --decode-steps 8 --async off --op-times --json-out "$out/engine_8b_ops.json"
grep -A16 "device us per decode step by op" "$out/engine_8b_ops.log" 2>/dev/null
# The fused decode projections (--decode-gemv-max-batch: the norms and the SiLU-mul inside
# matrix-vector kernels, 6 launches a layer instead of 9) against cuBLAS, with graphs and async
# scheduling as served: one engine each, side by side.
run_check engine_8b_gemv 150 "$build/bin/kvserve-bench" engine --model "$model8b" --device cuda \
  "${gemv8b[@]}" --decode-steps 16 --cuda-graph-max-batch 64 --async on \
  --decode-gemv-max-batch 0,8 --json-out "$out/engine_8b_gemv.json"
cat "$out/engine_8b_gemv.log" 2>/dev/null
cp "$model8b/config.json" "$out/engine_8b_config.json" 2>/dev/null
rm -rf "$model8b"
# Issue 61's rows (engine_8b.json, for docs/gpu-runs/<date>/): ms per step against the roofline,
# and the prefill (8K-token chunks) against the dense bf16 peak.
[[ -f $out/engine_8b_bench.json ]] &&
  python3 tests/gpu/engine_8b.py "$out/engine_8b_bench.json" "$out/engine_8b.json" \
    --config "$out/engine_8b_config.json" --peak-tflops "$peak_tflops"
[[ -f $out/engine_8b_gemv.json ]] &&
  python3 tests/gpu/engine_8b.py "$out/engine_8b_gemv.json" "$out/engine_8b_gemv_rows.json" \
    --config "$out/engine_8b_config.json" --peak-tflops "$peak_tflops"
run_check sampling_bench 120 "$build/bin/sampling_bench" $quick
cat "$out/sampling_bench.log" 2>/dev/null
run_check decode_attention_bench 240 "$build/bin/decode_attention_bench" --json "$out/bench.json" $quick
cat "$out/decode_attention_bench.log" 2>/dev/null
# The pipelined decode kernel right after SIMT, before the budget runs short: issue 29's goals.
run_check decode_attention_bench_pl 240 "$build/bin/decode_attention_bench" --pipelined \
  --json "$out/bench_pl.json" $quick
run_check decode_attention_bench_tc 240 "$build/bin/decode_attention_bench" --tensor-cores \
  --json "$out/bench_tc.json" $quick
run_check decode_attention_bench_pf 240 "$build/bin/decode_attention_bench" --prefetch-k \
  --json "$out/bench_pf.json" $quick
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  run_check sdpa_bench 180 python3 tests/gpu/sdpa_bench.py "$out/sdpa.json" $quick
else
  results+=("sdpa_bench|no torch")
fi
# KV blocks out of and into the device pool (issue 44): today's pageable per-range copies,
# pinned staging (one gather into pinned memory), and a same-process device copy (what NCCL
# between two GPUs would approach; one GPU cannot hold two NCCL ranks).
run_check kv_staging_bench 90 "$build/bin/kv_staging_bench" --device cuda --blocks 64 --reps 5
cat "$out/kv_staging_bench.log" 2>/dev/null
# The whole engine (GEMMs, attention, sampling, host work) on a random-weight model of Llama 3.2
# 1B's shape, bf16 weights: prefill and decode throughput per KV cache dtype, and how close a
# decode step comes to reading its weights and KV at copy bandwidth.
# The prefills that fill the caches bound the shapes: the SIMT kernel serves 8 rows (2 tokens
# of a 4-head group) per thread block, each reading the context up to its tokens: about C²/4
# KV rows per KV head and layer for a C-token prompt (8.6 GB of reads for one 1K prompt here,
# 34 GB for 2K); the tensor-core kernel serves 64 rows (16 tokens), 8x fewer reads.
model=/tmp/kvserve-llama-1b
if [[ -n $quick ]]; then engine_shapes=(--batches 1,4 --contexts 512); else
  engine_shapes=(--batches 1,16 --contexts 1024); fi
run_check make_model 120 "$build/bin/kvserve-make-model" --vocab-size 128256 --hidden-size 2048 \
  --num-layers 16 --num-heads 32 --num-kv-heads 8 --intermediate-size 8192 --out "$model"
run_check engine_bench 240 "$build/bin/kvserve-bench" engine --model "$model" --device cuda \
  --kv-cache-dtypes auto,int8,int4 "${engine_shapes[@]}" --decode-steps 16 \
  --json-out "$out/engine_bench.json"
cat "$out/engine_bench.log" 2>/dev/null
# The 1B step by kernel (its ~120 us per layer against 13-35 us of attention, 2026-12-04).
run_check engine_bench_ops 120 "$build/bin/kvserve-bench" engine --model "$model" --device cuda \
  --batches 1,16 --contexts 1024 --decode-steps 8 --async off --op-times \
  --decode-gemv-max-batch 0,8 \
  --json-out "$out/engine_bench_ops.json"
grep -A16 "device us per decode step by op" "$out/engine_bench_ops.log" 2>/dev/null
# Decode with CUDA graphs against eager launches, side by side (one engine each): short prompts,
# so that the prefills are cheap, and batches where a step's kernels are short enough for
# launches to matter. The start_s column's difference is the graphs' recording at start-up.
run_check engine_bench_graphs 150 "$build/bin/kvserve-bench" engine --model "$model" \
  --device cuda --kv-cache-dtypes auto,int4 --batches 1,16 --contexts 256 --decode-steps 32 \
  --cuda-graph-max-batch 0,16 --json-out "$out/engine_bench_graphs.json"
cat "$out/engine_bench_graphs.log" 2>/dev/null
# The same on tensor cores, once they have passed conformance above.
if [[ " ${results[*]} " == *" cuda_backend_test_tc|passed|"* ]]; then
  run_check engine_bench_tc 180 "$build/bin/kvserve-bench" engine --model "$model" --device cuda \
    --attention-kernel tensor-cores --kv-cache-dtypes auto,int4 --batches 1,64 --contexts 1024 \
    --decode-steps 16 --json-out "$out/engine_bench_tc.json"
  cat "$out/engine_bench_tc.log" 2>/dev/null
fi
rm -rf "$model"
# A profile of one configuration when Nsight Compute is on the machine.
if command -v ncu >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/ncu ]]; then
  ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for profile in "ncu_profile PagedAttentionKernel" \
    "ncu_profile_tc PagedAttentionMmaKernel --tensor-cores" \
    "ncu_profile_pf PagedAttentionMmaKernel --prefetch-k" \
    "ncu_profile_pl PagedAttentionPipelinedKernel --pipelined"; do
    read -r name kernel flags <<<"$profile"
    run_check "$name" 120 "$ncu_bin" --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section LaunchStats -k "regex:$kernel" -c 1 \
      "$build/bin/decode_attention_bench" $flags --only bf16:64:4096
    grep -E "Throughput|Occupancy|Registers|Warp Cycles|Stall|Duration|Block Limit" \
      "$out/$name.log" 2>/dev/null | head -40
  done
else
  results+=("ncu_profile|no ncu")
fi
echo
# The engine's bf16-weight fidelity, pool sizing and tensor-core vs SIMT logits, as
# engine_cuda_test printed them.
grep -hE "weights on the GPU|^pool:|tensor cores vs SIMT|pipelined vs tensor cores|replayed a graph|recorded at start-up|allocated while serving|CUDA graphs " \
  "$out/engine_cuda_test.log" "$out/engine_cuda_test_pl.log" "$out/engine_cuda_test_graphs.log" \
  2>/dev/null | cut -c1-240
printf '%-32s %-8s %s\n' check result time
for row in "${results[@]}"; do IFS='|' read -r name r t <<<"$row"; printf '%-32s %-8s %s\n' "$name" "$r" "${t:-}"; done
echo
[[ -f $out/bench.json ]] && python3 tests/gpu/summary.py "$out/bench.json" "$out/sdpa.json" \
  "$out/bench_tc.json" "$out/bench_pf.json" "$out/bench_pl.json"
echo
[[ -f $out/engine_bench.json ]] && python3 tests/gpu/engine_summary.py "$out/engine_bench.json" \
  "$out/engine_bench_tc.json" "$out/engine_bench_graphs.json"
