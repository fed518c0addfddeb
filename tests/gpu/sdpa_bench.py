"""PyTorch scaled_dot_product_attention on the decode benchmark's shapes (contiguous bf16,
32 query / 8 KV heads via enable_gqa, head_dim 128, one query token), the outside reference
for tests/gpu/decode_attention_bench. Writes JSON rows {batch, context, us, gbps}.

    python3 tests/gpu/sdpa_bench.py OUT.json [--quick]
"""
import json
import os
import sys

import torch
import torch.nn.functional as F


def main():
    out_path = sys.argv[1]
    quick = "--quick" in sys.argv
    batches = [1, 16] if quick else [1, 16, 64, 256]
    contexts = [1024, 4096] if quick else [1024, 4096, 16384, 65536]
    heads, kv_heads, d = 32, 8, 128
    rows = []
    for b in batches:
        for ctx in contexts:
            row = {"batch": b, "context": ctx}
            try:
                q = torch.randn(b, heads, 1, d, device="cuda", dtype=torch.bfloat16)
                k = torch.empty(b, kv_heads, ctx, d, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
                v = torch.empty_like(k).uniform_(-1, 1)
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                torch.cuda.synchronize()
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                stop.record()
                torch.cuda.synchronize()
                iters = max(3, min(200, int(25.0 / max(start.elapsed_time(stop), 1e-3))))
                start.record()
                for _ in range(iters):
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                stop.record()
                torch.cuda.synchronize()
                us = 1e3 * start.elapsed_time(stop) / iters
                nbytes = 2 * k.numel() * 2 + 2 * q.numel() * 2
                row.update(us=round(us, 2), gbps=round(nbytes / (us * 1e-6) / 1e9, 1))
                del q, k, v
            except Exception as e:  # OOM or an unsupported shape: recorded, not fatal
                row["error"] = str(e).splitlines()[0][:120]
            torch.cuda.empty_cache()
            rows.append(row)
            print(row, flush=True)
            # The rows so far, replaced whole after each: a run cut short keeps what it timed.
            with open(out_path + ".partial", "w") as f:
                json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)
            os.replace(out_path + ".partial", out_path)


if __name__ == "__main__":
    main()
