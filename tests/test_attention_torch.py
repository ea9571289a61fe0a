#!/usr/bin/env python3
"""
tests/test_attention_torch.py - the C emulation of the four attention modes
(attention/cpu/attention_cpu.c) against an independent PyTorch emulation written
from docs/attention_numerics.md.

Why: the fp64 reference only says how far each mode is from exact attention;
it cannot tell whether the C code rounds at the contract's points. Here torch
recomputes every mode with whole T x T matrices (a different program shape:
BLAS matmuls, masks, torch's own round-to-nearest-even BF16 cast) and the two
must agree to accumulation-order noise. Each rounding point is then dropped
from the torch side one at a time (the "controls"): every such variant must
differ from the C output by far more than the tolerance, so the comparison
can see each rounding point.

How: tests/attn_emul_driver (built by make) runs a mode on inputs this script
writes and returns out, stats and dqkv. Inputs are drawn here with numpy
(independent of attention/support/attn_cases.c) and rounded to BF16 by torch.

Checked (ATTN_IO_FP32, where outputs carry no boundary rounding, and
ATTN_IO_BF16 as the GPU sees it), per tensor (O, stats, dQ, dK, dV), the
relative Frobenius difference ||C - torch|| / ||torch||:
- random inputs (q x1 and x3; T 100 and 65 HS 64, T 70 HS 128), fp32 and
  BF16 I/O: at most 1e-3 relative Frobenius difference and at most 2% of the
  elements moved by more than 1e-5 * rms. Measured: usually < 1e-6 and 0%;
  where fp32 summation-order noise flips one BF16 rounding (a value within
  ~1e-7 of a tie, e.g. bf(e) in bf16 mode) a row moves by 2^-8, which the
  moved-fraction criterion tolerates and a misplaced rounding point does not;
- key offset rho 64 (q x8) and sharp logits 1e3: here the bf16/repair leak
  is made of BF16 rounding residuals of dS, which flip with any fp32
  summation-order difference, so the two programs cannot agree elementwise;
  instead each program's error vs an fp64 torch reference must agree within
  10% (+1e-4) for O, dQ, dK, dV; fp32 and gproj must also agree elementwise
  (2e-4 with fp32 I/O: the offset amplifies fp32 noise in dQ; 2e-3 BF16 I/O);
- repair's tile-max shift arm on keys with exact ties;
- controls (random input, fp32 I/O): dropping bf(e) in O, bf(dS) or bf(P) in
  dV, or rounding gproj's dS - lambda P as one operand, each moves at least
  half of some tensor's elements; on q = k = v = 133120 the bf16 mode's FMA gives non-finite O in
  both programs at the same places, and the same formula without the fused
  multiply-add (S*c and the subtraction rounded separately) stays finite.
Fails (never skips) when torch is missing. Prints "N passed, N failed".
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.testing import check, fail, summary  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(REPO, "build", "tests", "attn_emul_driver")
TILE = 64          # ATTN_SHIFT_TILE_KEYS
TIE_TOL = 1e-3     # ATTN_SHIFT_TIE_TOL
# Exactness: per tensor, relative Frobenius difference and the fraction of
# elements that differ by more than 1e-5 * rms(tensor). Accumulation-order
# noise (~1e-7) moves almost no element that far, except where it flips a BF16
# rounding (a value within ~1e-7 of a tie); a misplaced rounding moves nearly
# every element by ~1e-3.
TOL_FROB = 1e-3
TOL_MOVED = 0.02
MOVED_REL = 1e-5
HARD_TOL_FP32_IO = 2e-4
HARD_TOL_BF16_IO = 2e-3

try:
    import numpy as np
    import torch
except ImportError as exc:  # never skip: a missing dependency is a failure
    fail(f"cannot import torch/numpy ({exc}); install python3-torch and python3-numpy")
    sys.exit(summary())

torch.set_num_threads(2)


def bf(x):
    """Round-to-nearest-even to BF16, back in float32."""
    return x.to(torch.bfloat16).to(torch.float32)


def constants(hs):
    s = np.float32(1.0 / np.sqrt(hs))
    c = np.float32(np.log2(np.e) / np.sqrt(hs))
    return float(s), float(c)


def emulate(mode, io, shift, qkv, dout, drop=()):
    """The contract of docs/attention_numerics.md in torch, float32 (fp64 only
    to form the exact fused multiply-add). `drop` names rounding points to
    leave out (for the controls). Returns out, stats, dqkv in the C layouts."""
    B, T, _, NH, HS = qkv.shape
    if io == "bf16":
        qkv, dout = bf(qkv), bf(dout)
    Q = qkv[:, :, 0].permute(0, 2, 1, 3)
    K = qkv[:, :, 1].permute(0, 2, 1, 3)
    V = qkv[:, :, 2].permute(0, 2, 1, 3)
    dO = dout.permute(0, 2, 1, 3)
    s, c = constants(HS)
    f32 = torch.float32
    s_t, c_t = torch.tensor(s, dtype=f32), torch.tensor(c, dtype=f32)
    rnd = (lambda x: x) if mode == "fp32" else bf
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    S = Q @ K.transpose(-1, -2)
    Sm = S.masked_fill(~mask, float("-inf"))
    m = Sm.amax(-1, keepdim=True)
    if mode == "repair" and shift:
        m = torch.full_like(m, float("-inf"))
        for t0 in range(0, T, TILE):
            blk = Sm[..., t0:t0 + TILE]
            tm = blk.amax(-1, keepdim=True)
            ties = ((tm - blk) * s_t <= TIE_TOL).sum(-1, keepdim=True)
            shifted = torch.where(ties >= 2, torch.where(tm > 0, 2 * tm, torch.zeros_like(tm)), tm)
            m = torch.maximum(m, shifted)

    def exponent_fma(bias):  # fl(S*c - bias) with one rounding
        if "fma" in drop:
            return S * c_t - bias
        return (S.double() * c - bias.double()).to(f32)

    if mode == "bf16":
        x = exponent_fma(m * c_t)
    else:
        x = (S - m) * c_t
    e = torch.exp2(x).masked_fill(~mask, 0.0)
    l = e.sum(-1, keepdim=True)
    w = e if ("e_O" in drop or mode == "fp32") else bf(e)
    O = (w @ V) / l
    O_store = bf(O) if io == "bf16" else O
    if mode == "bf16":
        lse = m * s_t + torch.log(l)
        stats = torch.cat([lse, torch.zeros_like(lse)], -1)
    else:
        stats = torch.cat([m, l], -1)

    if mode == "bf16":
        P = torch.exp2(exponent_fma(lse * torch.tensor(1.4426950408889634, dtype=f32)))
    else:
        P = torch.exp2((S - m) * c_t) * (1.0 / l)
    P = P.masked_fill(~mask, 0.0)
    dP = dO @ V.transpose(-1, -2)
    cD = (dO * O_store).sum(-1, keepdim=True)
    if mode == "fp32":
        D_minus_c = (P * (dP - cD)).sum(-1, keepdim=True)
        dS = P * ((dP - cD) - D_minus_c)
    else:
        dS = P * (dP - cD)
        if "dS" not in drop:
            dS = bf(dS)
    dS = dS.masked_fill(~mask, 0.0)
    P_op = P if ("P_dV" in drop or mode == "fp32") else bf(P)
    if mode == "gproj":
        r = dS.sum(-1, keepdim=True)
        p = bf(P).sum(-1, keepdim=True)
        lam = torch.where(p != 0, r / p, torch.zeros_like(p))
        dQ = s_t * (dS @ K - lam * (bf(P) @ K))
        if "gproj_sep" in drop:  # dS - lambda P rounded as one operand
            dK = s_t * (bf(dS - lam * P).transpose(-1, -2) @ Q)
        else:
            dK = s_t * (dS.transpose(-1, -2) @ Q + bf(-lam * P).transpose(-1, -2) @ Q)
    else:
        dQ = s_t * (dS @ K)
        dK = s_t * (dS.transpose(-1, -2) @ Q)
    dV = P_op.transpose(-1, -2) @ dO
    if io == "bf16":
        O, dQ, dK, dV = bf(O), bf(dQ), bf(dK), bf(dV)
    out = O.permute(0, 2, 1, 3).contiguous()
    dqkv = torch.stack([g.permute(0, 2, 1, 3) for g in (dQ, dK, dV)], 2).contiguous()
    return out, stats.contiguous(), dqkv


def run_c(mode, io, shift, qkv, dout, tmp):
    B, T, _, NH, HS = qkv.shape
    fin, fout = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    with open(fin, "wb") as f:
        f.write(qkv.numpy().astype("<f4").tobytes())
        f.write(dout.numpy().astype("<f4").tobytes())
    subprocess.run([DRIVER, mode, io, str(shift), str(B), str(NH), str(T), str(HS), fin, fout], check=True)
    raw = np.fromfile(fout, dtype="<f4")
    n_out, n_st = B * T * NH * HS, B * NH * T * 2
    out = torch.from_numpy(raw[:n_out].copy()).reshape(B, T, NH, HS)
    stats = torch.from_numpy(raw[n_out:n_out + n_st].copy()).reshape(B, NH, T, 2)
    dqkv = torch.from_numpy(raw[n_out + n_st:].copy()).reshape(B, T, 3, NH, HS)
    return out, stats, dqkv


def rel(a, b):
    a, b = a.double(), b.double()
    nb = torch.linalg.norm(b)
    return float(torch.linalg.norm(a - b) / nb) if nb > 0 else float(torch.linalg.norm(a))


def moved(a, b):
    """Fraction of elements with |a - b| > MOVED_REL * rms(b) (NaN counts as moved)."""
    a, b = a.double(), b.double()
    rms = float(torch.sqrt((b * b).mean())) if b.numel() else 0.0
    far = ~((a - b).abs() <= MOVED_REL * rms)
    return float(far.double().mean())


def split(res):
    o, st, g = res
    return {"O": o, "stats": st, "dQ": g[:, :, 0], "dK": g[:, :, 1], "dV": g[:, :, 2]}


def diffs(c_res, t_res):
    """Relative Frobenius differences of O, stats, dQ, dK, dV."""
    c, t = split(c_res), split(t_res)
    return {k: rel(c[k], t[k]) for k in c}


def moved_fractions(c_res, t_res):
    c, t = split(c_res), split(t_res)
    return {k: moved(c[k], t[k]) for k in c}


def reference(qkv, dout):
    """Exact attention in float64: O and dqkv in the C layouts."""
    B, T, _, NH, HS = qkv.shape
    x = qkv.double().permute(0, 2, 3, 1, 4)  # [B, 3, NH, T, HS]
    Q, K, V = x[:, 0].clone().requires_grad_(), x[:, 1].clone().requires_grad_(), x[:, 2].clone().requires_grad_()
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    A = ((Q @ K.transpose(-1, -2)) / np.sqrt(HS)).masked_fill(~mask, float("-inf")).softmax(-1)
    O = A @ V
    dO = dout.double().permute(0, 2, 1, 3)
    O.backward(dO)
    out = O.detach().permute(0, 2, 1, 3)
    dqkv = torch.stack([g.grad.permute(0, 2, 1, 3) for g in (Q, K, V)], 2)
    return out, dqkv


def errors_vs(res, ref):
    """Relative Frobenius errors of O, dQ, dK, dV against the fp64 reference."""
    (o, _, g), (ro, rg) = res, ref
    return {"O": rel(o, ro), "dQ": rel(g[:, :, 0], rg[:, :, 0]), "dK": rel(g[:, :, 1], rg[:, :, 1]),
            "dV": rel(g[:, :, 2], rg[:, :, 2])}


def make_inputs(kind, B, NH, T, HS, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, NH, HS))
    k = rng.standard_normal((B, T, NH, HS))
    v = rng.standard_normal((B, T, NH, HS))
    dout = rng.standard_normal((B, T, NH, HS))
    if kind == "offset":  # rho 64, q x8
        u = rng.standard_normal((NH, HS))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        q *= 8.0
        k += 64.0 * np.sqrt(HS) * u[None, None]
    elif kind == "sharp":  # 4 clusters, logits about 1e3
        dirs = rng.standard_normal((NH, 4, HS))
        dirs /= np.linalg.norm(dirs, axis=2, keepdims=True)
        cq = rng.integers(0, 4, (B, T, NH))
        ck = rng.integers(0, 4, (B, T, NH))
        h = np.arange(NH)[None, None, :]
        q = 1e3 * dirs[h, cq]
        k = np.sqrt(HS) * dirs[h, ck] + 0.1 * k
    qkv = np.stack([q, k, v], axis=2)
    return bf(torch.from_numpy(qkv).float()), bf(torch.from_numpy(dout).float())


def main():
    if not os.path.exists(DRIVER):
        fail(f"{DRIVER} missing; run: make {os.path.relpath(DRIVER, REPO)}")
        return summary()
    modes = ["fp32", "bf16", "repair", "gproj"]
    with tempfile.TemporaryDirectory() as tmp:
        print("== exactness on random inputs: C vs torch emulation (relative Frobenius differences)")
        for qscale, (B, NH, T, HS) in [(1.0, (1, 2, 100, 64)), (3.0, (2, 2, 70, 128)), (1.0, (1, 3, 65, 64))]:
            qkv, dout = make_inputs("random", B, NH, T, HS, 1234)
            qkv[:, :, 0] = bf(qscale * qkv[:, :, 0])
            for io in ("fp32", "bf16"):
                for mode in modes:
                    c_res, t_res = run_c(mode, io, 0, qkv, dout, tmp), emulate(mode, io, 0, qkv, dout)
                    d, mv = diffs(c_res, t_res), moved_fractions(c_res, t_res)
                    detail = " ".join(f"{k} {d[k]:.0e}/{100 * mv[k]:.2g}%" for k in d)
                    check(max(d.values()) <= TOL_FROB and max(mv.values()) <= TOL_MOVED,
                          f"q x{qscale:g} B{B} NH{NH} T{T} HS{HS} {mode:6s} io {io}: diff/moved {detail}")

        print("== hard cases: same error vs fp64 in both programs; fp32 and gproj also close elementwise")
        for kind in ("offset", "sharp"):
            qkv, dout = make_inputs(kind, 1, 2, 100, 64, 1234)
            ref = reference(qkv, dout)
            for io, tol in [("fp32", HARD_TOL_FP32_IO), ("bf16", HARD_TOL_BF16_IO)]:
                for mode in modes:
                    c_res = run_c(mode, io, 0, qkv, dout, tmp)
                    t_res = emulate(mode, io, 0, qkv, dout)
                    ec, et = errors_vs(c_res, ref), errors_vs(t_res, ref)
                    agree = all(abs(ec[k] - et[k]) <= 0.1 * et[k] + 1e-4 for k in ec)
                    detail = " ".join(f"{k} {ec[k]:.2e}/{et[k]:.2e}" for k in ec)
                    check(agree, f"{kind} {mode:6s} io {io}: error vs fp64 C/torch {detail}")
                    if mode in ("fp32", "gproj"):
                        d = diffs(c_res, t_res)
                        check(max(d.values()) <= tol, f"{kind} {mode:6s} io {io}: C vs torch max diff "
                              f"{max(d.values()):.1e} (tol {tol:g})")

        print("== repair's tile-max shift arm on exact ties")
        qkv, dout = make_inputs("random", 1, 2, 150, 64, 99)
        qkv[:, :, 1] *= 0.1
        qkv[:, 80, 1] = qkv[:, 81, 1] = bf(0.5 * qkv[:, 90, 0])  # keys 80, 81 tie for query 90 ...
        qkv[:, 100:, 0] = qkv[:, 90:91, 0]                        # ... and for queries 100..149
        for io in ("fp32", "bf16"):
            c_res = run_c("repair", io, 1, qkv, dout, tmp)
            d = diffs(c_res, emulate("repair", io, 1, qkv, dout))
            plain = run_c("repair", io, 0, qkv, dout, tmp)
            shifted_rows = int((c_res[1][..., 0] != plain[1][..., 0]).sum())
            mv = moved_fractions(c_res, emulate("repair", io, 1, qkv, dout))
            check(max(d.values()) <= TOL_FROB and max(mv.values()) <= TOL_MOVED and shifted_rows >= 50,
                  f"shift io {io}: {shifted_rows} rows shifted; diff " + " ".join(f"{k} {v:.1e}" for k, v in d.items()))

        print("== controls: each rounding point, dropped on the torch side, is visible")
        qkv, dout = make_inputs("random", 1, 2, 100, 64, 4321)
        for drop, mode in [("e_O", "repair"), ("dS", "repair"), ("P_dV", "repair"), ("gproj_sep", "gproj")]:
            c_res, t_res = run_c(mode, "fp32", 0, qkv, dout, tmp), emulate(mode, "fp32", 0, qkv, dout, drop=(drop,))
            d, mv = diffs(c_res, t_res), moved_fractions(c_res, t_res)
            k = max(mv, key=mv.get)
            check(mv[k] >= 0.5 and d[k] > TOL_FROB / 4,
                  f"{mode} without '{drop}': {k} differs by {d[k]:.1e}, {100 * mv[k]:.0f}% of its elements moved")
        # the FMA matters where m*c is large: the extreme input, where it is the NaN
        ext = torch.full((1, 8, 3, 1, 64), 133120.0)
        ext_dout = bf(torch.from_numpy(np.random.default_rng(5).standard_normal((1, 8, 1, 64))).float())
        c_out = run_c("bf16", "fp32", 0, ext, ext_dout, tmp)[0]
        t_out = emulate("bf16", "fp32", 0, ext, ext_dout)[0]
        t_nofma = emulate("bf16", "fp32", 0, ext, ext_dout, drop=("fma",))[0]
        same_nan = bool(torch.equal(torch.isfinite(c_out), torch.isfinite(t_out)))
        check(same_nan and not bool(torch.isfinite(c_out).all()) and bool(torch.isfinite(t_nofma).all()),
              "extreme 133120, bf16: C and torch FMA both non-finite in the same places; without the FMA it is finite")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
