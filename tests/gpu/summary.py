"""Merges the decode benchmark (kvserve's SIMT kernel, and its tensor-core kernel when given)
and the SDPA reference into the summary table that tests/gpu/run.sh prints last.

    python3 tests/gpu/summary.py BENCH.json SDPA.json [BENCH_TC.json]
"""
import json
import sys


def main():
    bench = json.load(open(sys.argv[1]))
    try:
        sdpa = {(r["batch"], r["context"]): r for r in json.load(open(sys.argv[2]))["rows"]}
    except (OSError, ValueError):
        sdpa = {}
    try:
        tc = {(r["format"], r["batch"], r["context"], r["block_size"], r.get("query", 1)): r
              for r in json.load(open(sys.argv[3]))["rows"] if r.get("blocks_per_sm", 0) == 0}
    except (IndexError, OSError, ValueError):
        tc = {}
    prefill = [r for r in bench["rows"] if r.get("query", 1) > 1]
    rows = [r for r in bench["rows"]
            if r.get("blocks_per_sm", 0) == 0 and r.get("query", 1) == 1]
    bf16 = {(r["batch"], r["context"]): r for r in rows
            if r["format"] == "bf16" and r["block_size"] == 16}
    print(f"decode attention, 32 q / 8 kv heads, head_dim 128; copy bandwidth "
          f"{bench['copy_gbps']:.0f} GB/s (read + write)")
    print(f"{'format':6} {'batch':>5} {'ctx':>6} {'bs':>3} {'us':>9} {'GB/s':>6} {'%copy':>6} "
          f"{'x_bf16':>6} {'sdpa_us':>9} {'x_sdpa':>6} {'tc_us':>9} {'tc%copy':>7} {'tc_x':>5}")
    for r in rows:
        key = (r["batch"], r["context"])
        ref = bf16.get(key)
        vs_bf16 = ref["us"] / r["us"] if ref else float("nan")
        s = sdpa.get(key, {})
        t = tc.get((r["format"], r["batch"], r["context"], r["block_size"], 1))
        sdpa_us = s.get("us")
        vs_sdpa = sdpa_us / r["us"] if sdpa_us else float("nan")
        print(f"{r['format']:6} {r['batch']:5d} {r['context']:6d} {r['block_size']:3d} "
              f"{r['us']:9.1f} {r['gbps']:6.0f} {100 * r['fraction']:5.1f}% {vs_bf16:6.2f} "
              f"{sdpa_us if sdpa_us else float('nan'):9.1f} {vs_sdpa:6.2f} "
              f"{t['us'] if t else float('nan'):9.1f} "
              f"{100 * t['fraction'] if t else float('nan'):6.1f}% "
              f"{r['us'] / t['us'] if t else float('nan'):5.2f}")
    if prefill:
        print("prefill chunks (query tokens over a cached prefix): SIMT vs tensor cores")
        print(f"{'format':6} {'batch':>5} {'query':>5} {'ctx':>6} {'us':>9} {'tc_us':>9} {'tc_x':>5}")
    for r in prefill:
        t = tc.get((r["format"], r["batch"], r["context"], r["block_size"], r["query"]))
        print(f"{r['format']:6} {r['batch']:5d} {r['query']:5d} {r['context']:6d} {r['us']:9.1f} "
              f"{t['us'] if t else float('nan'):9.1f} "
              f"{r['us'] / t['us'] if t else float('nan'):5.2f}")


if __name__ == "__main__":
    main()
