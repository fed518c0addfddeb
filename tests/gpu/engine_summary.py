"""The engine benchmark's rows (kvserve-bench engine --json-out): SIMT attention, and when given,
tensor cores and the CUDA graphs run (eager and graph engines side by side, with the graph
engine's speedup), as the short tables tests/gpu/run.sh prints after the attention summary.

    python3 tests/gpu/engine_summary.py ENGINE.json [ENGINE_TC.json [ENGINE_GRAPHS.json]]
"""
import json
import sys


def main():
    runs = ("SIMT attention", "tensor-core attention", "SIMT attention, CUDA graphs")
    for path, kernel in zip(sys.argv[1:], runs):
        try:
            report = json.load(open(path))
        except (OSError, ValueError):
            print(f"engine ({kernel}): no report at {path}")
            continue
        print(f"engine ({kernel}), {report['device']}: copy "
              f"{report['copy_gbps']:.0f} GB/s; {report['weight_bytes_read'] / 2**20:.0f} MiB "
              f"of weights read per decode step")
        print(f"{'kv':6} {'batch':>5} {'ctx':>6} {'prefill tok/s':>13} {'ms/step':>8} "
              f"{'tok/s':>8} {'%copy':>6} {'graphs':>7} {'speedup':>7} {'start s':>7} "
              f"{'record s':>8} {'rec MiB':>7}")
        eager = {}
        for r in report["rows"]:
            key = (r["kv_cache_dtype"], r["batch"], r["context"])
            graphs = r.get("cuda_graph_max_batch", 0)
            if graphs == 0:
                eager[key] = r["decode_ms_per_step"]
            speedup = (f"{eager[key] / r['decode_ms_per_step']:6.2f}x"
                       if graphs and key in eager else "")
            print(f"{r['kv_cache_dtype']:6} {r['batch']:5d} {r['context']:6d} "
                  f"{r['prefill_tokens_per_s']:13.0f} {r['decode_ms_per_step']:8.3f} "
                  f"{r['decode_tokens_per_s']:8.0f} {100 * r['fraction_of_copy']:5.1f}% "
                  f"{r.get('graph_steps', 0) if graphs else 'off':>7} {speedup:>7} "
                  f"{r.get('start_s', 0):7.2f} {r.get('graph_record_s', 0):8.2f} "
                  f"{r.get('graph_record_mib', 0):7.1f}")


if __name__ == "__main__":
    main()
