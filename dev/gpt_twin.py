#!/usr/bin/env python3
"""
dev/gpt_twin.py - an independent PyTorch implementation of our GPT model
(GPT-2 and its architecture options).

Why: two uses. (1) On the CPU it is the reference our C model is checked
against (tests/test_twin_parity.py): it reads OUR checkpoint files (llm.c
layout, fp32 or bf16), computes logits, loss and gradients with plain fp32
math attention, and trains with torch.optim.AdamW under the same decay rule
(2-D weights decay; biases and LayerNorm parameters do not). (2) On the GPU it
is the speed baseline the project's trainer is measured against, so it also
offers F.scaled_dot_product_attention, bf16 autocast, torch.compile and fused
AdamW (each used only where the installed torch has it; asking for a missing
one is an error, not a silent fallback).

Written from the model's definition (model/gpt_cpu.h, docs/modern_stacks.md), not from our C code:
  x = wte[idx] (+ wpe[pos]); per block x += proj(attn(rope(qknorm(qkv(n1(x)))))); x += fcproj(act(fc(n2(x))));
  logits = n_f(x) @ W^T over Vp columns (W = wte tied, else lm_head); loss = CE over the first V columns.
  Options: pos learned|rope (rotate-half, the [T, HS/2] table built in float64 and rounded once),
  norm layernorm|rmsnorm, mlp gelu|swiglu (fc rows: gate then up), qk_norm (per-head RMSNorm with
  (HS) gains), bias, tie_embeddings.

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
VERSION_FP32, VERSION_BF16, VERSION_OPTIONS = 3, 5, 6
HEADER_INTS = 256
NORM_EPS = 1e-5
POS_NAMES, NORM_NAMES, MLP_NAMES = ("learned", "rope"), ("layernorm", "rmsnorm"), ("gelu", "swiglu")


def default_mlp_hidden(mlp, C):
    """4C for gelu, round_up(8C/3, 64) for swiglu."""
    return (8 * C + 3 * 64 - 1) // (3 * 64) * 64 if mlp == "swiglu" else 4 * C


@dataclass
class TwinConfig:
    max_seq_len: int
    vocab_size: int
    padded_vocab_size: int
    num_layers: int
    num_heads: int
    channels: int
    pos: str = "learned"
    rope_base: float = 10000.0
    norm: str = "layernorm"
    mlp: str = "gelu"
    mlp_hidden: int = 0  # 0: default_mlp_hidden(mlp, channels)
    qk_norm: int = 0
    bias: int = 1
    tie_embeddings: int = 1

    def __post_init__(self):
        if self.mlp_hidden == 0:
            self.mlp_hidden = default_mlp_hidden(self.mlp, self.channels)


# Same presets as model/gpt_config.c (name: L, C, NH, T, modern); vocab is GPT-2's.
PRESETS = {
    "tiny": (2, 64, 4, 64, 0), "small": (4, 256, 4, 256, 0), "d6": (6, 384, 6, 1024, 0),
    "d12": (12, 768, 12, 1024, 0), "d24": (24, 1024, 16, 1024, 0), "d36": (36, 1280, 20, 1024, 0),
    "d48": (48, 1600, 25, 1024, 0), "450m": (20, 1280, 20, 1024, 0),
    "llama-small": (4, 256, 4, 256, 1), "llama-d12": (12, 768, 12, 1024, 1),
}


def preset(name):
    L, C, NH, T, modern = PRESETS[name]
    opts = dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=0) if modern else {}
    return TwinConfig(max_seq_len=T, vocab_size=50257, padded_vocab_size=50304, num_layers=L, num_heads=NH,
                      channels=C, **opts)


def is_gpt2(cfg):
    return (cfg.pos == "learned" and cfg.norm == "layernorm" and cfg.mlp == "gelu" and
            cfg.mlp_hidden == 4 * cfg.channels and not cfg.qk_norm and cfg.bias and cfg.tie_embeddings)


class RMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2) + eps) * g (gain only)."""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight


def make_norm(cfg):
    return RMSNorm(cfg.channels) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.channels, eps=NORM_EPS)


def rope_tables(base, T, HS):
    """cos, sin [T, HS/2]: inv_freq in float64 rounded to float32, angle in float32, cos/sin of it in
    float64 rounded to float32 (docs/modern_stacks.md)."""
    i = np.arange(HS // 2, dtype=np.float64)
    inv_freq = np.power(np.float64(base), -2.0 * i / HS).astype(np.float32)
    angle = np.arange(T, dtype=np.float32)[:, None] * inv_freq[None, :]  # float32 products
    a64 = angle.astype(np.float64)
    return torch.from_numpy(np.cos(a64).astype(np.float32)), torch.from_numpy(np.sin(a64).astype(np.float32))


def apply_rope(x, cos, sin):
    """x [B, NH, T, HS]: pairs (i, i + HS/2) rotated by position t's angle (rotate-half)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, attn_impl):
        super().__init__()
        C = cfg.channels
        self.cfg = cfg
        self.num_heads = cfg.num_heads
        HS = C // cfg.num_heads
        self.c_attn = nn.Linear(C, 3 * C, bias=bool(cfg.bias))   # output rows: q, then k, then v (head h at h*HS)
        self.c_proj = nn.Linear(C, C, bias=bool(cfg.bias))
        if cfg.qk_norm:  # gains of size HS, shared by the heads
            self.q_norm = nn.Parameter(torch.ones(HS))
            self.k_norm = nn.Parameter(torch.ones(HS))
        if cfg.pos == "rope":
            cos, sin = rope_tables(cfg.rope_base, cfg.max_seq_len, HS)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        if attn_impl == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
            raise SystemExit("error: --attn sdpa needs torch >= 2.0 (F.scaled_dot_product_attention); "
                             f"this torch is {torch.__version__}; use --attn math")
        self.attn_impl = attn_impl

    def forward(self, x):
        B, T, C = x.shape
        HS = C // self.num_heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.num_heads, HS).transpose(1, 2) for t in (q, k, v))
        if self.cfg.qk_norm:  # per head: RMSNorm over HS, then the gain
            q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.q_norm
            k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.k_norm
        if self.cfg.pos == "rope":  # after qk-norm: attention sees rotated, normed q and k
            cos, sin = self.rope_cos[:T].to(q.dtype), self.rope_sin[:T].to(q.dtype)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
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
        H = cfg.mlp_hidden
        self.swiglu = cfg.mlp == "swiglu"
        self.c_fc = nn.Linear(cfg.channels, 2 * H if self.swiglu else H, bias=bool(cfg.bias))  # swiglu: gate, up
        self.c_proj = nn.Linear(H, cfg.channels, bias=bool(cfg.bias))

    def forward(self, x):
        h = self.c_fc(x)
        if self.swiglu:
            a, b = h.chunk(2, dim=-1)
            return self.c_proj(F.silu(a) * b)
        return self.c_proj(F.gelu(h, approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg, attn_impl):
        super().__init__()
        self.ln_1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, attn_impl)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPTTwin(nn.Module):
    def __init__(self, cfg, attn_impl="math"):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.channels)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.channels) if cfg.pos == "learned" else None
        self.h = nn.ModuleList([Block(cfg, attn_impl) for _ in range(cfg.num_layers)])
        self.ln_f = make_norm(cfg)
        self.lm_head = None if cfg.tie_embeddings else nn.Parameter(torch.zeros(cfg.padded_vocab_size, cfg.channels))

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        head = self.wte.weight if self.lm_head is None else self.lm_head
        logits = F.linear(self.ln_f(x), head)  # all Vp columns
        loss = None
        if targets is not None:
            V = self.cfg.vocab_size  # padded columns take no part in the softmax
            loss = F.cross_entropy(logits[..., :V].float().reshape(-1, V), targets.reshape(-1))
        return logits, loss

    # ---- our parameter table (model/gpt_config.c order), as (name, per-layer tensors) ----
    # A tensor the config does not have is an empty list (count 0 in our table).
    def param_table(self):
        hs, cfg = self.h, self.cfg

        def present(ts):
            return [t for t in ts if t is not None]

        ln = cfg.norm == "layernorm"
        return [
            ("wte", [self.wte.weight]), ("wpe", present([self.wpe.weight if self.wpe is not None else None])),
            ("ln1w", [b.ln_1.weight for b in hs]), ("ln1b", [b.ln_1.bias for b in hs] if ln else []),
            ("qkvw", [b.attn.c_attn.weight for b in hs]), ("qkvb", present([b.attn.c_attn.bias for b in hs])),
            ("attprojw", [b.attn.c_proj.weight for b in hs]), ("attprojb", present([b.attn.c_proj.bias for b in hs])),
            ("ln2w", [b.ln_2.weight for b in hs]), ("ln2b", [b.ln_2.bias for b in hs] if ln else []),
            ("fcw", [b.mlp.c_fc.weight for b in hs]), ("fcb", present([b.mlp.c_fc.bias for b in hs])),
            ("fcprojw", [b.mlp.c_proj.weight for b in hs]), ("fcprojb", present([b.mlp.c_proj.bias for b in hs])),
            ("lnfw", [self.ln_f.weight]), ("lnfb", [self.ln_f.bias] if ln else []),
            ("qnormw", [b.attn.q_norm for b in hs] if cfg.qk_norm else []),
            ("knormw", [b.attn.k_norm for b in hs] if cfg.qk_norm else []),
            ("lmheadw", present([self.lm_head])),
        ]

    def configure_adamw(self, lr, betas, eps, weight_decay, fused=False):
        """AdamW with our decay rule: 2-D weights (lm_head included) decay, vectors (biases, norm gains) do not."""
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
    """Reads an llm.c-layout model file (version 3 fp32 or 5 bf16; version 6: the options in header ints
    8..16, model/checkpoint.h) into a new fp32 GPTTwin."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_INTS * 4), dtype=np.int32)
        if header.size != HEADER_INTS or header[0] != CHECKPOINT_MAGIC:
            raise ValueError(f"{path}: not a model checkpoint (bad magic or short header)")
        version = int(header[1])
        if version not in (VERSION_FP32, VERSION_BF16, VERSION_OPTIONS):
            raise ValueError(f"{path}: unsupported version {version}")
        opts = {}
        bf16 = version == VERSION_BF16
        if version == VERSION_OPTIONS:
            bf16 = int(header[8]) == 16
            opts = dict(pos=POS_NAMES[header[9]], rope_base=float(header[10:11].view(np.float32)[0]),
                        norm=NORM_NAMES[header[11]], mlp=MLP_NAMES[header[12]], mlp_hidden=int(header[13]),
                        qk_norm=int(header[14]), bias=int(header[15]), tie_embeddings=int(header[16]))
        cfg = TwinConfig(max_seq_len=int(header[2]), vocab_size=int(header[3]), num_layers=int(header[4]),
                         num_heads=int(header[5]), channels=int(header[6]), padded_vocab_size=int(header[7]), **opts)
        body = f.read()
    if not bf16:
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
    """GPT-2 init (torch's RNG, not bit-identical to ours): N(0, .02), residual projections / sqrt(2L);
    norm weights and gains 1; lm_head like wte; padded vocabulary rows 0."""
    g = torch.Generator().manual_seed(seed)
    L = model.cfg.num_layers
    with torch.no_grad():
        for name, tensors in model.param_table():
            for t in tensors:
                if t.dim() == 1:
                    t.fill_(1.0 if name in ("ln1w", "ln2w", "lnfw", "qnormw", "knormw") else 0.0)
                else:
                    std = 0.02 / math.sqrt(2 * L) if name in ("attprojw", "fcprojw") else 0.02
                    t.copy_(torch.randn(t.shape, generator=g) * std)
        model.wte.weight[model.cfg.vocab_size:].zero_()
        if model.lm_head is not None:
            model.lm_head[model.cfg.vocab_size:].zero_()


def bench(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch twin speed baseline: tokens/s of a training step")
    ap.add_argument("--model", default="d12", choices=sorted(PRESETS))  # llama-* included
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
