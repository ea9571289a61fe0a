/*
 * model/checkpoint.h - model weight files in llm.c's layout, and the same
 * layout with the architecture options in the header (read and write).
 *
 * Why: checkpoints are what a user must never lose, and llm.c's GPT-2 files
 * should load unchanged (and ours export the same way). So the format is
 * llm.c's, every field is checked on read with an error that names the file
 * and the problem, and a save goes to "<path>.tmp", is fsync'ed and only then
 * renamed over <path>: a failed save leaves the previous file intact.
 *
 * Format: int32 header[256]:
 *   [0] = 20240326 (magic)  [1] = version
 *   [2] = maxT  [3] = V  [4] = L  [5] = NH  [6] = C  [7] = Vp
 * version 3 (fp32 weights) or 5 (bf16): llm.c's GPT-2 file, the rest 0. A
 * model with GPT-2's options is always written so, byte for byte as llm.c.
 * version 6 (any other options; llm.c cannot read it):
 *   [8] bits per weight (32 or 16)  [9] pos  [10] rope_base (the float's bits)
 *   [11] norm  [12] mlp  [13] mlp_hidden  [14] qk_norm  [15] bias
 *   [16] tie_embeddings  (rest 0)
 * then every parameter tensor of gpt_param_table with a nonzero count, in
 * table order (llm.c order; the options' tensors after lnfb), fp32 or bf16
 * (round-to-nearest-even of the fp32 value; read back as that float).
 * Extra run state (optimizer, data position, attention mode) is NOT here: it
 * goes in the trainer's separate resume-state file.
 *
 * Offers: checkpoint_write_model, checkpoint_read_model (errors are returned,
 * never fatal, so the caller decides; err holds one line naming the file).
 */
#ifndef MODEL_CHECKPOINT_H
#define MODEL_CHECKPOINT_H

#include <stddef.h>

#include "model/gpt_config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CHECKPOINT_MAGIC 20240326
#define CHECKPOINT_VERSION_FP32 3
#define CHECKPOINT_VERSION_BF16 5
#define CHECKPOINT_VERSION_OPTIONS 6
#define CHECKPOINT_HEADER_INTS 256

/* Writes params (gpt_num_parameters(cfg) floats) to path, as bf16 if bf16 != 0.
   Writes path.tmp, fsyncs, renames. Returns 0, or -1 with a message in err
   (the previous file at path, if any, is untouched and path.tmp removed). */
int checkpoint_write_model(const char* path, const GPTConfig* cfg, const float* params, int bf16,
                           char* err, size_t errlen);

/* Reads a model file (ours or llm.c's, version 3 or 5; ours with options,
   version 6). Validates magic, version, config sanity (positive, C % NH == 0,
   Vp >= V, sizes below generous limits, the options) and the exact file size (truncated or too long both
   refused). On success: *cfg_out filled, *params_out malloc'd (caller frees),
   returns 0. On failure: -1, message in err, nothing allocated. */
int checkpoint_read_model(const char* path, GPTConfig* cfg_out, float** params_out,
                          char* err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* MODEL_CHECKPOINT_H */
