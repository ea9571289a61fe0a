#!/usr/bin/env python3
"""
dev/hf_parity.py - our model against transformers' GPT2LMHeadModel, both ways (run by dev/hf_parity.sh).

Why: scripts/export_hf.py and scripts/import_hf.py claim that a model means the
same thing on both sides. This checks that claim against transformers itself
(the CPU test tests/test_hf_export.py checks it against a stand-in, since CI has
no transformers). Our side is our CPU model code: build/model_logits (logits and
loss of the trainers' forward, fp32 attention) and build/train_gpt_cpu's greedy
sampler (--sample-temperature 0, --attn fp32). The GPU trainer is not used for
these numbers: its matmuls are BF16, so its logits differ from any fp32 model by
~1e-2 and could not show a mapping error of that size; dev/parity_gpu.cu ties it
to the CPU model.

Cases (transformers runs in fp32 on the CPU; with a GPU also on it, TF32 off):
  (i)   transformers builds a random GPT2LMHeadModel (L2 C64 NH4, n_positions 256,
        vocab 50257; every bias and LayerNorm weight perturbed so that each tensor
        matters), save_pretrained -> import_hf -> our logits and loss on 256 data
        tokens vs transformers'. Also: export_hf(import_hf(folder)) holds exactly
        the tensor names, shapes and values of transformers' own model.safetensors.
  (ii)  our trainer's checkpoint (preset small, a few fp32-attention steps on the
        data) -> export_hf -> from_pretrained (no missing or unexpected tensors, the
        head tied) -> logits and loss vs ours, and generate(greedy) vs the greedy
        sample our trainer logged for that same checkpoint.
  (ii-bf16) the same checkpoint exported with --dtype bf16, against our model on
        the checkpoint rounded to bf16 by our writer (same weights on both sides).
  tokenizer: AutoTokenizer on the exported folder encodes a text as build/tokenize does.

Tolerance: both sides compute in fp32 and differ only in summation order, so
max |logit diff| <= 2e-5 * max |logit| (tests/test_twin_parity.py's bound for the
same comparison against the PyTorch twin) and |loss diff| <= 1e-5 * loss.

Usage: dev/hf_parity.py OUTDIR RUN_DIR SHARD VOCAB_DIR  (dev/hf_parity.sh prepares them)
Writes OUTDIR/hf_parity.md; exits 1 on any mismatch.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import export_hf  # noqa: E402
import hf_gpt2 as hf  # noqa: E402
import import_hf  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel  # noqa: E402

LOGIT_TOL, LOSS_TOL = 2e-5, 1e-5
WEIGHT_STD = 0.1  # case (i)'s weights: std 0.1 gives greedy decoding ~20 distinct tokens in 64
MODEL_LOGITS = os.path.join(REPO, "build", "model_logits")
TOKENIZE = os.path.join(REPO, "build", "tokenize")
TRAINER = os.path.join(REPO, "build", "train_gpt_cpu")

rows, failures, checks = [], [], []
t_start = time.time()


def say(msg):
    print(f"[{time.time() - t_start:6.1f} s] {msg}", flush=True)


def check(ok, what):
    say(("ok    " if ok else "FAIL  ") + what)
    checks.append(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
    return ok


def ours(checkpoint, tokens, work):
    """Our CPU model's logits [n-1][V] and loss on tokens (int32 array), via build/model_logits."""
    tok_path, out_path = os.path.join(work, "tokens.i32"), os.path.join(work, "logits.f32")
    tokens.astype("<i4").tofile(tok_path)
    r = subprocess.run([MODEL_LOGITS, checkpoint, tok_path, out_path, "--attn", "fp32"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"build/model_logits failed: {r.stderr.strip()}")
    info = json.loads(r.stdout)
    return np.fromfile(out_path, dtype=np.float32).reshape(info["positions"], info["vocab"]), info["loss"]


def theirs(model, tokens, device):
    """transformers' logits [n-1][V] (the positions ours has) and loss with labels = ids."""
    ids = torch.from_numpy(tokens.astype(np.int64))[None].to(device)
    with torch.no_grad():
        out = model.to(device)(ids, labels=ids)
    return out.logits[0, :-1].float().cpu().numpy(), float(out.loss)


def compare(case, ckpt, model, tokens, work, greedy="n/a"):
    mine, loss_mine = ours(ckpt, tokens, work)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        other, loss_other = theirs(model, tokens, dev)
        diff = float(np.abs(mine - other).max())
        scale = float(np.abs(other).max())
        name = f"{case} [{dev}]"
        ok_l = check(diff <= LOGIT_TOL * scale, f"{name}: max |logit diff| {diff:.3e} <= {LOGIT_TOL} x max |logit| "
                     f"{scale:.3f} = {LOGIT_TOL * scale:.3e}")
        ok_s = check(abs(loss_mine - loss_other) <= LOSS_TOL * abs(loss_other),
                     f"{name}: loss ours {loss_mine:.7f} vs transformers {loss_other:.7f}")
        rows.append((name, f"{diff:.3e}", f"{scale:.3f}", f"{loss_mine:.7f}", f"{loss_other:.7f}",
                     greedy if dev == "cpu" else "n/a", "yes" if ok_l and ok_s else "NO"))
    model.to("cpu")


def logged_greedy(run_dir, step):
    """The greedy sample our trainer logged at `step` (log.jsonl), or None."""
    recs = [json.loads(line) for line in open(os.path.join(run_dir, "log.jsonl"))]
    recs = [r for r in recs if "sample" in r and r.get("step") == step]
    return recs[0]["tokens"] if len(recs) == 1 else None


def check_generate(case, model, our_greedy):
    """transformers' greedy generate after <|endoftext|> against our sampler's tokens; returns the table cell."""
    if not our_greedy:
        check(False, f"{case}: our trainer logged no greedy sample to compare generate with")
        return "n (no sample of ours)"
    with torch.no_grad():
        gen = model.generate(torch.tensor([[hf.EOT]]), max_new_tokens=len(our_greedy), do_sample=False,
                             pad_token_id=hf.EOT)[0, 1:].tolist()
    # generate stops at eos_token_id (<|endoftext|>); our sampler does not: compare what both produced.
    stopped = len(gen) < len(our_greedy) and gen[-1:] == [hf.EOT]
    equal = gen == our_greedy[:len(gen)] and (len(gen) == len(our_greedy) or stopped)
    check(equal, f"{case}: greedy generate ({len(gen)} tokens{', stopped at <|endoftext|>' if stopped else ''}, "
          f"{len(set(gen))} distinct) equals our sampler at temperature 0 ({len(our_greedy)} tokens): "
          f"ours {our_greedy[:10]}..., theirs {gen[:10]}...")
    return f"{'y' if equal else 'n'} ({len(gen)} tokens)"


def load(folder):
    try:
        model, info = GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    except TypeError:
        model, info = GPT2LMHeadModel.from_pretrained(folder), {}
    model = model.float().eval()  # fp32 compute, whatever default dtype this transformers version picks
    # lm_head.weight is tied; attn.bias / attn.masked_bias are causal-mask buffers older versions list
    missing = [k for k in info.get("missing_keys", [])
               if k != "lm_head.weight" and not k.endswith((".attn.bias", ".attn.masked_bias"))]
    unexpected = list(info.get("unexpected_keys", [])) + list(info.get("mismatched_keys", []))
    check(not missing and not unexpected, f"from_pretrained({os.path.basename(folder)}): missing {missing}, "
          f"unexpected/mismatched {unexpected}")
    check(model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(),
          f"from_pretrained({os.path.basename(folder)}): lm_head is tied to wte")
    return model


def save(model, folder):
    try:
        model.save_pretrained(folder, safe_serialization=True)
    except TypeError:  # versions where safetensors is the only format
        model.save_pretrained(folder)


def main():
    out, run_dir, shard, vocab = sys.argv[1:5]
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    say(f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"cuda {'yes: ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no'}")
    data = np.fromfile(shard, dtype=np.uint16, offset=1024).astype(np.int64)
    tokens = data[1000:1256]  # 256 tokens: n_positions of both models

    # ---- (i) transformers -> ours
    torch.manual_seed(1234)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=256, vocab_size=50257)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        # Every tensor drawn afresh, larger than GPT-2's init: biases are 0 and LayerNorm weights 1 at init (a
        # mapping error there would not show), and with std 0.02 greedy decoding repeats one token.
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_((0.1 if p.dim() == 1 else WEIGHT_STD) * torch.randn_like(p))
    hf_i = os.path.join(work, "hf_i")
    save(model, hf_i)
    say(f"(i) transformers saved {sorted(os.listdir(hf_i))}")
    ck_i = os.path.join(work, "from_hf_i.bin")
    import_hf.import_folder(hf_i, ck_i, overwrite=True, log=say)
    # our greedy sampler on exactly these weights: one training step at lr 0 (AdamW then moves nothing)
    run_i = os.path.join(work, "run_i")
    r = subprocess.run([TRAINER, "--init-from", ck_i, "--attn", "fp32", "--steps", "1", "--lr", "0",
                        "--weight-decay", "0", "--batch-size", "1", "--seq-len", "256", "--train-data", shard,
                        "--val-data", "", "--vocab", "", "--sample-every", "1", "--sample-tokens", "64",
                        "--sample-temperature", "0", "--log-every", "1", "--overwrite", "--out-dir", run_i],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"build/train_gpt_cpu --init-from {ck_i} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    unchanged = open(os.path.join(run_i, "model_00000001.bin"), "rb").read() == open(ck_i, "rb").read()
    check(unchanged, "(i) the lr-0 step left the imported weights bit for bit unchanged")
    greedy = check_generate("(i)", model, logged_greedy(run_i, 1))
    compare("(i) transformers -> import_hf -> ours", ck_i, model, tokens, work, greedy=greedy)
    # export(import(transformers' file)) == transformers' file, name for name, bit for bit
    theirs_st = hf.read_safetensors(os.path.join(hf_i, "model.safetensors"))
    theirs_st = {k: v for k, v in theirs_st.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    back = os.path.join(work, "hf_i_back")
    export_hf.export(ck_i, back, vocab="", overwrite=True, log=say)
    mine_st = hf.read_safetensors(os.path.join(back, "model.safetensors"))
    check(sorted(mine_st) == sorted(theirs_st), f"(i) export_hf writes transformers' tensor names "
          f"(ours only: {sorted(set(mine_st) - set(theirs_st))}, theirs only: {sorted(set(theirs_st) - set(mine_st))})")
    same = all(k in mine_st and mine_st[k].shape == v.shape and np.array_equal(mine_st[k], v)
               for k, v in theirs_st.items())
    check(same, "(i) export_hf(import_hf(folder)) tensors equal transformers' own, shape and bits")

    # ---- (ii) ours -> transformers
    ckpts = sorted(f for f in os.listdir(run_dir) if f.startswith("model_") and f.endswith(".bin"))
    ck_ii = os.path.join(run_dir, ckpts[-1])
    step = int(ckpts[-1][6:14])
    our_greedy = logged_greedy(run_dir, step)
    if not check(our_greedy is not None, f"(ii) the trainer logged one greedy sample at step {step}"):
        return finish(out)
    hf_ii = os.path.join(work, "hf_ii")
    export_hf.export(ck_ii, hf_ii, vocab=vocab, overwrite=True, log=say)
    model = load(hf_ii)
    greedy = check_generate("(ii)", model, our_greedy)
    compare("(ii) our trainer -> export_hf fp32 -> transformers", ck_ii, model, tokens, work, greedy=greedy)

    hf_b = os.path.join(work, "hf_ii_bf16")
    export_hf.export(ck_ii, hf_b, dtype="bf16", vocab=vocab, overwrite=True, log=say)
    ck_b = os.path.join(work, "ours_bf16.bin")
    c, t, _ = hf.read_checkpoint(ck_ii)
    hf.write_checkpoint(ck_b, c, t, bf16=True)
    compare("(ii-bf16) our trainer -> export_hf bf16 -> transformers", ck_b, load(hf_b), tokens, work)

    # ---- tokenizer files
    tok = AutoTokenizer.from_pretrained(hf_ii)
    text = "Call me Ishmael. Some years ago\u2014never mind how long precisely\u2014I thought I would sail.\n  caf\u00e9 42"
    r = subprocess.run([TOKENIZE, "--vocab", vocab, "--ids"], input=text, capture_output=True, text=True)
    ids_ours = [int(x) for x in r.stdout.split()] if r.returncode == 0 else None
    ids_theirs = tok.encode(text)
    check(ids_ours is not None and ids_theirs == ids_ours, f"tokenizer: AutoTokenizer on the export encodes as "
          f"build/tokenize ({len(ids_theirs)} ids{'' if r.returncode == 0 else '; tokenize failed: ' + r.stderr}); "
          f"vocab {len(tok)}")
    check(tok.decode(tokens[:64].tolist()) != "" and len(tok) == hf.GPT2_VOCAB, "tokenizer: 50257 tokens, decodes data")
    finish(out)


def finish(out):
    with open(os.path.join(out, "hf_parity.md"), "w") as f:
        f.write("# transformers parity (dev/hf_parity.sh)\n\n")
        f.write(f"transformers {transformers.__version__}, torch {torch.__version__}; tolerance: max |logit diff| <= "
                f"{LOGIT_TOL} x max |logit|, |loss diff| <= {LOSS_TOL} x loss (fp32 on both sides)\n\n")
        f.write("| case | max abs logit diff | max abs logit | loss ours | loss transformers | greedy tokens equal | "
                "pass |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write("| " + " | ".join(r) + " |\n")
        f.write("\nChecks:\n\n" + "".join(f"- {c}\n" for c in checks))
        f.write(f"\n{len(checks) - len(failures)} passed, {len(failures)} failed\n")
    say(f"wrote {os.path.join(out, 'hf_parity.md')}: {len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
