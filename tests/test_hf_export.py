#!/usr/bin/env python3
"""
tests/test_hf_export.py - scripts/export_hf.py and scripts/import_hf.py on the CPU, without transformers.

Why: CI has no transformers, so the exported folder is checked against what
transformers expects, written out here independently of scripts/hf_gpt2.py
(dev/hf_parity.sh checks it against transformers itself on a machine that has it):
- the safetensors file parses with this test's own reader (u64 header length,
  JSON header, data_offsets that tile the data exactly, "__metadata__" format "pt");
- its names and shapes are GPT2LMHeadModel's state dict: transformer.wte.weight
  (50257, C) (padding rows cut), transformer.wpe.weight, transformer.h.N.* with the
  Conv1D weights as [in, out] (c_attn (C, 3C), attn.c_proj (C, C), c_fc (C, 4C),
  mlp.c_proj (4C, C)), transformer.ln_f.*; and NO lm_head.weight: GPT-2 ties the head
  to wte (tie_word_embeddings), save_pretrained leaves the tied copy out of the file
  and from_pretrained ties it back, so the export does the same;
- config.json says GPT2LMHeadModel with our shape, gelu_new, epsilon 1e-5, tied;
  vocab.json and merges.txt are byte for byte the GPT-2 files setup_data.sh verified;
- import(export(x)) is bit-exact for fp32 (the model file compares equal byte for byte);
- --dtype bf16 holds torch's own bfloat16 rounding of every weight (and the rounding
  helper matches torch on ties, subnormals, overflow, Inf and NaN);
- our CPU model's logits (build/model_logits: the trainers' forward) on the
  checkpoint equal an independent torch GPT-2 forward that reads ONLY the exported
  folder with transformers' semantics (Conv1D x @ W + b, gelu_new = tanh GELU,
  layer_norm_epsilon from config.json, the tied head over vocab_size columns):
  max |diff| <= 2e-5 * max |logit|, loss within 1e-5 relative (fp32 on both sides,
  tests/test_twin_parity.py's bound);
- the trainer's greedy sample (--sample-temperature 0) equals argmax decoding of the folder;
- refusals, each with a message that names the problem, and nothing overwritten.
The model is a tiny one trained 2 steps by build/train_gpt_cpu on the default data.
Needs build/train_gpt_cpu, build/model_logits, data/default and .cache/gpt2 (make test
makes them) and torch + numpy (re-runs itself under /usr/bin/python3 if this python lacks them).
Ends with "N passed, N failed".
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from testing import check, fail, require, summary  # noqa: E402
np, torch = require(["numpy", "torch"], "python3-numpy python3-torch")
import hf_gpt2  # noqa: E402  (only for the bf16 helper's own test)

TRAINER = os.path.join(ROOT, "build", "train_gpt_cpu")
LOGITS = os.path.join(ROOT, "build", "model_logits")
VOCAB = os.path.join(ROOT, ".cache", "gpt2")
DATA = os.path.join(ROOT, "data", "default", "default_train_*.bin")


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, **kw)


def script(name, *args):
    return run([sys.executable, os.path.join(ROOT, "scripts", name)] + list(args))


# ---------------------------------------------------------------- an independent safetensors reader

def read_st(path):
    """(header dict, {name: numpy array}) with every rule of the format checked; raises AssertionError."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), f"header length {n} past the end"
    header = json.loads(raw[8:8 + n])
    assert (8 + n) % 8 == 0, "data not 8-byte aligned"
    meta = header.pop("__metadata__", None)
    assert meta is not None and meta.get("format") == "pt", f"__metadata__ {meta} (transformers wants format pt)"
    data = raw[8 + n:]
    spans, out = [], {}
    for name, info in header.items():
        dt = {"F32": ("<f4", 4), "BF16": ("<u2", 2)}[info["dtype"]]
        b, e = info["data_offsets"]
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        assert e - b == count * dt[1], f"{name}: {e - b} bytes for {info['shape']}"
        spans.append((b, e))
        out[name] = np.frombuffer(data[b:e], dtype=dt[0]).reshape(info["shape"])
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == len(data), "data_offsets do not cover the data exactly"
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "data_offsets leave gaps or overlap"
    return header, out


def expected_names(L, C, V, T):
    """GPT2LMHeadModel's state dict names and shapes (transformers' naming), lm_head.weight excluded (tied)."""
    names = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [T, C],
             "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
    for i in range(L):
        p = f"transformer.h.{i}."
        names.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C],
                      p + "attn.c_attn.weight": [C, 3 * C], p + "attn.c_attn.bias": [3 * C],
                      p + "attn.c_proj.weight": [C, C], p + "attn.c_proj.bias": [C],
                      p + "ln_2.weight": [C], p + "ln_2.bias": [C],
                      p + "mlp.c_fc.weight": [C, 4 * C], p + "mlp.c_fc.bias": [4 * C],
                      p + "mlp.c_proj.weight": [4 * C, C], p + "mlp.c_proj.bias": [C]})
    return names


# ---------------------------------------------------------------- transformers' GPT-2 forward, from the folder only

def hf_forward(folder, ids):
    """Logits [T][V] and the shifted-label loss of a GPT-2 folder, computed as transformers' GPT2LMHeadModel does."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    _, w = read_st(os.path.join(folder, "model.safetensors"))
    w = {k: torch.from_numpy(v.astype(np.float32) if v.dtype != np.uint16 else
                             (v.astype(np.uint32) << 16).view(np.float32)) for k, v in w.items()}
    eps, nh, C = cfg["layer_norm_epsilon"], cfg["n_head"], cfg["n_embd"]
    assert cfg["activation_function"] == "gelu_new"

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)

    def conv1d(x, p):  # transformers' Conv1D: weight [in, out], y = x @ W + b
        return x @ w[p + ".weight"] + w[p + ".bias"]

    x = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    T = x.shape[0]
    h = w["transformer.wte.weight"][x] + w["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}"
        q, k, v = conv1d(ln(h, p + ".ln_1"), p + ".attn.c_attn").split(C, dim=-1)
        q, k, v = (t.view(T, nh, C // nh).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / (C // nh) ** 0.5
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        h = h + conv1d((att @ v).transpose(0, 1).reshape(T, C), p + ".attn.c_proj")
        m = conv1d(ln(h, p + ".ln_2"), p + ".mlp.c_fc")
        m = 0.5 * m * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (m + 0.044715 * m ** 3)))  # gelu_new
        h = h + conv1d(m, p + ".mlp.c_proj")
    logits = ln(h, "transformer.ln_f") @ w["transformer.wte.weight"].T  # tied head
    loss = torch.nn.functional.cross_entropy(logits[:-1], x[1:])
    return logits.numpy(), float(loss)


def ours(ckpt, ids, tmp):
    tok, out = os.path.join(tmp, "ids.i32"), os.path.join(tmp, "logits.f32")
    np.asarray(ids, dtype="<i4").tofile(tok)
    r = run([LOGITS, ckpt, tok, out])
    if r.returncode != 0:
        raise SystemExit(f"build/model_logits failed: {r.stderr}")
    info = json.loads(r.stdout)
    return np.fromfile(out, dtype=np.float32).reshape(info["positions"], info["vocab"]), info["loss"]


def main():
    missing = [p for p in (TRAINER, LOGITS, os.path.join(VOCAB, "encoder.json")) if not os.path.exists(p)]
    if missing:
        fail(f"missing {missing} (run 'make test', or 'make build/train_gpt_cpu build/model_logits setup')")
        return summary()
    tmp = tempfile.mkdtemp(prefix="hf_export.")
    try:
        return body(tmp)
    finally:
        shutil.rmtree(tmp)


def body(tmp):
    run_dir = os.path.join(tmp, "run")
    r = run([TRAINER, "--model", "tiny", "--attn", "fp32", "--train-data", DATA, "--val-data", "", "--vocab", "",
             "--batch-size", "2", "--seq-len", "64", "--steps", "2", "--lr", "3e-3", "--log-every", "100",
             "--sample-every", "2", "--sample-tokens", "12", "--sample-temperature", "0", "--out-dir", run_dir])
    ckpt = os.path.join(run_dir, "model_00000002.bin")
    if not check(r.returncode == 0 and os.path.exists(ckpt), "the CPU trainer makes a tiny checkpoint"):
        print(r.stdout[-1500:], r.stderr[-1500:])
        return summary()
    L, C, NH, T, V, Vp = 2, 64, 4, 64, 50257, 50304

    print("== export, fp32")
    out = os.path.join(tmp, "hf")
    r = script("export_hf.py", ckpt, out, "--vocab", VOCAB)
    check(r.returncode == 0, f"export_hf.py exits 0 ({r.stdout.strip() or r.stderr.strip()})")
    try:
        header, st = read_st(os.path.join(out, "model.safetensors"))
        check(True, "model.safetensors parses with the test's own reader (offsets tile the data, format pt)")
    except (AssertionError, ValueError, KeyError) as e:
        fail(f"model.safetensors does not parse: {e}")
        return summary()
    want = expected_names(L, C, V, T)
    got = {k: v["shape"] for k, v in header.items()}
    check(got == want, f"names and shapes are GPT2LMHeadModel's ({len(want)} tensors, Conv1D [in, out]); "
          f"differ: {sorted(set(got.items()) ^ set((k, tuple(v)) for k, v in want.items()))[:4] if got != want else []}")
    check("lm_head.weight" not in header, "no lm_head.weight: tied to wte, as save_pretrained writes GPT-2")
    check(all(v["dtype"] == "F32" for v in header.values()), "every tensor F32")
    cfg = json.load(open(os.path.join(out, "config.json")))
    want_cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": T,
                "n_embd": C, "n_layer": L, "n_head": NH, "activation_function": "gelu_new",
                "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "n_inner": None}
    check(all(cfg.get(k) == v for k, v in want_cfg.items()),
          f"config.json: {dict((k, cfg.get(k)) for k in want_cfg if cfg.get(k) != want_cfg[k]) or 'as expected'}")
    for name, src in (("vocab.json", "encoder.json"), ("merges.txt", "vocab.bpe")):
        check(open(os.path.join(out, name), "rb").read() == open(os.path.join(VOCAB, src), "rb").read(),
              f"{name} is GPT-2's {src}, byte for byte")
    raw = open(ckpt, "rb").read()
    body_ = np.frombuffer(raw, dtype="<f4", offset=1024)
    qkvw0 = body_[Vp * C + T * C + 2 * L * C:][:3 * C * C].reshape(3 * C, C)  # layer 0 of (L, 3C, C)
    check(np.array_equal(st["transformer.h.0.attn.c_attn.weight"], qkvw0.T),
          "c_attn.weight is our qkvw transposed (q|k|v along the output axis)")
    check(np.array_equal(st["transformer.wte.weight"], body_[:V * C].reshape(V, C)), "wte is our first 50257 rows")

    print("== import(export(x)), fp32")
    back = os.path.join(tmp, "back.bin")
    r = script("import_hf.py", out, back)
    check(r.returncode == 0 and open(back, "rb").read() == raw,
          f"import_hf.py gives back the checkpoint byte for byte ({r.stderr.strip() or 'exit 0'})")

    print("== bf16")
    out16 = os.path.join(tmp, "hf16")
    r = script("export_hf.py", ckpt, out16, "--dtype", "bf16", "--vocab", "")
    h16, st16 = read_st(os.path.join(out16, "model.safetensors"))
    check(r.returncode == 0 and all(v["dtype"] == "BF16" for v in h16.values()), "--dtype bf16: every tensor BF16")
    want16 = torch.from_numpy(st["transformer.h.1.mlp.c_fc.weight"].copy()).to(torch.bfloat16).view(torch.int16)
    check(np.array_equal(st16["transformer.h.1.mlp.c_fc.weight"].view(np.int16), want16.numpy()),
          "bf16 bits equal torch's bfloat16 rounding of the fp32 weights")
    check(not os.path.exists(os.path.join(out16, "vocab.json")), "--vocab '' writes no tokenizer files")
    f32 = np.array([1.0, 1.00390625, 1.01171875, 1.0 + 2 ** -8 + 2 ** -20, -2.5e-39, 1e-45, 3.3961776e38, 3.4e38,
                    np.inf, -np.inf, 0.0, -0.0, 65504.0, 7.1e-3], dtype=np.float32)
    mine = hf_gpt2.fp32_to_bf16_bits(f32)
    ref = torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    check(np.array_equal(mine, ref), f"fp32 -> bf16 rounding equals torch on ties, subnormals, overflow, Inf "
          f"({[hex(x) for x in mine[mine != ref]]} vs {[hex(x) for x in ref[mine != ref]]})")
    nan = hf_gpt2.fp32_to_bf16_bits(np.array([np.nan, -np.nan], dtype=np.float32))
    check(all((b & 0x7F80) == 0x7F80 and (b & 0x7F) != 0 for b in nan), "NaN stays NaN in bf16")

    print("== logits: our CPU model on the checkpoint vs transformers' semantics on the folder")
    data = np.fromfile(sorted(__import__("glob").glob(DATA))[0], dtype=np.uint16, offset=1024)
    ids = data[500:500 + T].astype(np.int64)
    mine, loss_mine = ours(ckpt, ids, tmp)
    theirs, loss_theirs = hf_forward(out, ids)
    diff, scale = float(np.abs(mine - theirs[:-1]).max()), float(np.abs(theirs).max())
    check(mine.shape == (T - 1, V), f"our logits cover {mine.shape}")
    check(diff <= 2e-5 * scale, f"max |logit diff| {diff:.3e} <= 2e-5 x max |logit| {scale:.3f}")
    check(abs(loss_mine - loss_theirs) <= 1e-5 * loss_theirs, f"loss ours {loss_mine:.7f}, the folder's {loss_theirs:.7f}")
    theirs16, _ = hf_forward(out16, ids)
    d16 = float(np.abs(mine - theirs16[:-1]).max())
    check(1e-4 * scale < d16 < 0.1 * scale, f"the bf16 folder differs by rounding only ({d16:.3e}; fp32 was {diff:.1e})")

    print("== greedy: the trainer's --sample-temperature 0 sample vs argmax decoding of the folder")
    logged = [json.loads(line) for line in open(os.path.join(run_dir, "log.jsonl"))]
    logged = [r["tokens"] for r in logged if "sample" in r and r.get("step") == 2]
    seq = [50256]
    for _ in range(12):
        seq.append(int(hf_forward(out, seq)[0][-1].argmax()))
    check(logged == [seq[1:]], f"the logged greedy sample {logged[0][:6] if logged else None}... equals the "
          f"folder's argmax chain {seq[1:7]}...")

    print("== refusals")
    r = script("export_hf.py", ckpt, out, "--vocab", VOCAB)
    check(r.returncode != 0 and "--overwrite" in r.stderr, f"export into a used folder refused: {r.stderr.strip()[:120]}")
    before = open(back, "rb").read()
    r = script("import_hf.py", out, back)
    check(r.returncode != 0 and "already exists" in r.stderr and open(back, "rb").read() == before,
          f"import over an existing checkpoint refused, file kept: {r.stderr.strip()[:100]}")
    r = script("export_hf.py", os.path.join(run_dir, "state_00000002.bin"), os.path.join(tmp, "x"))
    check(r.returncode != 0 and "magic" in r.stderr, f"a resume state is refused: {r.stderr.strip()[:120]}")
    bad = os.path.join(tmp, "bad")
    shutil.copytree(out, bad)
    c2 = dict(cfg, activation_function="relu")
    json.dump(c2, open(os.path.join(bad, "config.json"), "w"))
    r = script("import_hf.py", bad, os.path.join(tmp, "b1.bin"))
    check(r.returncode != 0 and "activation_function" in r.stderr, f"relu refused: {r.stderr.strip()[:120]}")
    json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
    stp = os.path.join(bad, "model.safetensors")
    size = os.path.getsize(stp)
    with open(stp, "r+b") as f:
        f.truncate(size - 1000)
    r = script("import_hf.py", bad, os.path.join(tmp, "b2.bin"))
    check(r.returncode != 0 and "data_offsets" in r.stderr and not os.path.exists(os.path.join(tmp, "b2.bin")),
          f"a truncated model.safetensors is refused, nothing written: {r.stderr.strip()[:140]}")
    # an untied head (lm_head.weight != wte) cannot be held by our model; an equal one is accepted
    hdr, tensors = read_st(os.path.join(out, "model.safetensors"))
    tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
    for head, name, ok_expected in ((tensors["transformer.wte.weight"], "tied", True),
                                    (tensors["transformer.wte.weight"] * 0.5, "untied", False)):
        hf_gpt2.write_safetensors(stp, dict(tensors, **{"lm_head.weight": head}))
        dst = os.path.join(tmp, f"head_{name}.bin")
        r = script("import_hf.py", bad, dst)
        if ok_expected:
            check(r.returncode == 0 and open(dst, "rb").read() == raw,
                  f"a file that also holds lm_head.weight == wte imports to the same checkpoint ({r.stderr.strip()})")
        else:
            check(r.returncode != 0 and "untied" in r.stderr, f"an untied lm_head is refused: {r.stderr.strip()[:120]}")
    # GPT2Model naming (no "transformer." prefix), as in the original GPT-2 files
    hf_gpt2.write_safetensors(stp, {k[len("transformer."):]: v for k, v in tensors.items()})
    r = script("import_hf.py", bad, os.path.join(tmp, "bare.bin"))
    check(r.returncode == 0 and open(os.path.join(tmp, "bare.bin"), "rb").read() == raw,
          f"names without the transformer. prefix import the same ({r.stderr.strip() or 'exit 0'})")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
