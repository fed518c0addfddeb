"""Merges the decode benchmark (kvserve's SIMT kernel, and its tensor-core kernel, plain and
with K prefetched, and the pipelined decode kernel, when given) and the SDPA reference into the
summary table that tests/gpu/run.sh prints last, then checks the issues' bandwidth goals for
each kernel (issue 8's for all, issue 29's for the pipelined one).

    python3 tests/gpu/summary.py BENCH.json SDPA.json [BENCH_TC.json [BENCH_PF.json
                                 [BENCH_PL.json]]]
"""
import json
import sys


def main():
    bench = json.load(open(sys.argv[1]))
    try:
        sdpa = {(r["batch"], r["context"]): r for r in json.load(open(sys.argv[2]))["rows"]}
    except (OSError, ValueError):
        sdpa = {}
    tc = load_kernel_rows(3)
    pf = load_kernel_rows(4)
    pl = load_kernel_rows(5)
    prefill = [r for r in bench["rows"] if r.get("query", 1) > 1]
    rows = [r for r in bench["rows"]
            if r.get("blocks_per_sm", 0) == 0 and r.get("query", 1) == 1]
    bf16 = {(r["batch"], r["context"]): r for r in rows
            if r["format"] == "bf16" and r["block_size"] == 16}
    print(f"decode attention, 32 q / 8 kv heads, head_dim 128; copy bandwidth "
          f"{bench['copy_gbps']:.0f} GB/s (read + write)")
    print(f"{'format':6} {'batch':>5} {'ctx':>6} {'bs':>3} {'us':>9} {'GB/s':>6} {'%copy':>6} "
          f"{'x_bf16':>6} {'sdpa_us':>9} {'x_sdpa':>6} {'tc_us':>9} {'tc%copy':>7} {'tc_x':>5} "
          f"{'pf_us':>9} {'pf%copy':>7} {'pl_us':>9} {'pl%copy':>7} {'pl_x':>5}")
    for r in rows:
        key = (r["batch"], r["context"])
        ref = bf16.get(key)
        vs_bf16 = ref["us"] / r["us"] if ref else float("nan")
        s = sdpa.get(key, {})
        t = tc.get((r["format"], r["batch"], r["context"], r["block_size"], 1))
        f = pf.get((r["format"], r["batch"], r["context"], r["block_size"], 1))
        p = pl.get((r["format"], r["batch"], r["context"], r["block_size"], 1))
        sdpa_us = s.get("us")
        vs_sdpa = sdpa_us / r["us"] if sdpa_us else float("nan")
        print(f"{r['format']:6} {r['batch']:5d} {r['context']:6d} {r['block_size']:3d} "
              f"{r['us']:9.1f} {r['gbps']:6.0f} {100 * r['fraction']:5.1f}% {vs_bf16:6.2f} "
              f"{sdpa_us if sdpa_us else float('nan'):9.1f} {vs_sdpa:6.2f} "
              f"{t['us'] if t else float('nan'):9.1f} "
              f"{100 * t['fraction'] if t else float('nan'):6.1f}% "
              f"{r['us'] / t['us'] if t else float('nan'):5.2f} "
              f"{f['us'] if f else float('nan'):9.1f} "
              f"{100 * f['fraction'] if f else float('nan'):6.1f}% "
              f"{p['us'] if p else float('nan'):9.1f} "
              f"{100 * p['fraction'] if p else float('nan'):6.1f}% "
              f"{r['us'] / p['us'] if p else float('nan'):5.2f}")
    if prefill:
        print("prefill chunks (query tokens over a cached prefix): SIMT vs tensor cores")
        print(f"{'format':6} {'batch':>5} {'query':>5} {'ctx':>6} {'us':>9} {'tc_us':>9} {'tc_x':>5}")
    for r in prefill:
        t = tc.get((r["format"], r["batch"], r["context"], r["block_size"], r["query"]))
        print(f"{r['format']:6} {r['batch']:5d} {r['query']:5d} {r['context']:6d} {r['us']:9.1f} "
              f"{t['us'] if t else float('nan'):9.1f} "
              f"{r['us'] / t['us'] if t else float('nan'):5.2f}")
    print_goals(bench["rows"], tc, pf, sdpa)
    if pl:
        print_pipelined_goals(list(pl.values()), sdpa)


def load_kernel_rows(arg):
    """The default-split rows of the benchmark JSON in argv[arg], by (format, batch, context,
    block size, query tokens); empty when not given or unreadable."""
    try:
        return {(r["format"], r["batch"], r["context"], r["block_size"], r.get("query", 1)): r
                for r in json.load(open(sys.argv[arg]))["rows"] if r.get("blocks_per_sm", 0) == 0}
    except (IndexError, OSError, ValueError):
        return {}


def goal_rows(rows, name):
    """The issue's goals for one kernel's decode rows (block 16 unless noted): measured
    value, target, met."""
    dec = {(r["format"], r["batch"], r["context"], r["block_size"]): r for r in rows
           if r.get("query", 1) == 1 and r.get("blocks_per_sm", 0) == 0}

    def frac(fmt, pred):
        v = [100 * r["fraction"] for (f, b, c, bs), r in dec.items() if f == fmt and bs == 16
             and pred(b, c)]
        return min(v) if v else None

    def speedup(fmt, pred):
        v = [dec[("bf16", b, c, 16)]["us"] / r["us"] for (f, b, c, bs), r in dec.items()
             if f == fmt and bs == 16 and pred(b, c) and ("bf16", b, c, 16) in dec]
        return min(v) if v else None

    big = lambda b, c: b >= 16 and c >= 4096  # noqa: E731
    huge = lambda b, c: b >= 64 and c >= 4096  # noqa: E731
    out = [(f"{name}: bf16 %copy, batch >= 16, ctx >= 4K (min)", frac("bf16", big), 85, ">="),
           (f"{name}: bf16 %copy, GQA 4:1 at 64 x 4K", frac("bf16", lambda b, c: (b, c) ==
                                                          (64, 4096)), 80, ">="),
           (f"{name}: bf16 %copy, 1 x 64K (split-KV)", frac("bf16", lambda b, c: (b, c) ==
                                                          (1, 65536)), 80, ">="),
           (f"{name}: int8 speed / bf16, >= 64 x 4K (min)", speedup("int8", huge), 1.6, ">="),
           (f"{name}: fp8 speed / bf16, >= 64 x 4K (min)", speedup("fp8", huge), 1.6, ">="),
           (f"{name}: int4 speed / bf16, >= 64 x 4K (min)", speedup("int4", huge), 2.5, ">=")]
    spreads = []
    for b, c in {(b, c) for (f, b, c, bs) in dec if f == "bf16" and bs != 16}:
        us = [dec[k]["us"] for k in dec if k[0] == "bf16" and k[1:3] == (b, c)]
        spreads.append(100 * (max(us) / min(us) - 1))
    out.append((f"{name}: page sizes 8-32, spread %", max(spreads) if spreads else None, 5, "<="))
    return out


def print_goals(rows, tc, pf, sdpa):
    goals = goal_rows(rows, "SIMT")
    if tc:
        goals += goal_rows(list(tc.values()), "tensor cores")
    if pf:
        goals += goal_rows(list(pf.values()), "tc, K prefetched")
    for name, r in (("SIMT", rows), ("tensor cores", list(tc.values())),
                    ("tc, K prefetched", list(pf.values()))):
        v = [s["us"] / r0["us"] for r0 in r for key, s in sdpa.items()
             if r0["format"] == "bf16" and r0.get("query", 1) == 1 and r0["block_size"] == 16
             and r0.get("blocks_per_sm", 0) == 0 and (r0["batch"], r0["context"]) == key
             and key[0] >= 16 and key[1] >= 4096]
        if v:
            goals.append((f"{name}: speed / SDPA (bf16), >= 16 x 4K (min)", min(v), 1.0, ">"))
    print("goals (issue 8)")
    print(f"{'goal':60} {'measured':>9} {'target':>7} met")
    for name, value, target, op in goals:
        if value is None:
            print(f"{name:60} {'-':>9} {op}{target:<6} -")
            continue
        met = value >= target if op == ">=" else value > target if op == ">" else value <= target
        print(f"{name:60} {value:9.2f} {op}{target:<6} {'yes' if met else 'no'}")


def print_pipelined_goals(rows, sdpa):
    """Issue 29's goals for the pipelined decode kernel (block 16, default split)."""
    dec = {(r["format"], r["batch"], r["context"]): r for r in rows
           if r.get("query", 1) == 1 and r["block_size"] == 16}
    big = [(b, c) for (f, b, c) in dec if f == "bf16" and b >= 16 and c >= 4096]

    def least(values):
        values = [v for v in values if v is not None]
        return min(values) if values else None

    def speedup(fmt):
        return least([dec[("bf16", b, c)]["us"] / dec[(fmt, b, c)]["us"] for b, c in big
                      if (fmt, b, c) in dec])

    goals = [
        ("pipelined: bf16 %copy, >= 16 x 4K (min)",
         least([100 * dec[("bf16", b, c)]["fraction"] for b, c in big]), 90),
        ("pipelined: bf16 % of SDPA speed, >= 16 x 4K (min)",
         least([100 * sdpa[k]["us"] / dec[("bf16",) + k]["us"] for k in big if k in sdpa]), 95),
        ("pipelined: bf16 %copy, 1 x 64K",
         100 * dec[("bf16", 1, 65536)]["fraction"] if ("bf16", 1, 65536) in dec else None, 80),
        ("pipelined: int8 speed / its bf16, >= 16 x 4K (min)", speedup("int8"), 1.8),
        ("pipelined: fp8 speed / its bf16, >= 16 x 4K (min)", speedup("fp8"), 1.8),
        ("pipelined: int4 speed / its bf16, >= 16 x 4K (min)", speedup("int4"), 3.0),
    ]
    print("goals (issue 29)")
    print(f"{'goal':60} {'measured':>9} {'target':>7} met")
    for name, value, target in goals:
        if value is None:
            print(f"{name:60} {'-':>9} >={target:<5} -")
        else:
            print(f"{name:60} {value:9.2f} >={target:<5} {'yes' if value >= target else 'no'}")


if __name__ == "__main__":
    main()
