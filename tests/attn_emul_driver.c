/*
 * tests/attn_emul_driver.c - runs one mode of the CPU attention emulation on
 * inputs from a file and writes its outputs to a file, for the independent
 * PyTorch emulation in tests/test_attention_torch.py to compare against.
 *
 * Why a driver: the PyTorch check must exercise exactly the C functions the
 * trainer and the GPU tests use (attention_forward_cpu / _backward_cpu), with
 * nothing reimplemented in between.
 *
 * Usage: attn_emul_driver MODE IO SHIFT B NH T HS IN OUT
 *   MODE  fp32|bf16|repair|gproj;  IO  fp32|bf16 (AttnIO);  SHIFT 0|1
 *   IN    float32 little-endian: qkv [B,T,3,NH,HS] then dout [B,T,NH,HS]
 *   OUT   float32: out [B,T,NH,HS], stats [B,NH,T,2], dqkv [B,T,3,NH,HS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "attention/attention.h"
#include "common/utils.h"

static int parse_positive(const char* text, const char* what) {
    char* end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 1 || v > (1 << 20)) {
        die("attn_emul_driver: %s must be a positive integer, got '%s'", what, text);
    }
    return (int)v;
}

int main(int argc, char** argv) {
    if (argc != 10) {
        die("usage: %s MODE IO SHIFT B NH T HS IN OUT\n"
            "  hint: MODE %s, IO fp32|bf16, SHIFT 0|1 (see tests/attn_emul_driver.c)",
            argv[0], attn_mode_choices());
    }
    AttnMode mode;
    if (attn_mode_parse(argv[1], &mode) != 0) die("attn_emul_driver: unknown mode '%s'; use %s", argv[1], attn_mode_choices());
    AttnIO io;
    if (strcmp(argv[2], "fp32") == 0) io = ATTN_IO_FP32;
    else if (strcmp(argv[2], "bf16") == 0) io = ATTN_IO_BF16;
    else die("attn_emul_driver: IO must be fp32 or bf16, got '%s'", argv[2]);
    AttnOptions opt = {0};
    if (strcmp(argv[3], "0") == 0) opt.tile_max_shift = 0;
    else if (strcmp(argv[3], "1") == 0) opt.tile_max_shift = 1;
    else die("attn_emul_driver: SHIFT must be 0 or 1, got '%s'", argv[3]);
    AttnShape s = {parse_positive(argv[4], "B"), parse_positive(argv[5], "NH"), parse_positive(argv[6], "T"),
                   parse_positive(argv[7], "HS")};

    size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nstats = attn_stats_count(s);
    float* qkv = (float*)mallocCheck(sizeof(float) * nqkv);
    float* dout = (float*)mallocCheck(sizeof(float) * nout);
    float* out = (float*)mallocCheck(sizeof(float) * nout);
    float* stats = (float*)mallocCheck(sizeof(float) * nstats);
    float* dqkv = (float*)mallocCheck(sizeof(float) * nqkv);

    FILE* in = fopenCheck(argv[8], "rb");
    freadCheck(qkv, sizeof(float), nqkv, in, "qkv");
    freadCheck(dout, sizeof(float), nout, in, "dout");
    if (fgetc(in) != EOF) die("attn_emul_driver: '%s' is longer than qkv + dout for this shape; check B NH T HS", argv[8]);
    fcloseCheck(in);

    attention_forward_cpu(mode, opt, io, s, qkv, out, stats);
    attention_backward_cpu(mode, opt, io, s, qkv, out, stats, dout, dqkv);

    FILE* f = fopenCheck(argv[9], "wb");
    fwriteCheck(out, sizeof(float), nout, f, "out");
    fwriteCheck(stats, sizeof(float), nstats, f, "stats");
    fwriteCheck(dqkv, sizeof(float), nqkv, f, "dqkv");
    fcloseCheck(f);
    free(qkv); free(dout); free(out); free(stats); free(dqkv);
    return 0;
}
