"""The 8B-shaped engine run in issue 61's row format: reads kvserve-bench engine's JSON report
(--json-out) and writes one row per engine and shape,
{batch, context, kv_dtype, graphs, async, gemv, ms_per_step, roofline_ms, of_roofline,
host_us} (gemv: the engine's --decode-gemv-max-batch, 0 for cuBLAS),
where roofline_ms is the step's bytes (weights but the embedding table, plus the KV read)
over the copy bandwidth measured in the same run, and prints them as a table.

    python3 tests/gpu/engine_8b.py ENGINE_8B_BENCH.json OUT.json
"""
import json
import sys


def rows(report):
    gbps = report["copy_gbps"]
    for r in report["rows"]:
        roofline_ms = 1e3 * r["step_bytes"] / (gbps * 1e9) if gbps > 0 else 0.0
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
        }


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    try:
        report = json.load(open(sys.argv[1]))
    except (OSError, ValueError) as e:
        sys.exit(f"engine_8b: no report at {sys.argv[1]}: {e}")
    out = list(rows(report))
    json.dump(out, open(sys.argv[2], "w"), indent=1)
    print(f"engine, 8B shape, {report['device']}: copy {report['copy_gbps']:.0f} GB/s; "
          f"{report['weight_bytes_read'] / 2**30:.2f} GiB of weights read per decode step")
    print(f"{'kv':6} {'batch':>5} {'ctx':>6} {'graphs':>6} {'async':>5} {'gemv':>4} {'ms/step':>8} "
          f"{'roofline':>8} {'x roof':>6} {'host us':>8}")
    for r in out:
        print(f"{r['kv_dtype']:6} {r['batch']:5d} {r['context']:6d} "
              f"{'on' if r['graphs'] else 'off':>6} {'on' if r['async'] else 'off':>5} "
              f"{r['gemv']:4d} "
              f"{r['ms_per_step']:8.3f} {r['roofline_ms']:8.3f} {r['of_roofline']:6.2f} "
              f"{r['host_us']:8.1f}")


if __name__ == "__main__":
    main()
