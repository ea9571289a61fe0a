#!/usr/bin/env python3
"""dev/bench_attention_torch.py - PyTorch's fused causal attention, timed
exactly the way build/bench_attention times ours, as the baseline of the
project's attention performance targets (docs/DESIGN.md: our bf16 mode at
least equal to cuDNN SDPA fwd+bwd).

What is timed: torch.nn.functional.scaled_dot_product_attention(q, k, v,
is_causal=True) in BF16 under torch.nn.attention.sdpa_kernel with
SDPBackend.CUDNN_ATTENTION and with SDPBackend.FLASH_ATTENTION.
  - q, k, v, dO are contiguous [B, H, T, D] tensors (--layout contiguous,
    the default: the usual SDPA benchmark, the most favourable case for the
    fused kernels), or views of one fused qkv tensor [B, T, 3, H, D] (our
    module's layout, what a GPT block has after its QKV matmul) transposed
    to [B, H, T, D] without a copy (--layout fused). N(0,1), non-zero.
  - q, k, v are leaves of their own, so the backward is the SDPA backward
    kernel and nothing else (no gradient scatter into a fused qkv.grad);
    gradients come from torch.autograd.grad, not accumulated.
  - "fwd" is the training forward (inputs require grad, so the kernel saves
    its softmax statistics, as ours does); "bwd" is torch.autograd.grad on a
    retained graph; "fwd+bwd" is both.
  - several input sets rotated from one launch to the next, together at
    least 3x the L2 cache; warm-up, then CUDA-event timing of every launch,
    median over the repeats. The GPU is held in torch.cuda._sleep while the
    timed launches are queued, so Python/autograd launch overhead does not
    show up as GPU idle time inside a timed interval (kernel time, as in
    build/bench_attention).
  - FLOPs as FlashAttention counts them: causal forward 4*B*H*T*T*D/2,
    backward 2.5x that, forward+backward 3.5x.
--jsonl appends one JSON object per (shape, backend) in the format
scripts/bench_attention.sh merges with build/bench_attention's.
Needs PyTorch >= 2.3 with CUDA (torch.nn.attention.sdpa_kernel).
"""
import argparse
import json
import math
import sys

DEFAULT_SHAPES = ["8,16,1024,64", "4,16,2048,64", "8,8,1024,128", "2,16,4096,128"]
L2_MULTIPLE = 3
MAX_INPUT_SETS = 64
OPS = ("fwd", "bwd", "fwdbwd")
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


def parse_shape(text):
    try:
        B, H, T, D = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text}: expected B,H,T,D, e.g. 8,16,1024,64")
    if min(B, H, T, D) < 1:
        raise argparse.ArgumentTypeError(f"--shape {text}: all four must be positive")
    return (B, H, T, D)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", action="append", type=parse_shape,
                    help="B,H,T,D (repeatable); default: " + " ".join(DEFAULT_SHAPES))
    ap.add_argument("--backends", default="cudnn,flash", help="comma-separated subset of cudnn,flash")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layout", choices=("contiguous", "fused"), default="contiguous",
                    help="q, k, v as contiguous [B,H,T,D] tensors (default) or as views of a fused [B,T,3,H,D] qkv")
    ap.add_argument("--jsonl", help="append one JSON object per (shape, backend) to this file")
    args = ap.parse_args()
    shapes = args.shape or [parse_shape(s) for s in DEFAULT_SHAPES]
    if args.warmup < 0 or args.repeats < 1:
        sys.exit("error: --warmup must be >= 0 and --repeats >= 1")

    import torch
    import torch.nn.functional as F
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        sys.exit(f"error: torch {torch.__version__} has no torch.nn.attention.sdpa_kernel; PyTorch >= 2.3 is needed")
    if not torch.cuda.is_available():
        sys.exit("error: bench_attention_torch.py needs a CUDA GPU and a CUDA build of PyTorch")
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in chosen:
        if b not in backends:
            sys.exit(f"error: --backends: unknown backend {b!r}; choose from {','.join(backends)}")

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    print(f"bench_attention_torch on {props.name}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}; q, k, v {args.layout}; median of {args.repeats} launches after "
          f"{args.warmup} warm-up")
    print(f"{'shape':<20} {'backend':<7} {'fwd ms':>10} {'bwd ms':>10} {'f+b ms':>10} {'fwd TF/s':>11} "
          f"{'bwd TF/s':>11} {'f+b TF/s':>11} NaN/Inf")
    out_file = open(args.jsonl, "a") if args.jsonl else None
    gen = torch.Generator(device=dev)

    def randn_nonzero(shape):
        x = torch.randn(shape, device=dev, dtype=torch.float32, generator=gen).to(torch.bfloat16)
        return torch.where(x == 0, torch.full_like(x, 0.01), x)

    for (B, H, T, D) in shapes:
        set_bytes = (2 * B * T * 3 * H * D + 2 * B * H * T * D) * 2 + B * H * T * 4
        num_sets = max(2, min(MAX_INPUT_SETS, math.ceil(L2_MULTIPLE * l2 / set_bytes)))
        gen.manual_seed(args.seed)
        sets = []
        for _ in range(num_sets):
            if args.layout == "fused":
                qkv = randn_nonzero((B, T, 3, H, D))
                q, k, v = (qkv[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3))
            else:
                q, k, v = (randn_nonzero((B, H, T, D)).requires_grad_() for _ in range(3))
            sets.append(dict(q=q, k=k, v=v, dout=randn_nonzero((B, H, T, D))))
        fwd_flops = 4.0 * B * H * T * T * D / 2.0
        name = f"B{B} H{H} T{T} D{D}"
        for b in chosen:
            record = dict(impl="torch", variant=b, B=B, H=H, T=T, D=D, input_sets=num_sets, repeats=args.repeats,
                          device=props.name, torch=torch.__version__, layout=args.layout)
            try:
                with sdpa_kernel(backends[b]):
                    ms = time_backend(torch, F, sets, args.warmup, args.repeats)
                    bad = 0
                    for st in sets[:2]:
                        o = F.scaled_dot_product_attention(st["q"], st["k"], st["v"], is_causal=True)
                        grads = torch.autograd.grad(o, (st["q"], st["k"], st["v"]), st["dout"])
                        bad += int((~torch.isfinite(o)).sum()) + sum(int((~torch.isfinite(g)).sum()) for g in grads)
            except RuntimeError as e:  # backend not available for this shape / build
                msg = str(e).strip().splitlines()[0][:160]
                print(f"{name:<20} {b:<7} unavailable: {msg}")
                record["error"] = msg
                if out_file:
                    out_file.write(json.dumps(record) + "\n")
                    out_file.flush()
                continue
            tf = {op: FLOP_FACTOR[op] * fwd_flops / (ms[op] * 1e-3) / 1e12 for op in OPS}
            print(f"{name:<20} {b:<7} {ms['fwd']:10.4f} {ms['bwd']:10.4f} {ms['fwdbwd']:10.4f} {tf['fwd']:11.1f} "
                  f"{tf['bwd']:11.1f} {tf['fwdbwd']:11.1f} {bad}" + ("  <- NON-FINITE OUTPUTS" if bad else ""))
            sys.stdout.flush()
            for op in OPS:
                record[f"{op}_ms"] = round(ms[op], 6)
                record[f"{op}_tflops"] = round(tf[op], 3)
            record["nonfinite"] = bad
            if out_file:
                out_file.write(json.dumps(record) + "\n")
                out_file.flush()
        del sets
        torch.cuda.empty_cache()
    if out_file:
        out_file.close()
    print("FLOPs: causal fwd 4*B*H*T*T*D/2, bwd 2.5x, fwd+bwd 3.5x (FlashAttention's count)")


def time_backend(torch, F, sets, warmup, repeats):
    """Median ms of fwd, bwd and fwd+bwd under the active sdpa_kernel context."""
    n = len(sets)

    def fwd(st):
        return F.scaled_dot_product_attention(st["q"], st["k"], st["v"], is_causal=True)

    def bwd(st, o, retain):
        return torch.autograd.grad(o, (st["q"], st["k"], st["v"]), st["dout"], retain_graph=retain)

    def timed(fn_for_index):
        for r in range(warmup):
            fn_for_index(r % n)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        if hasattr(torch.cuda, "_sleep"):
            # ~1 ms per repeat at ~2 GHz: longer than Python takes to queue one fwd+bwd
            torch.cuda._sleep(int(2e6 * (2 + repeats)))
        for r in range(repeats):
            i = (warmup + r) % n
            starts[r].record()
            fn_for_index(i)
            stops[r].record()
        torch.cuda.synchronize()
        times = sorted(s.elapsed_time(e) for s, e in zip(starts, stops))
        mid = repeats // 2
        return times[mid] if repeats % 2 else 0.5 * (times[mid - 1] + times[mid])

    ms = {}
    ms["fwd"] = timed(lambda i: fwd(sets[i]))
    outs = [fwd(st) for st in sets]  # graphs kept alive for the backward-only timing
    ms["bwd"] = timed(lambda i: bwd(sets[i], outs[i], True))
    del outs
    ms["fwdbwd"] = timed(lambda i: bwd(sets[i], fwd(sets[i]), False))
    return ms


if __name__ == "__main__":
    main()
