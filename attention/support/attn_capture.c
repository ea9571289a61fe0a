/*
 * attention/support/attn_capture.c - reader and writer of the attention capture file
 * (format: docs/attn_capture_format.md, API: attn_capture.h).
 *
 * Why it is written this way: capture files come from long runs and from
 * other people's PyTorch code, and a probe that silently evaluates garbage is
 * worse than none. So the header is packed and unpacked field by field in
 * little-endian byte order (no struct punning, no host-endianness surprises),
 * every field is validated before anything is allocated, the file length must
 * match the header exactly, and both header and payload carry a CRC-32 that
 * is the same as Python's zlib.crc32 (so dev/attn_capture.py can write it).
 * Writes go to PATH.tmp and are renamed, so a crash never leaves a file that
 * looks valid but is half-written.
 */
#include "attention/support/attn_capture.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic_file.h"
#include "common/utils.h"

/* ---- header field offsets (the byte-for-byte table of the format doc) ---- */
enum {
    OFF_MAGIC = 0,           /* char[8] "ATTNCAPT" */
    OFF_VERSION = 8,         /* u32 */
    OFF_HEADER_BYTES = 12,   /* u32 = 128 */
    OFF_DTYPE = 16,          /* u32 1 = bf16, 2 = fp32 */
    OFF_FLAGS = 20,          /* u32 bit0 O present, bit1 stats present */
    OFF_B = 24,              /* i32 */
    OFF_NH = 28,             /* i32 */
    OFF_T = 32,              /* i32 */
    OFF_HS = 36,             /* i32 */
    OFF_LAYER = 40,          /* i32, -1 unknown */
    OFF_MODE = 44,           /* u32 AttnMode, 0xFFFFFFFF unknown */
    OFF_STEP = 48,           /* i64, -1 unknown */
    OFF_PAYLOAD_BYTES = 56,  /* u64 */
    OFF_PAYLOAD_CRC = 64,    /* u32 CRC-32 of all payload bytes */
    OFF_RESERVED = 68,       /* 56 bytes, all zero */
    OFF_HEADER_CRC = 124,    /* u32 CRC-32 of bytes 0..123 */
};

/* ---- CRC-32 (reflected, polynomial 0xEDB88320), table built once ---- */
static uint32_t g_crc_table[256];
static int g_crc_table_ready = 0;

static void crc_table_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1u) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
        g_crc_table[n] = c;
    }
    g_crc_table_ready = 1;
}

uint32_t attn_crc32(uint32_t crc, const void* data, size_t n) {
    if (!g_crc_table_ready) crc_table_init();
    const unsigned char* p = (const unsigned char*)data;
    uint32_t c = crc ^ 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = g_crc_table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* ---- little-endian packing ---- */
static void put_u32(unsigned char* b, size_t off, uint32_t v) {
    for (int i = 0; i < 4; i++) b[off + i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char* b, size_t off, uint64_t v) {
    for (int i = 0; i < 8; i++) b[off + i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char* b, size_t off) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)b[off + i] << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char* b, size_t off) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[off + i] << (8 * i);
    return v;
}
static uint16_t le16_to_host(const unsigned char* b) { return (uint16_t)(b[0] | (b[1] << 8)); }
static float le32_to_float(const unsigned char* b) {
    uint32_t u = get_u32(b, 0);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- sizes ---- */
size_t attn_capture_tensor_elems(AttnShape s) {
    return (size_t)s.B * (size_t)s.NH * (size_t)s.T * (size_t)s.HS;
}

static size_t dtype_bytes(AttnCaptureDtype d) { return d == ATTN_CAPTURE_BF16 ? 2 : 4; }

static uint64_t payload_bytes(const AttnCaptureInfo* info) {
    uint64_t n = attn_capture_tensor_elems(info->shape);
    uint64_t tensors = 4 + ((info->flags & ATTN_CAPTURE_HAS_OUT) ? 1 : 0);
    uint64_t bytes = tensors * n * dtype_bytes(info->dtype);
    if (info->flags & ATTN_CAPTURE_HAS_STATS)
        bytes += (uint64_t)info->shape.B * info->shape.NH * info->shape.T * 2 * sizeof(float);
    return bytes;
}

uint64_t attn_capture_file_bytes(const AttnCaptureInfo* info) {
    return ATTN_CAPTURE_HEADER_BYTES + payload_bytes(info);
}

const char* attn_capture_dtype_name(AttnCaptureDtype d) {
    return d == ATTN_CAPTURE_BF16 ? "bf16" : d == ATTN_CAPTURE_FP32 ? "fp32" : "invalid";
}

/* ---- error reporting for the non-dying reader ---- */
static int fail(char* err, size_t err_size, const char* path, const char* fmt, ...) {
    if (err != NULL && err_size > 0) {
        int n = snprintf(err, err_size, "capture file '%s': ", path);
        if (n < 0) n = 0;
        if ((size_t)n < err_size) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + n, err_size - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

/* Validates the shape and the optional fields of an info (shared by the
   reader and the writers). Returns NULL or a static reason. */
static const char* info_problem(const AttnCaptureInfo* info) {
    const AttnShape s = info->shape;
    if (info->dtype != ATTN_CAPTURE_BF16 && info->dtype != ATTN_CAPTURE_FP32)
        return "dtype must be 1 (bf16) or 2 (fp32)";
    if (info->flags & ~ATTN_CAPTURE_KNOWN_FLAGS) return "unknown flag bits set (only bit 0 = O, bit 1 = stats are defined)";
    if (s.B < 1 || s.NH < 1 || s.T < 1 || s.HS < 1) return "B, NH, T and HS must all be >= 1";
    if (s.HS > ATTN_CAPTURE_MAX_HS) return "HS is larger than 1024";
    if (s.T > ATTN_CAPTURE_MAX_T) return "T is larger than 2^20";
    if ((int64_t)s.B * s.NH > ATTN_CAPTURE_MAX_BNH) return "B * NH is larger than 2^20";
    if ((uint64_t)s.B * s.NH * s.T * s.HS > ATTN_CAPTURE_MAX_ELEMS) return "B*NH*T*HS is larger than 2^34 elements";
    if (info->attn_mode != ATTN_CAPTURE_MODE_UNKNOWN && info->attn_mode >= (uint32_t)ATTN_NUM_MODES)
        return "attention mode must be 0..4 (fp32, bf16, repair, gproj, cudnn) or 0xFFFFFFFF (unknown)";
    if (info->layer < -1) return "layer must be >= 0, or -1 for unknown";
    if (info->step < -1) return "step must be >= 0, or -1 for unknown";
    return NULL;
}

static void pack_header(unsigned char* h, const AttnCaptureInfo* info, uint32_t payload_crc) {
    memset(h, 0, ATTN_CAPTURE_HEADER_BYTES);
    memcpy(h + OFF_MAGIC, ATTN_CAPTURE_MAGIC, 8);
    put_u32(h, OFF_VERSION, ATTN_CAPTURE_VERSION);
    put_u32(h, OFF_HEADER_BYTES, ATTN_CAPTURE_HEADER_BYTES);
    put_u32(h, OFF_DTYPE, (uint32_t)info->dtype);
    put_u32(h, OFF_FLAGS, info->flags);
    put_u32(h, OFF_B, (uint32_t)info->shape.B);
    put_u32(h, OFF_NH, (uint32_t)info->shape.NH);
    put_u32(h, OFF_T, (uint32_t)info->shape.T);
    put_u32(h, OFF_HS, (uint32_t)info->shape.HS);
    put_u32(h, OFF_LAYER, (uint32_t)info->layer);
    put_u32(h, OFF_MODE, info->attn_mode);
    put_u64(h, OFF_STEP, (uint64_t)info->step);
    put_u64(h, OFF_PAYLOAD_BYTES, payload_bytes(info));
    put_u32(h, OFF_PAYLOAD_CRC, payload_crc);
    put_u32(h, OFF_HEADER_CRC, attn_crc32(0, h, OFF_HEADER_CRC));
}

/* Parses and validates a header already in memory; file_size is the actual
   length of the file. */
static int parse_header(const unsigned char* h, uint64_t file_size, const char* path,
                        AttnCaptureInfo* info, uint32_t* payload_crc, char* err, size_t err_size) {
    if (memcmp(h + OFF_MAGIC, ATTN_CAPTURE_MAGIC, 8) != 0)
        return fail(err, err_size, path, "bad magic (expected \"ATTNCAPT\"): not an attention capture file; "
                    "write one with dev/attn_capture.py or the trainer's capture option");
    uint32_t version = get_u32(h, OFF_VERSION);
    if (version != ATTN_CAPTURE_VERSION)
        return fail(err, err_size, path, "format version %u, this program reads version %d; "
                    "re-create the file with this checkout's dev/attn_capture.py", version, ATTN_CAPTURE_VERSION);
    uint32_t header_bytes = get_u32(h, OFF_HEADER_BYTES);
    if (header_bytes != ATTN_CAPTURE_HEADER_BYTES)
        return fail(err, err_size, path, "header size field is %u, must be %d: the file is corrupt; re-create it",
                    header_bytes, ATTN_CAPTURE_HEADER_BYTES);
    uint32_t header_crc = get_u32(h, OFF_HEADER_CRC);
    uint32_t want_crc = attn_crc32(0, h, OFF_HEADER_CRC);
    if (header_crc != want_crc)
        return fail(err, err_size, path, "header checksum mismatch (stored 0x%08x, computed 0x%08x): "
                    "the header is corrupt; re-create the file", header_crc, want_crc);
    for (int i = OFF_RESERVED; i < OFF_HEADER_CRC; i++)
        if (h[i] != 0)
            return fail(err, err_size, path, "reserved header byte %d is not zero: written by a newer or "
                        "broken writer; re-create the file with dev/attn_capture.py", i);
    memset(info, 0, sizeof *info);
    info->dtype = (AttnCaptureDtype)get_u32(h, OFF_DTYPE);
    info->flags = get_u32(h, OFF_FLAGS);
    info->shape.B = (int32_t)get_u32(h, OFF_B);
    info->shape.NH = (int32_t)get_u32(h, OFF_NH);
    info->shape.T = (int32_t)get_u32(h, OFF_T);
    info->shape.HS = (int32_t)get_u32(h, OFF_HS);
    info->layer = (int32_t)get_u32(h, OFF_LAYER);
    info->attn_mode = get_u32(h, OFF_MODE);
    info->step = (int64_t)get_u64(h, OFF_STEP);
    const char* problem = info_problem(info);
    if (problem != NULL)
        return fail(err, err_size, path, "invalid header (B=%d NH=%d T=%d HS=%d dtype=%u flags=0x%x): %s",
                    info->shape.B, info->shape.NH, info->shape.T, info->shape.HS, (unsigned)info->dtype,
                    info->flags, problem);
    uint64_t stored_payload = get_u64(h, OFF_PAYLOAD_BYTES);
    uint64_t want_payload = payload_bytes(info);
    if (stored_payload != want_payload)
        return fail(err, err_size, path, "header says %llu payload bytes but its shape and flags imply %llu: "
                    "the file is corrupt; re-create it", (unsigned long long)stored_payload,
                    (unsigned long long)want_payload);
    uint64_t want_file = ATTN_CAPTURE_HEADER_BYTES + want_payload;
    if (file_size != want_file)
        return fail(err, err_size, path, "file is %llu bytes but its header (B=%d NH=%d T=%d HS=%d %s%s%s) implies "
                    "%llu: the file is %s; re-create it", (unsigned long long)file_size, info->shape.B,
                    info->shape.NH, info->shape.T, info->shape.HS, attn_capture_dtype_name(info->dtype),
                    (info->flags & ATTN_CAPTURE_HAS_OUT) ? " +O" : "",
                    (info->flags & ATTN_CAPTURE_HAS_STATS) ? " +stats" : "", (unsigned long long)want_file,
                    file_size < want_file ? "truncated" : "longer than its header says (trailing bytes)");
    *payload_crc = get_u32(h, OFF_PAYLOAD_CRC);
    return 0;
}

/* Opens path, reads and parses its header; on success leaves fp positioned at
   the payload. */
static int open_and_parse(const char* path, FILE** fp_out, AttnCaptureInfo* info, uint32_t* payload_crc,
                          char* err, size_t err_size) {
    *fp_out = NULL;
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) return fail(err, err_size, path, "cannot open: %s; check the path", strerror(errno));
    if (fseeko(fp, 0, SEEK_END) != 0) {
        fclose(fp);
        return fail(err, err_size, path, "cannot seek: %s (is it a regular file?)", strerror(errno));
    }
    off_t size = ftello(fp);
    rewind(fp);
    if (size < 0) {
        fclose(fp);
        return fail(err, err_size, path, "cannot get its size: %s", strerror(errno));
    }
    if ((uint64_t)size < ATTN_CAPTURE_HEADER_BYTES) {
        fclose(fp);
        return fail(err, err_size, path, "only %lld bytes, shorter than the %d-byte header: truncated or not a "
                    "capture file", (long long)size, ATTN_CAPTURE_HEADER_BYTES);
    }
    unsigned char h[ATTN_CAPTURE_HEADER_BYTES];
    if (fread(h, 1, sizeof h, fp) != sizeof h) {
        fclose(fp);
        return fail(err, err_size, path, "short read of the header: %s", strerror(errno));
    }
    if (parse_header(h, (uint64_t)size, path, info, payload_crc, err, err_size) != 0) {
        fclose(fp);
        return -1;
    }
    *fp_out = fp;
    return 0;
}

int attn_capture_read_info(const char* path, AttnCaptureInfo* info, char* err, size_t err_size) {
    FILE* fp;
    uint32_t crc;
    if (open_and_parse(path, &fp, info, &crc, err, err_size) != 0) return -1;
    fclose(fp);
    return 0;
}

/* Reads n elements of a tensor in the file's dtype into floats, updating crc. */
static int read_tensor(FILE* fp, AttnCaptureDtype dtype, size_t n, float* dst, unsigned char* scratch,
                       size_t scratch_elems, uint32_t* crc) {
    size_t eb = dtype_bytes(dtype);
    for (size_t done = 0; done < n;) {
        size_t chunk = n - done < scratch_elems ? n - done : scratch_elems;
        if (fread(scratch, eb, chunk, fp) != chunk) return -1;
        *crc = attn_crc32(*crc, scratch, chunk * eb);
        for (size_t i = 0; i < chunk; i++)
            dst[done + i] = (eb == 2) ? bf16_bits_to_float(le16_to_host(scratch + 2 * i))
                                      : le32_to_float(scratch + 4 * i);
        done += chunk;
    }
    return 0;
}

void attn_capture_alloc(AttnCapture* cap, const AttnCaptureInfo* info) {
    memset(cap, 0, sizeof *cap);
    cap->info = *info;
    size_t n = attn_capture_tensor_elems(info->shape);
    cap->q = (float*)callocCheck(n, sizeof(float));
    cap->k = (float*)callocCheck(n, sizeof(float));
    cap->v = (float*)callocCheck(n, sizeof(float));
    cap->dout = (float*)callocCheck(n, sizeof(float));
    if (info->flags & ATTN_CAPTURE_HAS_OUT) cap->out = (float*)callocCheck(n, sizeof(float));
    if (info->flags & ATTN_CAPTURE_HAS_STATS) cap->stats = (float*)callocCheck(attn_stats_count(info->shape), sizeof(float));
}

void attn_capture_free(AttnCapture* cap) {
    free(cap->q);
    free(cap->k);
    free(cap->v);
    free(cap->dout);
    free(cap->out);
    free(cap->stats);
    memset(cap, 0, sizeof *cap);
}

int attn_capture_read(const char* path, AttnCapture* cap, char* err, size_t err_size) {
    memset(cap, 0, sizeof *cap);
    FILE* fp;
    AttnCaptureInfo info;
    uint32_t stored_crc;
    if (open_and_parse(path, &fp, &info, &stored_crc, err, err_size) != 0) return -1;
    attn_capture_alloc(cap, &info);
    size_t n = attn_capture_tensor_elems(info.shape);
    const size_t scratch_elems = 1 << 16;
    unsigned char* scratch = (unsigned char*)mallocCheck(scratch_elems * 4);
    float* tensors[5] = {cap->q, cap->k, cap->v, cap->dout, cap->out};
    const char* names[5] = {"Q", "K", "V", "dO", "O"};
    int ntensors = (info.flags & ATTN_CAPTURE_HAS_OUT) ? 5 : 4;
    uint32_t crc = 0;
    int rc = 0;
    for (int t = 0; t < ntensors && rc == 0; t++)
        if (read_tensor(fp, info.dtype, n, tensors[t], scratch, scratch_elems, &crc) != 0)
            rc = fail(err, err_size, path, "short read of tensor %s: the file changed while reading or is "
                      "unreadable; re-create it", names[t]);
    if (rc == 0 && (info.flags & ATTN_CAPTURE_HAS_STATS))
        if (read_tensor(fp, ATTN_CAPTURE_FP32, attn_stats_count(info.shape), cap->stats, scratch, scratch_elems,
                        &crc) != 0)
            rc = fail(err, err_size, path, "short read of the stats: re-create the file");
    if (rc == 0 && crc != stored_crc)
        rc = fail(err, err_size, path, "payload checksum mismatch (stored 0x%08x, computed 0x%08x): the tensor "
                  "data is corrupt; re-create the file", stored_crc, crc);
    free(scratch);
    fclose(fp);
    if (rc != 0) attn_capture_free(cap);
    return rc;
}

void attn_capture_load(const char* path, AttnCapture* cap) {
    char err[1024];
    if (attn_capture_read(path, cap, err, sizeof err) != 0) die("%s", err);
}

/* ---- writing ---- */

/* A writer streams elements into a buffer, CRCs and writes it in chunks. */
typedef struct {
    AtomicFile file; /* PATH.tmp until sink_close renames it */
    const char* path;
    unsigned char* buf;
    size_t used, cap;
    uint32_t crc;
} Sink;

/* Any write failure removes PATH.tmp (the previous PATH stays) and dies. */
static void sink_write_or_die(Sink* s, const void* data, size_t n) {
    if (fwrite(data, 1, n, s->file.fp) != n) {
        int saved = errno;
        atomic_file_abort(&s->file);
        die("writing capture file '%s' failed: %s\n  hint: is the disk full?", s->path, strerror(saved));
    }
}

static void sink_flush(Sink* s) {
    if (s->used == 0) return;
    s->crc = attn_crc32(s->crc, s->buf, s->used);
    sink_write_or_die(s, s->buf, s->used);
    s->used = 0;
}
static void sink_u16(Sink* s, uint16_t v) {
    if (s->used + 2 > s->cap) sink_flush(s);
    s->buf[s->used++] = (unsigned char)(v & 0xFF);
    s->buf[s->used++] = (unsigned char)(v >> 8);
}
static void sink_f32(Sink* s, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (s->used + 4 > s->cap) sink_flush(s);
    put_u32(s->buf, s->used, u);
    s->used += 4;
}
static void sink_value(Sink* s, AttnCaptureDtype d, float x) {
    if (d == ATTN_CAPTURE_BF16) sink_u16(s, float_to_bf16_bits(x));
    else sink_f32(s, x);
}

/* Opens PATH.tmp and reserves the header (written last, once the CRC is known). */
static void sink_open(Sink* s, const char* path) {
    memset(s, 0, sizeof *s);
    char err[1024];
    if (atomic_file_open(&s->file, path, err, sizeof err) == NULL)
        die("cannot write capture file '%s': %s\n  hint: check the folder exists and is writable", path, err);
    s->path = path;
    s->cap = 1 << 20;
    s->buf = (unsigned char*)mallocCheck(s->cap);
    unsigned char zeros[ATTN_CAPTURE_HEADER_BYTES] = {0};
    sink_write_or_die(s, zeros, sizeof zeros);
}

static void sink_close(Sink* s, const AttnCaptureInfo* info) {
    sink_flush(s);
    free(s->buf);
    unsigned char h[ATTN_CAPTURE_HEADER_BYTES];
    pack_header(h, info, s->crc);
    if (fseek(s->file.fp, 0, SEEK_SET) != 0) {
        int saved = errno;
        atomic_file_abort(&s->file);
        die("cannot seek in capture file '%s': %s", s->path, strerror(saved));
    }
    sink_write_or_die(s, h, sizeof h);
    char err[1024];
    if (atomic_file_commit(&s->file, err, sizeof err) != 0)
        die("cannot finish capture file '%s': %s\n  hint: is the disk full, is the folder writable?", s->path, err);
}

static void check_info_or_die(const AttnCaptureInfo* info, const char* path) {
    const char* problem = info_problem(info);
    if (problem != NULL)
        die("refusing to write capture file '%s' (B=%d NH=%d T=%d HS=%d): %s", path, info->shape.B,
            info->shape.NH, info->shape.T, info->shape.HS, problem);
}

void attn_capture_write(const char* path, const AttnCapture* cap) {
    const AttnCaptureInfo* info = &cap->info;
    check_info_or_die(info, path);
    if (!cap->q || !cap->k || !cap->v || !cap->dout)
        die("attn_capture_write('%s'): Q, K, V and dO must all be present", path);
    if ((info->flags & ATTN_CAPTURE_HAS_OUT) && !cap->out)
        die("attn_capture_write('%s'): flags say O is present but cap->out is NULL", path);
    if ((info->flags & ATTN_CAPTURE_HAS_STATS) && !cap->stats)
        die("attn_capture_write('%s'): flags say stats are present but cap->stats is NULL", path);
    Sink s;
    sink_open(&s, path);
    size_t n = attn_capture_tensor_elems(info->shape);
    const float* tensors[5] = {cap->q, cap->k, cap->v, cap->dout, cap->out};
    int ntensors = (info->flags & ATTN_CAPTURE_HAS_OUT) ? 5 : 4;
    for (int t = 0; t < ntensors; t++)
        for (size_t i = 0; i < n; i++) sink_value(&s, info->dtype, tensors[t][i]);
    if (info->flags & ATTN_CAPTURE_HAS_STATS) {
        size_t ns = attn_stats_count(info->shape);
        for (size_t i = 0; i < ns; i++) sink_f32(&s, cap->stats[i]);
    }
    sink_close(&s, info);
}

/* ---- module layout <-> capture layout ---- */
/* Index of element d of (b, h, t) in the capture layout [B, NH, T, HS]. */
static size_t cap_index(AttnShape s, int b, int h, int t) {
    return (((size_t)b * s.NH + h) * s.T + t) * s.HS;
}
/* Index of the q (which=0), k (1) or v (2) row of (b, t, h) in qkv [B,T,3,NH,HS]. */
static size_t qkv_index(AttnShape s, int b, int t, int which, int h) {
    return ((((size_t)b * s.T + t) * 3 + which) * s.NH + h) * s.HS;
}
/* Index of (b, t, h) in out / dout [B, T, NH, HS]. */
static size_t out_index(AttnShape s, int b, int t, int h) {
    return (((size_t)b * s.T + t) * s.NH + h) * s.HS;
}

void attn_capture_write_module_bf16(const char* path, const AttnCaptureInfo* info_in, const uint16_t* qkv,
                                    const uint16_t* out, const float* stats, const uint16_t* dout) {
    AttnCaptureInfo info = *info_in;
    info.flags = (out ? ATTN_CAPTURE_HAS_OUT : 0u) | (stats ? ATTN_CAPTURE_HAS_STATS : 0u);
    if (info.dtype != ATTN_CAPTURE_BF16)
        die("attn_capture_write_module_bf16('%s'): info.dtype must be ATTN_CAPTURE_BF16 (the buffers are BF16)", path);
    check_info_or_die(&info, path);
    if (!qkv || !dout) die("attn_capture_write_module_bf16('%s'): qkv and dout are required", path);
    const AttnShape s = info.shape;
    Sink sink;
    sink_open(&sink, path);
    /* Q, K, V, dO, [O] in that order, each walked in [B, NH, T, HS] order. */
    const uint16_t* sources[5] = {qkv, qkv, qkv, dout, out};
    int ntensors = out ? 5 : 4;
    for (int tensor = 0; tensor < ntensors; tensor++)
        for (int b = 0; b < s.B; b++)
            for (int h = 0; h < s.NH; h++)
                for (int t = 0; t < s.T; t++) {
                    size_t base = tensor < 3 ? qkv_index(s, b, t, tensor, h) : out_index(s, b, t, h);
                    const uint16_t* row = sources[tensor] + base;
                    for (int d = 0; d < s.HS; d++) sink_u16(&sink, row[d]);
                }
    if (stats) {
        size_t ns = attn_stats_count(s);
        for (size_t i = 0; i < ns; i++) sink_f32(&sink, stats[i]);
    }
    sink_close(&sink, &info);
}

void attn_capture_to_module(const AttnCapture* cap, float* qkv, float* out, float* dout) {
    const AttnShape s = cap->info.shape;
    const size_t row_bytes = (size_t)s.HS * sizeof(float);
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int t = 0; t < s.T; t++) {
                size_t c = cap_index(s, b, h, t);
                memcpy(qkv + qkv_index(s, b, t, 0, h), cap->q + c, row_bytes);
                memcpy(qkv + qkv_index(s, b, t, 1, h), cap->k + c, row_bytes);
                memcpy(qkv + qkv_index(s, b, t, 2, h), cap->v + c, row_bytes);
                if (dout) memcpy(dout + out_index(s, b, t, h), cap->dout + c, row_bytes);
                if (out && cap->out) memcpy(out + out_index(s, b, t, h), cap->out + c, row_bytes);
            }
}

void attn_capture_from_module(AttnCapture* cap, const float* qkv, const float* out, const float* dout) {
    const AttnShape s = cap->info.shape;
    const size_t row_bytes = (size_t)s.HS * sizeof(float);
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int t = 0; t < s.T; t++) {
                size_t c = cap_index(s, b, h, t);
                memcpy(cap->q + c, qkv + qkv_index(s, b, t, 0, h), row_bytes);
                memcpy(cap->k + c, qkv + qkv_index(s, b, t, 1, h), row_bytes);
                memcpy(cap->v + c, qkv + qkv_index(s, b, t, 2, h), row_bytes);
                if (dout) memcpy(cap->dout + c, dout + out_index(s, b, t, h), row_bytes);
                if (out && cap->out) memcpy(cap->out + c, out + out_index(s, b, t, h), row_bytes);
            }
}
