#!/usr/bin/env python3
"""PyTorch reference for MLA decode over a paged latent cache: gather each sequence's pages (or its DSA
selection's rows), cast them to bf16, multiply. The shapes of bench/mla_decode_bench.cpp; prints the time
per call (CUDA events, after warm-up) to compare with that table on the same GPU.

    python3 tools/bench/mla_decode_torch.py [--quick]
"""
import argparse

import torch

DIM, LAT, PAGE = 576, 512, 64


def make(heads, batch, ctx, fp8, topk, gen):
    dev = "cuda"
    pages_per_seq = (ctx + PAGE - 1) // PAGE
    pool_pages = batch * pages_per_seq
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    pool = (torch.randn(pool_pages, PAGE, DIM, device=dev, generator=gen) * 0.5).to(dtype)
    table = torch.randperm(pool_pages, device=dev, generator=gen).view(batch, pages_per_seq).int()
    q = torch.randn(batch, heads, DIM, device=dev, generator=gen, dtype=torch.bfloat16)
    sel = None
    if topk:
        sel = torch.stack([torch.randperm(ctx, device=dev, generator=gen)[:topk].sort().values for _ in range(batch)])
    return pool, table, q, sel


def attend(pool, table, q, sel, ctx, scale, kv_scale):
    batch, heads, _ = q.shape
    if sel is None:
        kv = pool[table.long()].reshape(batch, -1, DIM)[:, :ctx]  # gather pages: [batch, ctx, 576]
    else:
        pages = torch.gather(table.long(), 1, sel // PAGE)  # [batch, topk]
        kv = pool[pages, sel % PAGE]  # gather rows: [batch, topk, 576]
    kv = kv.to(torch.bfloat16) * kv_scale
    s = torch.matmul(q, kv.transpose(1, 2)).float() * scale  # [batch, heads, keys]
    p = torch.softmax(s, dim=-1).to(torch.bfloat16)
    return torch.matmul(p, kv[:, :, :LAT]).float()  # [batch, heads, 512]


def time_us(fn, iters=10):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the four headline shapes only")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(11)
    shapes = []
    if args.quick:
        shapes = [(64, 32, 4096, True, 0), (64, 1, 32768, True, 0), (8, 64, 4096, True, 0), (64, 32, 32768, True, 2048)]
    else:
        for fp8 in (True, False):
            for heads in (8, 16, 64, 128):
                for batch in (1, 32, 64):
                    for ctx in (4096, 32768):
                        shapes.append((heads, batch, ctx, fp8, 0))
        for fp8 in (True, False):
            for heads in (8, 16, 64, 128):
                for batch in (1, 8, 32, 64):
                    shapes.append((heads, batch, 32768, fp8, 2048))
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'shape':26s} {'time us':>10s}")
    for heads, batch, ctx, fp8, topk in shapes:
        name = f"h{heads} b{batch} {ctx // 1024}k {'fp8' if fp8 else 'bf16'}" + (f" dsa{topk}" if topk else "")
        try:
            pool, table, q, sel = make(heads, batch, ctx, fp8, topk, gen)
            t = time_us(lambda: attend(pool, table, q, sel, ctx, 0.0625, 1.0))
            print(f"{name:26s} {t:10.1f}", flush=True)
        except torch.OutOfMemoryError:
            print(f"{name:26s} {'oom':>10s}", flush=True)
        del pool, table, q, sel
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
