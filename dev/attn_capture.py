#!/usr/bin/env python3
"""dev/attn_capture.py - write and read attention capture files from Python.

Why: the probe (build/attn_probe --capture FILE) replays every attention mode
on captured Q, K, V, dO against an fp64 reference. Our trainer writes capture
files itself; this module lets anyone dump the same file from PyTorch or numpy
(for example from a hook around their own attention call) and read one back.
The format is docs/attn_capture_format.md; the C side is attention/support/attn_capture.c.
Needs numpy; torch tensors are accepted (converted on the CPU) but torch is
not required.

    import torch, attn_capture
    # q, k, v, do: [B, NH, T, HS] (the layout of torch SDPA); any float dtype
    attn_capture.write_capture("layer7.attncap", q, k, v, do, layer=7, step=12000)
    cap = attn_capture.read_capture("layer7.attncap")   # dict of float32 arrays

Command line:
    python3 dev/attn_capture.py info FILE...           print the header(s)
    python3 dev/attn_capture.py selftest-write FILE bf16|fp32   (used by tests)
    python3 dev/attn_capture.py selftest-check FILE bf16|fp32   (used by tests)
"""
import os
import struct
import sys
import zlib

import numpy as np

MAGIC = b"ATTNCAPT"
VERSION = 1
HEADER_BYTES = 128
DTYPES = {"bf16": 1, "fp32": 2}
DTYPE_NAMES = {1: "bf16", 2: "fp32"}
FLAG_OUT = 0x1
FLAG_STATS = 0x2
MODES = {"fp32": 0, "bf16": 1, "repair": 2, "gproj": 3, "cudnn": 4}  # attention.h AttnMode
MODE_NAMES = {v: k for k, v in MODES.items()}
MODE_UNKNOWN = 0xFFFFFFFF
# Header fields from offset 8 to 68 (after the magic, before the reserved bytes),
# little-endian: version, header_bytes, dtype, flags, B, NH, T, HS, layer, mode,
# step, payload_bytes, payload_crc32. Bytes 68..123 are zero; 124..127 hold the
# CRC-32 of bytes 0..123.
HEADER_FIELDS = struct.Struct("<IIIIiiiiiIqQI")
assert 8 + HEADER_FIELDS.size == 68


def _to_numpy(x):
    """A numpy float32 array from a numpy array or a torch tensor (any dtype)."""
    if x is None:
        return None
    if type(x).__module__.startswith("torch"):
        import torch  # only when given a tensor
        x = x.detach().to(device="cpu", dtype=torch.float32).numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def float_to_bf16_bits(a):
    """Round-to-nearest-even float32 -> BF16 bit patterns (uint16); NaN stays NaN."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    quiet_nan = ((u >> 16) | 0x40).astype(np.uint16)
    return np.where(np.isnan(a), quiet_nan, rounded).astype(np.uint16)


def bf16_bits_to_float(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _payload_bytes(shape, dtype_code, flags):
    B, NH, T, HS = shape
    n = B * NH * T * HS
    elem = 2 if dtype_code == DTYPES["bf16"] else 4
    total = (5 if flags & FLAG_OUT else 4) * n * elem
    if flags & FLAG_STATS:
        total += B * NH * T * 2 * 4
    return total


def write_capture(path, q, k, v, dout, out=None, stats=None, dtype="bf16", layer=-1, step=-1,
                  attn_mode=None, layout="bhtd"):
    """Writes one capture file.

    q, k, v, dout (and out): [B, NH, T, HS] for layout="bhtd" (torch SDPA), or
    [B, T, NH, HS] for layout="bthd" (flash-attn / our module's out layout).
    stats: optional [B, NH, T, 2] float32 softmax statistics (meaning per
    attention.h for attn_mode). dtype: "bf16" (values rounded to nearest even)
    or "fp32". attn_mode: None (unknown) or "fp32"|"bf16"|"repair"|"gproj"|"cudnn".
    The file is written to PATH.tmp and renamed.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'bf16' or 'fp32', got {dtype!r}")
    if layout not in ("bhtd", "bthd"):
        raise ValueError(f"layout must be 'bhtd' ([B,NH,T,HS]) or 'bthd' ([B,T,NH,HS]), got {layout!r}")
    tensors = [_to_numpy(t) for t in (q, k, v, dout, out)]
    for name, t in zip(("q", "k", "v", "dout", "out"), tensors):
        if t is not None and t.ndim != 4:
            raise ValueError(f"{name} must have 4 dims, got shape {t.shape}")
    if layout == "bthd":
        tensors = [None if t is None else np.ascontiguousarray(t.transpose(0, 2, 1, 3)) for t in tensors]
    shape = tensors[0].shape
    for name, t in zip(("k", "v", "dout", "out"), tensors[1:]):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} has shape {t.shape}, q has {shape}: all must match")
    B, NH, T, HS = shape
    stats_np = _to_numpy(stats)
    if stats_np is not None and stats_np.shape != (B, NH, T, 2):
        raise ValueError(f"stats must have shape {(B, NH, T, 2)}, got {stats_np.shape}")
    if attn_mode is None:
        mode_code = MODE_UNKNOWN
    elif attn_mode in MODES:
        mode_code = MODES[attn_mode]
    else:
        raise ValueError(f"attn_mode must be None or one of {list(MODES)}, got {attn_mode!r}")
    if layer < -1 or step < -1:
        raise ValueError("layer and step must be >= 0, or -1 for unknown")
    flags = (FLAG_OUT if tensors[4] is not None else 0) | (FLAG_STATS if stats_np is not None else 0)
    dtype_code = DTYPES[dtype]

    chunks = []
    for t in tensors:
        if t is None:
            continue
        if dtype == "bf16":
            chunks.append(float_to_bf16_bits(t).astype("<u2").tobytes())
        else:
            chunks.append(t.astype("<f4").tobytes())
    if stats_np is not None:
        chunks.append(stats_np.astype("<f4").tobytes())
    crc = 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
    payload = sum(len(c) for c in chunks)
    assert payload == _payload_bytes(shape, dtype_code, flags)
    header = bytearray(HEADER_BYTES)
    header[0:8] = MAGIC
    header[8:68] = HEADER_FIELDS.pack(VERSION, HEADER_BYTES, dtype_code, flags, B, NH, T, HS, layer, mode_code,
                                      step, payload, crc)
    header[124:128] = struct.pack("<I", zlib.crc32(bytes(header[:124])))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


def read_header(path):
    """Parses and validates the header; returns a dict (raises ValueError naming the file)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        h = f.read(HEADER_BYTES)
    if len(h) < HEADER_BYTES:
        raise ValueError(f"{path}: only {len(h)} bytes, shorter than the {HEADER_BYTES}-byte header")
    if h[0:8] != MAGIC:
        raise ValueError(f"{path}: bad magic {h[0:8]!r}, not an attention capture file")
    (version, header_bytes, dtype_code, flags, B, NH, T, HS, layer, mode_code, step, payload,
     payload_crc) = HEADER_FIELDS.unpack(h[8:68])
    if version != VERSION:
        raise ValueError(f"{path}: format version {version}, this reader knows {VERSION}")
    if header_bytes != HEADER_BYTES:
        raise ValueError(f"{path}: header size field {header_bytes}, must be {HEADER_BYTES}")
    (stored_hcrc,) = struct.unpack("<I", h[124:128])
    if stored_hcrc != zlib.crc32(h[:124]):
        raise ValueError(f"{path}: header checksum mismatch, the header is corrupt")
    if any(h[68:124]):
        raise ValueError(f"{path}: reserved header bytes are not zero")
    if dtype_code not in DTYPE_NAMES:
        raise ValueError(f"{path}: dtype {dtype_code} is neither 1 (bf16) nor 2 (fp32)")
    if flags & ~(FLAG_OUT | FLAG_STATS):
        raise ValueError(f"{path}: unknown flag bits 0x{flags:x}")
    if min(B, NH, T, HS) < 1:
        raise ValueError(f"{path}: dims B={B} NH={NH} T={T} HS={HS} must all be >= 1")
    if mode_code != MODE_UNKNOWN and mode_code not in MODE_NAMES:
        raise ValueError(f"{path}: attention mode {mode_code} unknown")
    want = _payload_bytes((B, NH, T, HS), dtype_code, flags)
    if payload != want or size != HEADER_BYTES + want:
        raise ValueError(f"{path}: file is {size} bytes, header implies {HEADER_BYTES + want} "
                         f"(payload field {payload}): truncated or corrupt")
    return dict(dtype=DTYPE_NAMES[dtype_code], flags=flags, shape=(B, NH, T, HS), layer=layer,
                attn_mode=MODE_NAMES.get(mode_code), step=step, payload_bytes=payload, payload_crc=payload_crc)


def read_capture(path):
    """Reads a capture file: dict with the header fields plus float32 arrays
    q, k, v, dout ([B,NH,T,HS]), out (or None), stats ([B,NH,T,2] or None)."""
    info = read_header(path)
    B, NH, T, HS = info["shape"]
    n = B * NH * T * HS
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        payload = f.read()
    if zlib.crc32(payload) != info["payload_crc"]:
        raise ValueError(f"{path}: payload checksum mismatch, the tensor data is corrupt")
    elem = 2 if info["dtype"] == "bf16" else 4
    names = ["q", "k", "v", "dout"] + (["out"] if info["flags"] & FLAG_OUT else [])
    pos = 0
    cap = dict(info)
    cap["out"] = None
    cap["stats"] = None
    for name in names:
        raw = payload[pos:pos + n * elem]
        pos += n * elem
        if elem == 2:
            arr = bf16_bits_to_float(np.frombuffer(raw, dtype="<u2"))
        else:
            arr = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        cap[name] = arr.reshape(B, NH, T, HS)
    if info["flags"] & FLAG_STATS:
        cap["stats"] = np.frombuffer(payload[pos:], dtype="<f4").astype(np.float32).reshape(B, NH, T, 2)
    return cap


# ---- self-test pattern shared with tests/test_attn_capture.c (selftest_value there) ----
SELFTEST_SHAPE = (2, 3, 5, 4)
SELFTEST_LAYER = 7
SELFTEST_STEP = 123456789012
SELFTEST_MODE = "gproj"


def selftest_tensor(tensor_index, shape=SELFTEST_SHAPE):
    """((i*37 + t*11) % 201 - 100) / 16 * 2^t, t = tensor index: exact in BF16,
    except tensor 4 (O), divided by 3 in float32 so that writing it as BF16
    exercises the rounding (which must agree with the C side's)."""
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    vals = ((i * 37 + tensor_index * 11) % 201 - 100).astype(np.float32) / np.float32(16.0)
    vals = vals * np.float32(2.0 ** tensor_index)
    if tensor_index == 4:
        vals = vals / np.float32(3.0)
    return vals.reshape(shape)


def _as_stored(a, dtype):
    return bf16_bits_to_float(float_to_bf16_bits(a)).reshape(a.shape) if dtype == "bf16" else a


def selftest_stats(shape=SELFTEST_SHAPE):
    B, NH, T, _ = shape
    i = np.arange(B * NH * T * 2, dtype=np.float32)
    return (i * np.float32(0.25) - np.float32(3.0)).reshape(B, NH, T, 2)


def _selftest_write(path, dtype):
    t = [selftest_tensor(j) for j in range(5)]
    write_capture(path, t[0], t[1], t[2], t[3], out=t[4], stats=selftest_stats(), dtype=dtype,
                  layer=SELFTEST_LAYER, step=SELFTEST_STEP, attn_mode=SELFTEST_MODE)


def _selftest_check(path, dtype):
    cap = read_capture(path)
    problems = []
    if cap["shape"] != SELFTEST_SHAPE:
        problems.append(f"shape {cap['shape']}")
    if (cap["dtype"], cap["layer"], cap["step"], cap["attn_mode"]) != (dtype, SELFTEST_LAYER, SELFTEST_STEP,
                                                                       SELFTEST_MODE):
        problems.append(f"header {cap['dtype']} {cap['layer']} {cap['step']} {cap['attn_mode']}")
    for j, name in enumerate(["q", "k", "v", "dout", "out"]):
        if cap[name] is None or not np.array_equal(cap[name], _as_stored(selftest_tensor(j), dtype)):
            problems.append(f"tensor {name} differs")
    if cap["stats"] is None or not np.array_equal(cap["stats"], selftest_stats()):
        problems.append("stats differ")
    if problems:
        print(f"selftest-check {path}: " + "; ".join(problems))
        return 1
    print(f"selftest-check {path}: ok")
    return 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "info":
        for p in argv[1:]:
            print(p, read_header(p))
        return 0
    if len(argv) == 3 and argv[0] == "selftest-write":
        _selftest_write(argv[1], argv[2])
        return 0
    if len(argv) == 3 and argv[0] == "selftest-check":
        return _selftest_check(argv[1], argv[2])
    print(__doc__.split("Command line:")[1].rstrip())
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
