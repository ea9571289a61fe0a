#!/usr/bin/env python3
"""
dev/gpt_twin.py - an independent PyTorch implementation of our GPT-2 model.

Why: two uses. (1) On the CPU it is the reference our C model is checked
against (tests/test_twin_parity.py): it reads OUR checkpoint files (llm.c
layout, fp32 or bf16), computes logits, loss and gradients with plain fp32
math attention, and trains with torch.optim.AdamW under the same decay rule
(2-D weights decay; biases and LayerNorm parameters do not). (2) On the GPU it
is the speed baseline the project's trainer is measured against, so it also
offers F.scaled_dot_product_attention, bf16 autocast, torch.compile and fused
AdamW (each used only where the installed torch has it; asking for a missing
one is an error, not a silent fallback).

Written from the model's definition (model/gpt_cpu.h), not from our C code:
  x = wte[idx] + wpe[pos]; per block x += proj(attn(ln1(x))); x += fcproj(gelu_tanh(fc(ln2(x))));
  logits = ln_f(x) @ wte^T over Vp columns; loss = CE over the first V columns, mean over B*T.

Library use:   model = load_checkpoint("model.bin"); logits, loss = model(idx, targets)
               flat = flatten(model, grads=True)   # our parameter-table order
Speed baseline (GPU):
  python3 dev/gpt_twin.py --model 450m --batch 16 --seq 1024 --steps 30 --compile --autocast bf16 \
      --attn sdpa --fused-adamw     # prints tokens/s (random tokens; measures speed only)
"""
import argparse
import inspect
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CHECKPOINT_MAGIC = 20240326
VERSION_FP32, VERSION_BF16 = 3, 5
HEADER_INTS = 256


@dataclass
class TwinConfig:
    max_seq_len: int
    vocab_size: int
    padded_vocab_size: int
    num_layers: int
    num_heads: int
    channels: int


# Same presets as model/gpt_config.c (name: L, C, NH, T); vocab is GPT-2's.
PRESETS = {
    "tiny": (2, 64, 4, 64), "small": (4, 256, 4, 256), "d6": (6, 384, 6, 1024), "d12": (12, 768, 12, 1024),
    "d24": (24, 1024, 16, 1024), "d36": (36, 1280, 20, 1024), "d48": (48, 1600, 25, 1024),
    "450m": (20, 1280, 20, 1024),
}


def preset(name):
    L, C, NH, T = PRESETS[name]
    return TwinConfig(max_seq_len=T, vocab_size=50257, padded_vocab_size=50304, num_layers=L, num_heads=NH,
                      channels=C)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, attn_impl):
        super().__init__()
        C = cfg.channels
        self.num_heads = cfg.num_heads
        self.c_attn = nn.Linear(C, 3 * C)   # output rows: q, then k, then v (head h at h*HS)
        self.c_proj = nn.Linear(C, C)
        if attn_impl == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
            raise SystemExit("error: --attn sdpa needs torch >= 2.0 (F.scaled_dot_product_attention); "
                             f"this torch is {torch.__version__}; use --attn math")
        self.attn_impl = attn_impl

    def forward(self, x):
        B, T, C = x.shape
        HS = C // self.num_heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.num_heads, HS).transpose(1, 2) for t in (q, k, v))
        if self.attn_impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # plain math: full scores, causal mask, fp32 softmax
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            y = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.channels, 4 * cfg.channels)
        self.c_proj = nn.Linear(4 * cfg.channels, cfg.channels)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg, attn_impl):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.channels, eps=1e-5)
        self.attn = CausalSelfAttention(cfg, attn_impl)
        self.ln_2 = nn.LayerNorm(cfg.channels, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPTTwin(nn.Module):
    def __init__(self, cfg, attn_impl="math"):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.channels)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.channels)
        self.h = nn.ModuleList([Block(cfg, attn_impl) for _ in range(cfg.num_layers)])
        self.ln_f = nn.LayerNorm(cfg.channels, eps=1e-5)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head, all Vp columns
        loss = None
        if targets is not None:
            V = self.cfg.vocab_size  # padded columns take no part in the softmax
            loss = F.cross_entropy(logits[..., :V].float().reshape(-1, V), targets.reshape(-1))
        return logits, loss

    # ---- our parameter table (model/gpt_config.c order), as (name, per-layer tensors) ----
    def param_table(self):
        hs = self.h
        return [
            ("wte", [self.wte.weight]), ("wpe", [self.wpe.weight]),
            ("ln1w", [b.ln_1.weight for b in hs]), ("ln1b", [b.ln_1.bias for b in hs]),
            ("qkvw", [b.attn.c_attn.weight for b in hs]), ("qkvb", [b.attn.c_attn.bias for b in hs]),
            ("attprojw", [b.attn.c_proj.weight for b in hs]), ("attprojb", [b.attn.c_proj.bias for b in hs]),
            ("ln2w", [b.ln_2.weight for b in hs]), ("ln2b", [b.ln_2.bias for b in hs]),
            ("fcw", [b.mlp.c_fc.weight for b in hs]), ("fcb", [b.mlp.c_fc.bias for b in hs]),
            ("fcprojw", [b.mlp.c_proj.weight for b in hs]), ("fcprojb", [b.mlp.c_proj.bias for b in hs]),
            ("lnfw", [self.ln_f.weight]), ("lnfb", [self.ln_f.bias]),
        ]

    def configure_adamw(self, lr, betas, eps, weight_decay, fused=False):
        """AdamW with our decay rule: 2-D weights decay, vectors (biases, LayerNorm) do not."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        kwargs = {}
        if fused:
            if "fused" not in inspect.signature(torch.optim.AdamW).parameters:
                raise SystemExit(f"error: fused AdamW is not available in torch {torch.__version__}")
            kwargs["fused"] = True
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kwargs)


def flatten(model, grads=False):
    """All parameters (or their gradients) as one fp32 vector in our table order."""
    parts = []
    for _, tensors in model.param_table():
        for t in tensors:
            src = t.grad if grads else t
            parts.append(torch.zeros_like(t).reshape(-1) if src is None else src.detach().reshape(-1))
    return torch.cat(parts).float()


def table_slices(model):
    """[(name, start, end)] of each table tensor inside the flat vector."""
    out, offset = [], 0
    for name, tensors in model.param_table():
        n = sum(t.numel() for t in tensors)
        out.append((name, offset, offset + n))
        offset += n
    return out


def load_checkpoint(path, attn_impl="math"):
    """Reads an llm.c-layout model file (version 3 fp32 or 5 bf16) into a new fp32 GPTTwin."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_INTS * 4), dtype=np.int32)
        if header.size != HEADER_INTS or header[0] != CHECKPOINT_MAGIC:
            raise ValueError(f"{path}: not a model checkpoint (bad magic or short header)")
        version = int(header[1])
        if version not in (VERSION_FP32, VERSION_BF16):
            raise ValueError(f"{path}: unsupported version {version}")
        cfg = TwinConfig(max_seq_len=int(header[2]), vocab_size=int(header[3]), num_layers=int(header[4]),
                         num_heads=int(header[5]), channels=int(header[6]), padded_vocab_size=int(header[7]))
        body = f.read()
    if version == VERSION_FP32:
        flat = torch.from_numpy(np.frombuffer(body, dtype=np.float32).copy())
    else:  # bf16 bits are the top half of an fp32
        bits = np.frombuffer(body, dtype=np.uint16).astype(np.uint32) << 16
        flat = torch.from_numpy(bits.view(np.float32).copy())
    model = GPTTwin(cfg, attn_impl)
    load_flat(model, flat, path)
    return model


def load_flat(model, flat, what="parameter vector"):
    expected = sum(t.numel() for _, ts in model.param_table() for t in ts)
    if flat.numel() != expected:
        raise ValueError(f"{what}: {flat.numel()} values, the config needs {expected}")
    offset = 0
    with torch.no_grad():
        for _, tensors in model.param_table():
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()


def init_gpt2(model, seed):
    """GPT-2 init (torch's RNG, not bit-identical to ours): N(0, .02), residual projections / sqrt(2L)."""
    g = torch.Generator().manual_seed(seed)
    L = model.cfg.num_layers
    with torch.no_grad():
        for name, tensors in model.param_table():
            for t in tensors:
                if t.dim() == 1:
                    t.fill_(1.0 if name in ("ln1w", "ln2w", "lnfw") else 0.0)
                else:
                    std = 0.02 / math.sqrt(2 * L) if name in ("attprojw", "fcprojw") else 0.02
                    t.copy_(torch.randn(t.shape, generator=g) * std)
        model.wte.weight[model.cfg.vocab_size:].zero_()


def bench(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch twin speed baseline: tokens/s of a training step")
    ap.add_argument("--model", default="d12", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "math"])
    ap.add_argument("--autocast", default="bf16", choices=["bf16", "none"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--fused-adamw", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--init-from", metavar="CKPT", help="start from this model file (ours or llm.c's); "
                    "overrides --model")
    a = ap.parse_args(argv)
    cfg = load_checkpoint(a.init_from).cfg if a.init_from else preset(a.model)
    if a.seq > cfg.max_seq_len:
        raise SystemExit(f"error: --seq {a.seq} exceeds the model's max {cfg.max_seq_len}")
    torch.manual_seed(a.seed)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if a.init_from:
        model = load_checkpoint(a.init_from, attn_impl=a.attn)
    else:
        model = GPTTwin(cfg, a.attn)
        init_gpt2(model, a.seed)
    model.to(a.device)
    nparams = sum(p.numel() for p in model.parameters())
    opt = model.configure_adamw(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=a.fused_adamw)
    if a.compile and not hasattr(torch, "compile"):
        raise SystemExit(f"error: --compile needs torch >= 2.0 (this is {torch.__version__})")
    step_model = torch.compile(model) if a.compile else model
    x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=a.device)
    y = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=a.device)
    ctx = (torch.autocast(device_type=a.device, dtype=torch.bfloat16) if a.autocast == "bf16"
           else torch.autocast(device_type=a.device, enabled=False))
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            sync()
            t0 = time.perf_counter()
        with ctx:
            _, loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    dt = time.perf_counter() - t0
    tok_s = a.batch * a.seq * a.steps / dt
    print(f"twin: model {a.init_from or a.model} ({nparams / 1e6:.1f}M params) B{a.batch} T{a.seq} attn={a.attn} "
          f"autocast={a.autocast} compile={a.compile} fused_adamw={a.fused_adamw} torch {torch.__version__}")
    print(f"twin: {a.steps} steps in {dt:.3f} s: {dt / a.steps * 1e3:.2f} ms/step, {tok_s:.0f} tokens/s, "
          f"last loss {loss.item():.4f}")


if __name__ == "__main__":
    bench(sys.argv[1:])
