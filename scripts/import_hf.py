#!/usr/bin/env python3
"""
scripts/import_hf.py - writes a locally saved transformers GPT-2 model as one of our model files.

Why: a GPT-2-shaped model from transformers (save_pretrained, or a downloaded GPT-2
folder) can then be continued by our trainers with --init-from CHECKPOINT. The reverse
of scripts/export_hf.py (scripts/hf_gpt2.py holds the mapping): Conv1D weights are
transposed back to (out, in), the vocab is padded back to the next multiple of 128
with zero rows (50257 -> 50304), and the config is checked for anything our model
computes differently (activation, MLP width, LayerNorm epsilon, attention scaling, an
untied head), which is refused rather than silently changed. Needs only numpy.

Usage: scripts/import_hf.py HF_DIR CHECKPOINT [--dtype fp32|bf16] [--overwrite]
  HF_DIR      a folder with config.json and model.safetensors (save_pretrained with
              safe_serialization=True, the default in current transformers)
  CHECKPOINT  the model file to write (llm.c layout; version 3 fp32 by default, 5 with bf16)
  --overwrite replace an existing CHECKPOINT (otherwise it is refused)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2 as hf  # noqa: E402


def import_folder(hf_dir, checkpoint, dtype="fp32", overwrite=False, log=print):
    cfg, _ = hf.config_from_hf(os.path.join(hf_dir, "config.json"))
    st = os.path.join(hf_dir, "model.safetensors")
    if not os.path.exists(st):
        others = [n for n in ("model.safetensors.index.json", "pytorch_model.bin") if os.path.exists(os.path.join(hf_dir, n))]
        hint = (f" (it holds {', '.join(others)}: save it again with save_pretrained(dir, safe_serialization=True, "
                "max_shard_size=\"100GB\") for one model.safetensors)") if others else ""
        raise hf.HFError(f"{st}: no such file{hint}")
    if os.path.exists(checkpoint) and not overwrite:
        raise hf.HFError(f"{checkpoint}: already exists; pass --overwrite to replace it, or choose another path")
    tensors = hf.from_hf_tensors(cfg, hf.read_safetensors(st), st)
    hf.write_checkpoint(checkpoint, cfg, tensors, bf16=(dtype == "bf16"))
    log(f"import_hf: {hf_dir} (L{cfg['L']} C{cfg['C']} NH{cfg['NH']} context {cfg['maxT']}, vocab {cfg['V']}) -> "
        f"{checkpoint} ({dtype}, vocab padded to {cfg['Vp']}); continue it with --init-from {checkpoint}")
    return cfg


def main():
    a = hf.cli_parser("Write a transformers GPT-2 folder as our model file.", "hf_dir", "checkpoint").parse_args()
    return hf.run_cli("import_hf", import_folder, a.hf_dir, a.checkpoint, a.dtype, a.overwrite)


if __name__ == "__main__":
    sys.exit(main())
