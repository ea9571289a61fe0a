#!/usr/bin/env python3
"""dev/cudnn_check_torch.py - our cudnn mode against PyTorch's own cuDNN SDPA backend on the same inputs.

Why: cudnn mode claims to run the kernel PyTorch users run. dev/cudnn_check.cu writes, per checked input,
DIR/torch_inputs_TAG.bin: qkv [B,T,3,NH,HS] and dout [B,T,NH,HS] (BF16 bits) and our cudnn mode's O and
dqkv. This script runs torch.nn.functional.scaled_dot_product_attention(is_causal=True) under
sdpa_kernel(SDPBackend.CUDNN_ATTENTION) on the same BF16 inputs (q, k, v as strided views of the fused
qkv, like ours, and as contiguous copies), backpropagates dout, and prints per tensor (O, dQ, dK, dV) the
fraction of bit-equal elements and the max |difference| against ours; FLASH_ATTENTION for comparison.

Usage: python3 dev/cudnn_check_torch.py DIR   (prints one block per file; exit 1 if no file could be
checked, e.g. torch without CUDA or without the cuDNN backend; 0 otherwise: the numbers are the result).
File format: b"CUDNNCHK", int32 B, NH, T, HS, then uint16 BF16 bits of qkv, dout, O, dqkv.
"""
import glob
import os
import struct
import sys


def load(path, torch):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"CUDNNCHK":
        raise ValueError(f"{path}: not a cudnn_check input file (magic {data[:8]!r})")
    B, NH, T, HS = struct.unpack("<4i", data[8:24])
    C = NH * HS
    n_qkv, n_out = B * T * 3 * C, B * T * C
    bits = torch.frombuffer(bytearray(data[24:]), dtype=torch.int16)
    if bits.numel() != 2 * n_qkv + 2 * n_out:
        raise ValueError(f"{path}: {bits.numel()} BF16 values, expected {2 * n_qkv + 2 * n_out}")
    parts, off = [], 0
    for n in (n_qkv, n_out, n_out, n_qkv):
        parts.append(bits[off:off + n].view(torch.bfloat16))
        off += n
    qkv, dout, out, dqkv = parts
    return (B, NH, T, HS), qkv.view(B, T, 3, NH, HS), dout.view(B, T, NH, HS), out.view(B, T, NH, HS), \
        dqkv.view(B, T, 3, NH, HS)


def compare(torch, name, ours, theirs):
    ours, theirs = ours.contiguous(), theirs.contiguous()
    eq = (ours.view(torch.int16) == theirs.view(torch.int16)).float().mean().item()
    diff = (ours.float() - theirs.float()).abs().max().item()
    scale = theirs.float().abs().max().item()
    return f"{name} {100 * eq:8.4f}% bit-equal, max |diff| {diff:.3g} (max |value| {scale:.3g})"


def run_backend(torch, F, backend, qkv, dout, fused):
    dev = torch.device("cuda")
    qkv = qkv.to(dev)
    if fused:
        leaf = qkv.clone().requires_grad_()
        q, k, v = (leaf[:, :, i].transpose(1, 2) for i in range(3))
    else:
        q, k, v = (qkv[:, :, i].transpose(1, 2).contiguous().requires_grad_() for i in range(3))
    do = dout.to(dev).transpose(1, 2)
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if fused:
            (g,) = torch.autograd.grad(o, (leaf,), do)
            grads = [g[:, :, i] for i in range(3)]
        else:
            grads = [x.transpose(1, 2) for x in torch.autograd.grad(o, (q, k, v), do)]
    torch.cuda.synchronize()
    return o.transpose(1, 2).cpu(), [x.cpu() for x in grads]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: cudnn_check_torch.py DIR (the --out folder of build/dev/cudnn_check)")
    files = sorted(glob.glob(os.path.join(sys.argv[1], "torch_inputs_*.bin")))
    if not files:
        sys.exit(f"error: no torch_inputs_*.bin in {sys.argv[1]} (run build/dev/cudnn_check --out {sys.argv[1]})")
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend
    if not torch.cuda.is_available():
        sys.exit("error: torch has no CUDA device here")
    print(f"torch {torch.__version__}, torch's cuDNN {torch.backends.cudnn.version()}, "
          f"device {torch.cuda.get_device_name()}")
    checked = 0
    for path in files:
        shape, qkv, dout, out, dqkv = load(path, torch)
        print(f"\n{os.path.basename(path)}: B{shape[0]} NH{shape[1]} T{shape[2]} HS{shape[3]}")
        for bname, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            for fused in (True, False):
                tag = f"torch {bname:<5} ({'fused qkv views' if fused else 'contiguous q,k,v'})"
                try:
                    o, grads = run_backend(torch, F, backend, qkv, dout, fused)
                except RuntimeError as e:
                    print(f"  {tag}: unavailable: {str(e).strip().splitlines()[0][:200]}")
                    continue
                checked += bname == "cudnn"
                print(f"  ours vs {tag}:")
                print("    " + compare(torch, "O ", out, o))
                for i, n in enumerate(("dQ", "dK", "dV")):
                    print("    " + compare(torch, n, dqkv[:, :, i], grads[i]))
    if checked == 0:
        sys.exit("error: torch's cuDNN backend ran on none of the inputs")
    print(f"\ncudnn_check_torch: compared {checked} run(s) of torch's cuDNN backend with ours")


if __name__ == "__main__":
    main()
