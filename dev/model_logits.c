/*
 * dev/model_logits.c - our CPU model's logits and loss on given tokens, read from a model file.
 *
 * Why: checking a model against another implementation (transformers, via
 * dev/hf_parity.sh and tests/test_hf_export.py) needs our own numbers on the
 * same tokens, and the trainers print only losses over their data loader. This
 * runs the trainers' model code (model/gpt_cpu.c, the CPU trainer's forward in
 * fp32) on one sequence and writes what it computed; it changes nothing.
 *
 * Usage: build/model_logits CHECKPOINT TOKENS OUT [--attn fp32|bf16|repair|gproj]
 *   CHECKPOINT  our model file (fp32 or bf16, llm.c layout)
 *   TOKENS      int32 little-endian token ids t[0..n), 2 <= n <= context + 1
 *   OUT         float32 [n-1][V]: logits at positions 0..n-2 over the real vocab (padding columns cut)
 * Prints one JSON line: {"loss": L, "positions": n-1, "vocab": V}, L = mean cross-entropy of
 * predicting t[1..n) from t[0..n-1) (what transformers' model(ids, labels=ids).loss computes).
 * --attn defaults to fp32 (exact fp32 attention).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/utils.h"
#include "model/checkpoint.h"
#include "model/gpt_cpu.h"

int main(int argc, char** argv) {
    const char* mode_name = "fp32";
    const char* pos[3];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--attn") == 0 && i + 1 < argc) mode_name = argv[++i];
        else if (npos < 3 && argv[i][0] != '-') pos[npos++] = argv[i];
        else die("usage: %s CHECKPOINT TOKENS OUT [--attn fp32|bf16|repair|gproj] (unexpected '%s')", argv[0], argv[i]);
    }
    if (npos != 3) die("usage: %s CHECKPOINT TOKENS OUT [--attn fp32|bf16|repair|gproj]", argv[0]);
    AttnMode mode;
    if (attn_mode_parse(mode_name, &mode) != 0) die("--attn %s: choose fp32|bf16|repair|gproj", mode_name);

    GPTConfig cfg;
    float* params = NULL;
    char err[1024];
    if (checkpoint_read_model(pos[0], &cfg, &params, err, sizeof(err)) != 0) die("%s", err);

    FILE* fp = fopenCheck(pos[1], "rb");
    fseek(fp, 0, SEEK_END);
    const long bytes = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    if (bytes < 8 || bytes % 4 != 0)
        die("%s: %ld bytes; expected int32 token ids, at least 2 (a multiple of 4 bytes)", pos[1], bytes);
    const int n = (int)(bytes / 4);
    if (n - 1 > cfg.max_seq_len)
        die("%s: %d tokens give %d positions, more than the model's context %d", pos[1], n, n - 1, cfg.max_seq_len);
    int* ids = (int*)mallocCheck(sizeof(int) * (size_t)n);
    freadCheck(ids, sizeof(int), (size_t)n, fp, pos[1]);
    fcloseCheck(fp);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= cfg.vocab_size)
            die("%s: token %d at offset %d is outside the vocab [0, %d)", pos[1], ids[i], 4 * i, cfg.vocab_size);

    const int T = n - 1;
    GPTCpu model;
    gpt_cpu_init(&model, &cfg, 1, T, mode);
    memcpy(model.params, params, sizeof(float) * model.num_params);
    gpt_cpu_forward(&model, ids, ids + 1, 1, T);

    const int V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    FILE* out = fopenCheck(pos[2], "wb");
    for (int t = 0; t < T; t++) fwriteCheck(model.logits + (size_t)t * Vp, sizeof(float), (size_t)V, out, pos[2]);
    fcloseCheck(out);
    printf("{\"loss\": %.9g, \"positions\": %d, \"vocab\": %d}\n", model.mean_loss, T, V);
    gpt_cpu_free(&model);
    free(params);
    free(ids);
    return 0;
}
