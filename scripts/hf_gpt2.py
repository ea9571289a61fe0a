"""
scripts/hf_gpt2.py - the mapping between our model files and a Hugging Face
transformers GPT-2 folder, shared by scripts/export_hf.py and scripts/import_hf.py.

Why: the two commands must agree on every name, shape, transpose and padding
rule, so those live here once. Only numpy and the standard library are used
(Debian has both), so exporting needs neither torch nor the safetensors package:
the safetensors file is written and read directly.

Our model file (model/checkpoint.h, llm.c's layout): int32 header[256]
(magic 20240326, version 3 = fp32 or 5 = bf16, maxT, V, L, NH, C, Vp), then the
parameters in model/gpt_config.c's table order, all layers of one tensor
together: wte (Vp, C), wpe (maxT, C), ln1w, ln1b, qkvw (L, 3C, C), qkvb,
attprojw (L, C, C), attprojb, ln2w, ln2b, fcw (L, 4C, C), fcb, fcprojw (L, C, 4C),
fcprojb, lnfw, lnfb. Matrices are (out, in), as nn.Linear.

transformers' GPT2LMHeadModel: transformer.wte.weight (V, C), transformer.wpe.weight,
transformer.h.N.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}.{weight,bias},
transformer.ln_f.{weight,bias}. Its projections are Conv1D modules whose weight is
(in, out): the transpose of ours. lm_head.weight is tied to wte
(tie_word_embeddings), and save_pretrained leaves it out of model.safetensors
(safetensors cannot hold two names for one storage); from_pretrained ties it
back. So the export leaves it out too, and the import accepts a file with or
without it (with it, it must equal wte: our model has no separate head).

Vocab: our wte has Vp rows (50304 for GPT-2, a multiple of 128 for fast
matmuls); rows >= V are padding that the model never reads. The export keeps
the first V rows; the import pads back to the next multiple of 128 with zero
rows (llm.c's rule; our trainer also keeps those rows at zero).

safetensors: u64 little-endian header length N, N bytes of JSON
{name: {"dtype": "F32"|"BF16", "shape": [...], "data_offsets": [begin, end]},
"__metadata__": {"format": "pt"}} (padded with spaces to a multiple of 8), then
the raw little-endian tensors; offsets count from the end of the header.

Offers: read_checkpoint, write_checkpoint, to_hf_tensors, from_hf_tensors,
write_safetensors, read_safetensors, fp32_to_bf16_bits, bf16_bits_to_fp32,
hf_config, config_from_hf, padded_vocab, gpt2_vocab_files, HFError, cli_parser, run_cli.
"""
import argparse
import hashlib
import json
import os
import re
import struct
import sys

try:
    import numpy as np
except ImportError:
    sys.exit("error: numpy is needed to read and write checkpoints (Debian: apt-get install python3-numpy; "
             "pip: pip install numpy)")

CHECKPOINT_MAGIC = 20240326
VERSION_FP32, VERSION_BF16 = 3, 5
HEADER_INTS = 256
GPT2_VOCAB = 50257
EOT = 50256
# Our table, in file order: name, per-layer (1) or not (0), HF suffix, transposed for HF's Conv1D.
TABLE = [
    ("wte", 0, "wte.weight", False), ("wpe", 0, "wpe.weight", False),
    ("ln1w", 1, "ln_1.weight", False), ("ln1b", 1, "ln_1.bias", False),
    ("qkvw", 1, "attn.c_attn.weight", True), ("qkvb", 1, "attn.c_attn.bias", False),
    ("attprojw", 1, "attn.c_proj.weight", True), ("attprojb", 1, "attn.c_proj.bias", False),
    ("ln2w", 1, "ln_2.weight", False), ("ln2b", 1, "ln_2.bias", False),
    ("fcw", 1, "mlp.c_fc.weight", True), ("fcb", 1, "mlp.c_fc.bias", False),
    ("fcprojw", 1, "mlp.c_proj.weight", True), ("fcprojb", 1, "mlp.c_proj.bias", False),
    ("lnfw", 0, "ln_f.weight", False), ("lnfb", 0, "ln_f.bias", False),
]
HF_PREFIX = "transformer."
ST_DTYPES = {"F32": (np.dtype("<f4"), 4), "BF16": (np.dtype("<u2"), 2), "F16": (np.dtype("<f2"), 2)}


class HFError(Exception):
    """A problem with an input file: the message names the file and what to do."""


def shapes(cfg):
    """{our name: per-layer shape} for cfg = dict(maxT, V, L, NH, C, Vp)."""
    C = cfg["C"]
    return {"wte": (cfg["Vp"], C), "wpe": (cfg["maxT"], C), "ln1w": (C,), "ln1b": (C,), "qkvw": (3 * C, C),
            "qkvb": (3 * C,), "attprojw": (C, C), "attprojb": (C,), "ln2w": (C,), "ln2b": (C,), "fcw": (4 * C, C),
            "fcb": (4 * C,), "fcprojw": (C, 4 * C), "fcprojb": (C,), "lnfw": (C,), "lnfb": (C,)}


def padded_vocab(V):
    """The next multiple of 128 at or above V (50304 for GPT-2's 50257), as llm.c pads."""
    return (V + 127) // 128 * 128


# ---------------------------------------------------------------- bf16

def fp32_to_bf16_bits(a):
    """uint16 bf16 bits of float32 array a: round to nearest, ties to even (a carry past the
    largest finite value gives Inf); a NaN stays a quiet NaN of the same sign (attention_common.c's rule)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (bits & 0x7F800000) == 0x7F800000
    nan &= (bits & 0x007FFFFF) != 0
    return np.where(nan, ((bits >> 16) | 0x0040).astype(np.uint16), rounded)


def bf16_bits_to_fp32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------- our model file

def read_bytes(path):
    """The whole file, or an HFError naming it."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise HFError(f"{path}: cannot read: {e.strerror}")


def read_checkpoint(path):
    """(cfg dict, {our name: float32 array with a leading layer axis for per-layer tensors}, version)."""
    raw = read_bytes(path)
    if len(raw) < HEADER_INTS * 4:
        raise HFError(f"{path}: {len(raw)} bytes, shorter than the 1024-byte model header: not a model checkpoint")
    h = np.frombuffer(raw, dtype="<i4", count=HEADER_INTS)
    if h[0] != CHECKPOINT_MAGIC:
        raise HFError(f"{path}: magic {h[0]} at offset 0, expected {CHECKPOINT_MAGIC}: not a model checkpoint "
                      "(a resume state state_*.bin? pass the model_*.bin next to it)")
    version = int(h[1])
    if version == 6:
        raise HFError(f"{path}: version 6 at offset 4 is a model with non-GPT-2 options (docs/modern_stacks.md); "
                      "the GPT2LMHeadModel export supports GPT-2's options only (versions 3 and 5)")
    if version not in (VERSION_FP32, VERSION_BF16):
        raise HFError(f"{path}: version {version} at offset 4; supported are 3 (fp32) and 5 (bf16)")
    cfg = dict(maxT=int(h[2]), V=int(h[3]), L=int(h[4]), NH=int(h[5]), C=int(h[6]), Vp=int(h[7]))
    if min(cfg.values()) < 1 or cfg["C"] % cfg["NH"] or cfg["Vp"] < cfg["V"]:
        raise HFError(f"{path}: header holds an impossible shape {cfg}")
    sh = shapes(cfg)
    counts = [(name, layered, int(np.prod(sh[name])) * (cfg["L"] if layered else 1)) for name, layered, _, _ in TABLE]
    n = sum(c for _, _, c in counts)
    width = 4 if version == VERSION_FP32 else 2
    want = HEADER_INTS * 4 + n * width
    if len(raw) != want:
        raise HFError(f"{path}: {len(raw)} bytes, expected {want} (1024-byte header + {n} {'fp32' if width == 4 else 'bf16'}"
                      f" parameters for {cfg}): the file is {'truncated' if len(raw) < want else 'too long'}")
    if version == VERSION_FP32:
        flat = np.frombuffer(raw, dtype="<f4", offset=HEADER_INTS * 4).astype(np.float32)
    else:
        flat = bf16_bits_to_fp32(np.frombuffer(raw, dtype="<u2", offset=HEADER_INTS * 4))
    tensors, off = {}, 0
    for name, layered, count in counts:
        shape = ((cfg["L"],) if layered else ()) + sh[name]
        tensors[name] = flat[off:off + count].reshape(shape)
        off += count
    return cfg, tensors, version


def write_checkpoint(path, cfg, tensors, bf16=False):
    """Writes our model file (version 3, or 5 with bf16) to path.tmp, fsyncs, renames over path."""
    sh = shapes(cfg)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [CHECKPOINT_MAGIC, VERSION_BF16 if bf16 else VERSION_FP32, cfg["maxT"], cfg["V"], cfg["L"],
                  cfg["NH"], cfg["C"], cfg["Vp"]]
    parts = []
    for name, layered, _, _ in TABLE:
        want = ((cfg["L"],) if layered else ()) + sh[name]
        t = np.asarray(tensors[name], dtype=np.float32)
        if t.shape != want:
            raise HFError(f"internal: tensor {name} has shape {t.shape}, expected {want}")
        parts.append(fp32_to_bf16_bits(t).astype("<u2") if bf16 else t.astype("<f4"))
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            for p in parts:
                f.write(np.ascontiguousarray(p).tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise HFError(f"{path}: cannot write: {e.strerror}")


# ---------------------------------------------------------------- name mapping

def to_hf_tensors(cfg, tensors):
    """{HF name: float32 array} of GPT2LMHeadModel (no lm_head.weight: tied), vocab cut to V."""
    out = {}
    for name, layered, suffix, transpose in TABLE:
        t = tensors[name]
        if name == "wte":
            t = t[:cfg["V"]]
        if not layered:
            out[HF_PREFIX + suffix] = np.ascontiguousarray(t)
            continue
        for layer in range(cfg["L"]):
            x = t[layer].T if transpose else t[layer]
            out[f"{HF_PREFIX}h.{layer}.{suffix}"] = np.ascontiguousarray(x)
    return out


def hf_expected_shapes(cfg):
    """{HF name: shape} that to_hf_tensors produces (and from_hf_tensors expects)."""
    sh, out = shapes(cfg), {}
    for name, layered, suffix, transpose in TABLE:
        s = sh[name]
        if name == "wte":
            s = (cfg["V"], cfg["C"])
        if transpose:
            s = s[::-1]
        if not layered:
            out[HF_PREFIX + suffix] = s
        else:
            for layer in range(cfg["L"]):
                out[f"{HF_PREFIX}h.{layer}.{suffix}"] = s
    return out


def from_hf_tensors(cfg, hf, where):
    """Our tensors from {HF name: float32 array}. Accepts names with or without the "transformer."
    prefix (GPT2Model vs GPT2LMHeadModel) and an lm_head.weight equal to wte. `where` names the file."""
    named = {}
    for k, v in hf.items():
        named[k[len(HF_PREFIX):] if k.startswith(HF_PREFIX) else k] = v
    head = named.pop("lm_head.weight", None)
    # Buffers some transformers versions saved with the weights (the causal mask): not parameters.
    for k in [k for k in named if re.fullmatch(r"h\.\d+\.attn\.(bias|masked_bias)", k)]:
        named.pop(k)
    want = {k[len(HF_PREFIX):]: s for k, s in hf_expected_shapes(cfg).items()}
    missing = sorted(set(want) - set(named), key=_natural)
    extra = sorted(set(named) - set(want), key=_natural)
    if missing or extra:
        raise HFError(f"{where}: tensors do not match a GPT-2 of {cfg}: missing {missing[:6]}"
                      f"{' ...' if len(missing) > 6 else ''}, unexpected {extra[:6]}{' ...' if len(extra) > 6 else ''}")
    for k, s in want.items():
        if tuple(named[k].shape) != tuple(s):
            raise HFError(f"{where}: tensor {k} has shape {list(named[k].shape)}, config.json implies {list(s)}")
    if head is not None and not np.array_equal(head.reshape(named["wte.weight"].shape), named["wte.weight"]):
        raise HFError(f"{where}: lm_head.weight differs from transformer.wte.weight (an untied head); our model "
                      "ties the output head to the token embedding, so it cannot hold this model")
    sh, out = shapes(cfg), {}
    for name, layered, suffix, transpose in TABLE:
        if not layered:
            t = named[suffix]
            if name == "wte":
                t = np.concatenate([t, np.zeros((cfg["Vp"] - cfg["V"], cfg["C"]), dtype=np.float32)])
            out[name] = t
        else:
            out[name] = np.stack([named[f"h.{layer}.{suffix}"].T if transpose else named[f"h.{layer}.{suffix}"]
                                  for layer in range(cfg["L"])]).reshape((cfg["L"],) + sh[name])
    return out


def _natural(s):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


# ---------------------------------------------------------------- safetensors

def write_safetensors(path, tensors, dtype="fp32", metadata=None):
    """Writes {name: float32 array} as F32 or BF16 (dtype "fp32"|"bf16") to path.tmp, then renames."""
    blobs, header, off = [], {}, 0
    for name, t in tensors.items():
        if dtype == "bf16":
            data, st = fp32_to_bf16_bits(t).astype("<u2").tobytes(), "BF16"
        else:
            data, st = np.ascontiguousarray(t, dtype="<f4").tobytes(), "F32"
        header[name] = {"dtype": st, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = dict(metadata or {}, format="pt")
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the safetensors library writes it
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_safetensors(path):
    """{name: float32 array} of a safetensors file (F32, BF16 or F16 tensors), every offset checked."""
    raw = read_bytes(path)
    if len(raw) < 8:
        raise HFError(f"{path}: {len(raw)} bytes: too short for a safetensors file (8-byte header length)")
    (n,) = struct.unpack_from("<Q", raw, 0)
    if n > len(raw) - 8:
        raise HFError(f"{path}: header length {n} at offset 0 runs past the end of the file ({len(raw)} bytes): "
                      "not a safetensors file, or truncated")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFError(f"{path}: the JSON header (offsets 8..{8 + n}) does not parse: {e}")
    if not isinstance(header, dict):
        raise HFError(f"{path}: the JSON header (offsets 8..{8 + n}) is not an object of tensors")
    header.pop("__metadata__", None)
    data = memoryview(raw)[8 + n:]
    out, ends = {}, []
    for name, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise HFError(f"{path}: header entry {name!r} lacks dtype, shape or data_offsets")
        dt = info.get("dtype")
        if dt not in ST_DTYPES:
            raise HFError(f"{path}: tensor {name} has dtype {dt}; supported are F32, BF16 and F16")
        npdt, width = ST_DTYPES[dt]
        shape = [int(s) for s in info["shape"]]
        b, e = (int(x) for x in info["data_offsets"])
        count = int(np.prod(shape)) if shape else 1
        if not 0 <= b <= e <= len(data) or e - b != count * width:
            raise HFError(f"{path}: tensor {name}: data_offsets [{b}, {e}] do not hold {shape} x {dt} inside the "
                          f"{len(data)} data bytes (file offset {8 + n + b}): the file is damaged or truncated")
        a = np.frombuffer(data[b:e], dtype=npdt)
        a = bf16_bits_to_fp32(a) if dt == "BF16" else a.astype(np.float32)
        out[name] = a.reshape(shape)
        ends.append((b, e))
    ends.sort()
    for (b0, e0), (b1, _) in zip(ends, ends[1:]):
        if b1 < e0:
            raise HFError(f"{path}: two tensors share data bytes {b1}..{e0}: the file is damaged")
    return out


# ---------------------------------------------------------------- config.json and tokenizer

def hf_config(cfg, dtype):
    """config.json of a GPT2LMHeadModel for our shape. Dropout 0: our trainer has none."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg["V"], "n_positions": cfg["maxT"], "n_ctx": cfg["maxT"], "n_embd": cfg["C"],
        "n_layer": cfg["L"], "n_head": cfg["NH"], "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": True, "use_cache": True,
        "bos_token_id": EOT, "eos_token_id": EOT, "torch_dtype": "bfloat16" if dtype == "bf16" else "float32",
    }


def config_from_hf(path):
    """Our cfg dict from an HF config.json; refuses what our model cannot compute the same way."""
    try:
        with open(path) as f:
            c = json.load(f)
    except OSError as e:
        raise HFError(f"{path}: cannot read: {e.strerror} (a transformers model folder holds config.json)")
    except json.JSONDecodeError as e:
        raise HFError(f"{path}: not valid JSON: {e}")
    if c.get("model_type") != "gpt2":
        raise HFError(f"{path}: model_type is {c.get('model_type')!r}; only GPT-2 (\"gpt2\") maps onto our model")
    try:
        C, L, NH = int(c["n_embd"]), int(c["n_layer"]), int(c["n_head"])
        V, T = int(c["vocab_size"]), int(c["n_positions"])
    except (KeyError, TypeError, ValueError) as e:
        raise HFError(f"{path}: missing or bad GPT-2 field {e}")
    # What our model hardcodes: tanh GELU, 4C MLP, LayerNorm eps 1e-5, 1/sqrt(head size) scores, a tied head.
    checks = [
        (c.get("activation_function", "gelu_new") in ("gelu_new", "gelu_pytorch_tanh"),
         f"activation_function {c.get('activation_function')!r} (ours is the tanh GELU, gelu_new)"),
        (c.get("n_inner") in (None, 4 * C), f"n_inner {c.get('n_inner')} (ours is 4 * n_embd = {4 * C})"),
        (abs(float(c.get("layer_norm_epsilon", 1e-5)) - 1e-5) <= 1e-12,
         f"layer_norm_epsilon {c.get('layer_norm_epsilon')} (ours is 1e-5)"),
        (c.get("scale_attn_weights", True) is True, "scale_attn_weights false (ours scales by 1/sqrt(head size))"),
        (not c.get("scale_attn_by_inverse_layer_idx", False), "scale_attn_by_inverse_layer_idx true"),
        (C % NH == 0, f"n_embd {C} not a multiple of n_head {NH}"),
    ]
    for ok, what in checks:
        if not ok:
            raise HFError(f"{path}: {what}: our model computes this differently, so it cannot continue this model")
    return dict(maxT=T, V=V, L=L, NH=NH, C=C, Vp=padded_vocab(V)), c


def _setup_sha(var):
    """The sha256 scripts/setup_data.sh verifies (ENCODER_SHA, VOCAB_SHA): one place holds them."""
    setup = os.path.join(os.path.dirname(os.path.abspath(__file__)), "setup_data.sh")
    with open(setup) as f:
        m = re.search(rf"^{var}=([0-9a-f]{{64}})$", f.read(), re.M)
    if not m:
        raise HFError(f"{setup}: no {var}= line (the GPT-2 vocab hashes live there)")
    return m.group(1)


def gpt2_vocab_files(vocab_dir):
    """(encoder.json bytes, vocab.bpe bytes) from vocab_dir, checked against setup_data.sh's sha256."""
    out = []
    for name, var in (("encoder.json", "ENCODER_SHA"), ("vocab.bpe", "VOCAB_SHA")):
        p = os.path.join(vocab_dir, name)
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError as e:
            raise HFError(f"{p}: cannot read: {e.strerror} (run scripts/setup_data.sh, or pass --vocab DIR holding "
                          "GPT-2's encoder.json and vocab.bpe, or --vocab '' to write no tokenizer)")
        got = hashlib.sha256(data).hexdigest()
        if got != _setup_sha(var):
            raise HFError(f"{p}: sha256 {got} is not GPT-2's {name} (scripts/setup_data.sh lists the expected one)")
        out.append(data)
    return tuple(out)


def cli_parser(description, source, dest):
    """The two commands' arguments: SOURCE DEST, --dtype fp32|bf16 and --overwrite (each adds its own)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument(source)
    ap.add_argument(dest)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--overwrite", action="store_true")
    return ap


def run_cli(prog, fn, *args):
    """fn(*args) as a command's exit status: 0, or 1 with "PROG: error: MESSAGE" on stderr for an HFError."""
    try:
        fn(*args)
    except HFError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    return 0
