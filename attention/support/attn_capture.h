/*
 * attention/support/attn_capture.h - the attention capture file: one attention call's
 * inputs (Q, K, V, dO) and optionally its outputs (O, softmax stats), saved
 * from a training run (or from PyTorch) so the probe can replay every mode on
 * exactly those tensors against an fp64 reference.
 *
 * Why a file format of its own: the question "did BF16 attention spoil this
 * run?" is answered on inputs captured late in real runs (keys drifted far
 * from zero), and those inputs come from our trainer as well as from other
 * people's PyTorch code. So the format is small, fixed, little-endian and
 * documented byte for byte in docs/attn_capture_format.md; dev/attn_capture.py
 * writes and reads the same bytes with numpy (or torch tensors).
 *
 * Layout on disk: a 128-byte header, then Q, K, V, dO, [O] each [B, NH, T, HS]
 * row-major in the header's dtype (bf16 or fp32), then [stats] [B, NH, T, 2]
 * fp32 (always fp32, meaning as in attention.h for the run's mode). The header
 * carries a CRC-32 of itself and one of the payload, so a corrupt file is
 * rejected instead of silently evaluated.
 *
 * Offers:
 *   attn_capture_read   - read + validate; returns 0, or -1 with a one-line
 *                         reason naming the file and the fix (for tests/tools)
 *   attn_capture_load   - the same, but dies with that message
 *   attn_capture_write  - write an in-memory capture (values held as float,
 *                         rounded to BF16 on the way out if dtype is bf16);
 *                         written to PATH.tmp and renamed, never half-written
 *   attn_capture_write_module_bf16 - write straight from the module's own
 *                         buffers (qkv [B,T,3,NH,HS] etc. as BF16 bits copied
 *                         from the GPU), for the trainer's capture steps
 *   attn_capture_to_module / attn_capture_from_module - convert between the
 *                         file's [B,NH,T,HS] tensors and the module's layout
 *   attn_capture_free, attn_crc32
 */
#ifndef ATTENTION_ATTN_CAPTURE_H
#define ATTENTION_ATTN_CAPTURE_H

#include <stddef.h>
#include <stdint.h>
#include "attention/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_CAPTURE_MAGIC "ATTNCAPT"        /* 8 bytes at offset 0, no terminator on disk */
#define ATTN_CAPTURE_VERSION 1
#define ATTN_CAPTURE_HEADER_BYTES 128

/* Element type of Q, K, V, dO and O in the file (stats are always fp32). */
typedef enum { ATTN_CAPTURE_BF16 = 1, ATTN_CAPTURE_FP32 = 2 } AttnCaptureDtype;

/* flags: which optional tensors follow dO. */
#define ATTN_CAPTURE_HAS_OUT 0x1u
#define ATTN_CAPTURE_HAS_STATS 0x2u
#define ATTN_CAPTURE_KNOWN_FLAGS (ATTN_CAPTURE_HAS_OUT | ATTN_CAPTURE_HAS_STATS)

/* attn_mode value meaning "not from one of our runs" (e.g. a PyTorch dump). */
#define ATTN_CAPTURE_MODE_UNKNOWN 0xFFFFFFFFu

/* Sanity limits the reader enforces (a garbage header must not make us
   allocate terabytes). Generous next to anything the module runs. */
#define ATTN_CAPTURE_MAX_HS 1024
#define ATTN_CAPTURE_MAX_T (1 << 20)
#define ATTN_CAPTURE_MAX_BNH (1 << 20)            /* B * NH */
#define ATTN_CAPTURE_MAX_ELEMS (1ull << 34)        /* per tensor */

/* What the header says (besides magic, sizes and checksums). */
typedef struct {
    AttnCaptureDtype dtype;
    AttnShape shape;        /* B, NH, T, HS */
    int32_t layer;          /* transformer layer the call came from, -1 unknown */
    int64_t step;           /* training step, -1 unknown */
    uint32_t attn_mode;     /* AttnMode of the run that produced it, or ATTN_CAPTURE_MODE_UNKNOWN */
    uint32_t flags;         /* ATTN_CAPTURE_HAS_OUT | ATTN_CAPTURE_HAS_STATS */
} AttnCaptureInfo;

/* A capture in memory. Tensors are [B, NH, T, HS] floats (BF16 files widen
   exactly); stats [B, NH, T, 2]. out / stats are NULL when absent. */
typedef struct {
    AttnCaptureInfo info;
    float* q;
    float* k;
    float* v;
    float* dout;
    float* out;
    float* stats;
} AttnCapture;

/* Elements of one [B, NH, T, HS] tensor. */
size_t attn_capture_tensor_elems(AttnShape s);
/* Exact file size the header implies (header + payload). */
uint64_t attn_capture_file_bytes(const AttnCaptureInfo* info);
/* "bf16" / "fp32" */
const char* attn_capture_dtype_name(AttnCaptureDtype d);

/* Reads and validates everything: magic, version, header size, header CRC,
   dtype, flags, reserved bytes, dims (each >= 1 and within the limits above),
   mode, file length == the length the header implies, payload CRC.
   On failure returns -1, writes a one-line reason (naming the path and what to
   do) into err (if err != NULL), and leaves cap zeroed. */
int attn_capture_read(const char* path, AttnCapture* cap, char* err, size_t err_size);
/* attn_capture_read that dies with the reason. */
void attn_capture_load(const char* path, AttnCapture* cap);
/* Reads only the header (validated as above, except the payload CRC). */
int attn_capture_read_info(const char* path, AttnCaptureInfo* info, char* err, size_t err_size);

/* Writes cap (info.flags decide whether out / stats are written; they must then
   be non-NULL). Dies on a bad argument or an I/O error. Written to PATH.tmp,
   then renamed over PATH. */
void attn_capture_write(const char* path, const AttnCapture* cap);

/* Writes directly from the attention module's buffers, as BF16 bits:
   qkv [B,T,3,NH,HS], dout [B,T,NH,HS], out [B,T,NH,HS] (or NULL),
   stats [B,NH,T,2] fp32 (or NULL). info->dtype must be ATTN_CAPTURE_BF16;
   info->flags is set from which pointers are non-NULL. */
void attn_capture_write_module_bf16(const char* path, const AttnCaptureInfo* info,
                                    const uint16_t* qkv, const uint16_t* out,
                                    const float* stats, const uint16_t* dout);

/* Module layout <-> capture tensors. to_module fills qkv [B,T,3,NH,HS] and
   dout [B,T,NH,HS] (and out if both cap->out and out are non-NULL).
   from_module fills cap->q/k/v/dout (and cap->out if both are non-NULL) from
   the module's buffers; arrays must already be allocated. */
void attn_capture_to_module(const AttnCapture* cap, float* qkv, float* out, float* dout);
void attn_capture_from_module(AttnCapture* cap, const float* qkv, const float* out, const float* dout);

/* Allocates q/k/v/dout (and out/stats per info->flags), zero-filled. */
void attn_capture_alloc(AttnCapture* cap, const AttnCaptureInfo* info);
void attn_capture_free(AttnCapture* cap);

/* CRC-32 (the zlib/PNG polynomial 0xEDB88320, init and final xor 0xFFFFFFFF),
   continued from crc (start with 0): the same value as Python's zlib.crc32. */
uint32_t attn_crc32(uint32_t crc, const void* data, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* ATTENTION_ATTN_CAPTURE_H */
