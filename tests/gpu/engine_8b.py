"""The 8B-shaped engine run in issue 61's row format: reads kvserve-bench engine's JSON report
(--json-out) and writes one row per engine and shape,
{batch, context, kv_dtype, graphs, async, gemv, ms_per_step, roofline_ms, of_roofline,
host_us, prefill_tokens_per_s, prefill_tflops, of_peak} (gemv: the engine's
--decode-gemv-max-batch, 0 for cuBLAS), where roofline_ms is the step's bytes (weights but the
embedding table, plus the KV read) over the copy bandwidth measured in the same run, and
prefill_tflops the prefill's rate in dense FLOPs (from the model's config.json: the layers'
projections, 2 per weight and token, and attention's QK and PV over the prompt's causal
half; the LM head, which a prefill runs for one row per prompt, is left out) against
--peak-tflops (the GPU's dense bf16 peak; of_peak is 0 without it). Prints them as a table.

    python3 tests/gpu/engine_8b.py ENGINE_8B_BENCH.json OUT.json [--config CONFIG.json]
        [--peak-tflops T]
"""
import argparse
import json
import sys


def prefill_flops_per_token(config, context):
    """Dense FLOPs per prompt token of a Llama-family model over a prompt of `context` tokens."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim", hidden // heads)
    inter = config["intermediate_size"]
    layers = config["num_hidden_layers"]
    q, kv = heads * head_dim, kv_heads * head_dim
    weights = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter
    # QK and PV: 2 FLOPs each per query row, key and channel; a token attends to half the
    # prompt on average.
    attention = 2 * 2 * q * context / 2
    return layers * (2 * weights + attention)


def rows(report, config, peak_tflops):
    gbps = report["copy_gbps"]
    for r in report["rows"]:
        roofline_ms = 1e3 * r["step_bytes"] / (gbps * 1e9) if gbps > 0 else 0.0
        prefill = r.get("prefill_tokens_per_s", 0.0)
        tflops = prefill * prefill_flops_per_token(config, r["context"]) / 1e12 if config else 0.0
        yield {
            "batch": r["batch"],
            "context": r["context"],
            "kv_dtype": r["kv_cache_dtype"],
            "graphs": r.get("cuda_graph_max_batch", 0) > 0,
            "async": r.get("async_scheduling", False),
            "gemv": r.get("decode_gemv_max_batch", 0),
            "ms_per_step": r["decode_ms_per_step"],
            "roofline_ms": roofline_ms,
            "of_roofline": r["decode_ms_per_step"] / roofline_ms if roofline_ms else 0.0,
            "host_us": r.get("host_us_per_step", 0.0),
            "prefill_tokens_per_s": prefill,
            "prefill_tflops": tflops,
            "of_peak": tflops / peak_tflops if peak_tflops > 0 else 0.0,
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report")
    parser.add_argument("out")
    parser.add_argument("--config", help="the model's config.json (for the prefill's FLOPs)")
    parser.add_argument("--peak-tflops", type=float, default=0.0,
                        help="the GPU's dense bf16 peak, TFLOPS")
    args = parser.parse_args()
    try:
        report = json.load(open(args.report))
    except (OSError, ValueError) as e:
        sys.exit(f"engine_8b: no report at {args.report}: {e}")
    config = None
    if args.config:
        try:
            config = json.load(open(args.config))
        except (OSError, ValueError) as e:
            sys.exit(f"engine_8b: no model config at {args.config}: {e}")
    out = list(rows(report, config, args.peak_tflops))
    json.dump(out, open(args.out, "w"), indent=1)
    print(f"engine, 8B shape, {report['device']}: copy {report['copy_gbps']:.0f} GB/s; "
          f"{report['weight_bytes_read'] / 2**30:.2f} GiB of weights read per decode step; "
          f"dense bf16 peak {args.peak_tflops:.0f} TFLOPS (0: not known)")
    print(f"{'kv':6} {'batch':>5} {'ctx':>6} {'graphs':>6} {'async':>5} {'gemv':>4} "
          f"{'ms/step':>8} {'roofline':>8} {'x roof':>6} {'host us':>8} {'prefill tok/s':>13} "
          f"{'TFLOPS':>7} {'of peak':>7}")
    for r in out:
        print(f"{r['kv_dtype']:6} {r['batch']:5d} {r['context']:6d} "
              f"{'on' if r['graphs'] else 'off':>6} {'on' if r['async'] else 'off':>5} "
              f"{r['gemv']:4d} "
              f"{r['ms_per_step']:8.3f} {r['roofline_ms']:8.3f} {r['of_roofline']:6.2f} "
              f"{r['host_us']:8.1f} {r['prefill_tokens_per_s']:13.0f} "
              f"{r['prefill_tflops']:7.1f} {100 * r['of_peak']:6.1f}%")


if __name__ == "__main__":
    main()
