#!/usr/bin/env python3
"""
scripts/export_hf.py - writes one of our model files as a Hugging Face transformers model folder.

Why: a model trained here should load with GPT2LMHeadModel.from_pretrained(OUTDIR)
(and AutoTokenizer.from_pretrained(OUTDIR)) without any conversion code on the other
side. Needs only numpy: the safetensors file is written directly (scripts/hf_gpt2.py
holds the format, the name mapping and the transposes).

Usage: scripts/export_hf.py CHECKPOINT OUTDIR [--dtype fp32|bf16] [--vocab DIR] [--overwrite]
  CHECKPOINT  our model file (model_NNNNNNNN.bin, llm.c layout, fp32 or bf16; or llm.c's own)
  OUTDIR      gets config.json, model.safetensors and, for GPT-2's 50257-token vocab,
              vocab.json, merges.txt and tokenizer_config.json (GPT2Tokenizer)
  --dtype     tensor type in model.safetensors (default fp32; bf16 = round to nearest even)
  --vocab     folder with GPT-2's encoder.json and vocab.bpe (default .cache/gpt2, the files
              scripts/setup_data.sh fetched and verified); "" = write no tokenizer files
  --overwrite replace an existing export in OUTDIR (otherwise it is refused)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2 as hf  # noqa: E402

OUTPUTS = ("config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json")


def write_bytes(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def export(checkpoint, outdir, dtype="fp32", vocab=".cache/gpt2", overwrite=False, log=print):
    cfg, tensors, version = hf.read_checkpoint(checkpoint)
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise hf.HFError(f"{outdir}: exists and is not a folder")
    present = [n for n in OUTPUTS if os.path.exists(os.path.join(outdir, n))]
    if present and not overwrite:
        raise hf.HFError(f"{outdir}: already holds {', '.join(present)}; pass --overwrite to replace them, "
                         "or choose another OUTDIR")
    tok = None
    if vocab:
        if cfg["V"] == hf.GPT2_VOCAB:
            tok = hf.gpt2_vocab_files(vocab)
        else:
            log(f"export_hf: vocab size {cfg['V']} is not GPT-2's {hf.GPT2_VOCAB}: no tokenizer files written")
    pad = tensors["wte"][cfg["V"]:]
    if pad.size and (pad != 0).any():
        # The model never reads these rows (never embedded, masked out of the softmax), so nothing is lost.
        log(f"export_hf: note: wte rows {cfg['V']}..{cfg['Vp'] - 1} (vocab padding) are not zero; they are "
            "not exported (the model never reads them)")
    os.makedirs(outdir, exist_ok=True)
    hf.write_safetensors(os.path.join(outdir, "model.safetensors"), hf.to_hf_tensors(cfg, tensors), dtype)
    config = hf.hf_config(cfg, dtype)
    write_bytes(os.path.join(outdir, "config.json"), (json.dumps(config, indent=2) + "\n").encode())
    if tok is not None:
        write_bytes(os.path.join(outdir, "vocab.json"), tok[0])
        write_bytes(os.path.join(outdir, "merges.txt"), tok[1])
        tc = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": cfg["maxT"], "add_prefix_space": False,
              "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
        write_bytes(os.path.join(outdir, "tokenizer_config.json"), (json.dumps(tc, indent=2) + "\n").encode())
    log(f"export_hf: {checkpoint} (version {version}, L{cfg['L']} C{cfg['C']} NH{cfg['NH']} context {cfg['maxT']}, "
        f"vocab {cfg['V']} of {cfg['Vp']} rows) -> {outdir} ({dtype}{', GPT-2 tokenizer' if tok else ''})")
    return cfg


def main():
    ap = hf.cli_parser("Write our model file as a transformers GPT2LMHeadModel folder.", "checkpoint", "outdir")
    ap.add_argument("--vocab", default=".cache/gpt2")
    a = ap.parse_args()
    return hf.run_cli("export_hf", export, a.checkpoint, a.outdir, a.dtype, a.vocab, a.overwrite)


if __name__ == "__main__":
    sys.exit(main())
