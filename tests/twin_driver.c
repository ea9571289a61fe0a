/*
 * tests/twin_driver.c - the C side of the PyTorch-twin parity test
 * (tests/test_twin_parity.py runs it; not a user program).
 *
 * Why: the parity test must compare our model with dev/gpt_twin.py on the
 * same weights and batches. This driver builds a model of a given shape with
 * our GPT-2 initialisation, saves it through checkpoint_write_model (fp32 and
 * bf16: the twin must load both), reads the token batches the Python side
 * wrote, and dumps what the twin recomputes: logits, loss and every gradient
 * on the first batch, then the loss and gradient norm of each of `steps`
 * AdamW steps (batch k at step k) and the final weights as a checkpoint.
 *
 * Usage: twin_driver DIR key=value ...   keys (all required):
 *   L C NH V Vp maxT B T steps seed lr beta1 beta2 eps wd attn(fp32|bf16|repair|gproj)
 *   and the architecture options pos(learned|rope) rope_base norm(layernorm|rmsnorm)
 *   mlp(gelu|swiglu) mlp_hidden(0: the default) qk_norm bias tie (0|1)
 * Reads  DIR/tokens.bin: int32 [steps][2][B][T] (inputs, then targets).
 * Writes DIR/model.bin, DIR/model_bf16.bin (initial weights), DIR/logits0.bin
 *        (float32 [B][T][Vp]), DIR/grads0.bin (float32, parameter table order),
 *        DIR/losses.bin and DIR/norms.bin (float32 [steps], before each update),
 *        DIR/step1.bin (weights after the first AdamW step: grads0 applied once),
 *        DIR/final.bin (weights after the last step, fp32 checkpoint).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/utils.h"
#include "model/checkpoint.h"
#include "model/gpt_cpu.h"
#include "train/adamw_cpu.h"

typedef struct {
    const char* key;
    char value[64];
    int found;
} Arg;
#define ARG(name) {.key = name, .value = "", .found = 0}

enum { ARG_L, ARG_C, ARG_NH, ARG_V, ARG_VP, ARG_MAXT, ARG_B, ARG_T, ARG_STEPS, ARG_SEED, ARG_LR,
       ARG_BETA1, ARG_BETA2, ARG_EPS, ARG_WD, ARG_ATTN, ARG_POS, ARG_ROPE_BASE, ARG_NORM, ARG_MLP, ARG_MLP_HIDDEN,
       ARG_QK_NORM, ARG_BIAS, ARG_TIE, NUM_ARGS };

static void write_floats(const char* dir, const char* name, const float* data, size_t n) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(data, sizeof(float), n, fp, name);
    fcloseCheck(fp);
}

static void save_checkpoint(const char* dir, const char* name, const GPTConfig* cfg, const float* params, int bf16) {
    char path[1024], err[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (checkpoint_write_model(path, cfg, params, bf16, err, sizeof(err)) != 0) die("%s", err);
}

int main(int argc, char** argv) {
    Arg args[NUM_ARGS] = {ARG("L"), ARG("C"), ARG("NH"), ARG("V"), ARG("Vp"), ARG("maxT"), ARG("B"), ARG("T"),
                          ARG("steps"), ARG("seed"), ARG("lr"), ARG("beta1"), ARG("beta2"), ARG("eps"), ARG("wd"),
                          ARG("attn"), ARG("pos"), ARG("rope_base"), ARG("norm"), ARG("mlp"), ARG("mlp_hidden"),
                          ARG("qk_norm"), ARG("bias"), ARG("tie")};
    if (argc < 2) die("usage: %s DIR key=value ... (see tests/twin_driver.c)", argv[0]);
    const char* dir = argv[1];
    for (int i = 2; i < argc; i++) {
        const char* eq = strchr(argv[i], '=');
        int matched = 0;
        for (int a = 0; eq && a < NUM_ARGS; a++) {
            if (strlen(args[a].key) == (size_t)(eq - argv[i]) && strncmp(argv[i], args[a].key, eq - argv[i]) == 0) {
                snprintf(args[a].value, sizeof(args[a].value), "%s", eq + 1);
                args[a].found = matched = 1;
            }
        }
        if (!matched) die("twin_driver: unknown argument '%s' (expected key=value, see tests/twin_driver.c)", argv[i]);
    }
    for (int a = 0; a < NUM_ARGS; a++) {
        if (!args[a].found) die("twin_driver: missing argument %s=...", args[a].key);
    }
    GPTConfig cfg = {.num_layers = atoi(args[ARG_L].value), .channels = atoi(args[ARG_C].value),
                     .num_heads = atoi(args[ARG_NH].value), .vocab_size = atoi(args[ARG_V].value),
                     .padded_vocab_size = atoi(args[ARG_VP].value), .max_seq_len = atoi(args[ARG_MAXT].value)};
    gpt_config_set_gpt2_options(&cfg);
    if (gpt_pos_parse(args[ARG_POS].value, &cfg.pos) != 0 || gpt_norm_parse(args[ARG_NORM].value, &cfg.norm) != 0 ||
        gpt_mlp_parse(args[ARG_MLP].value, &cfg.mlp) != 0)
        die("twin_driver: pos, norm or mlp is not an option name (learned|rope, layernorm|rmsnorm, gelu|swiglu)");
    cfg.rope_base = strtof(args[ARG_ROPE_BASE].value, NULL);
    cfg.mlp_hidden = atoi(args[ARG_MLP_HIDDEN].value);
    if (cfg.mlp_hidden == 0) cfg.mlp_hidden = gpt_config_default_mlp_hidden(cfg.mlp, cfg.channels);
    cfg.qk_norm = atoi(args[ARG_QK_NORM].value);
    cfg.bias = atoi(args[ARG_BIAS].value);
    cfg.tie_embeddings = atoi(args[ARG_TIE].value);
    const int B = atoi(args[ARG_B].value), T = atoi(args[ARG_T].value), steps = atoi(args[ARG_STEPS].value);
    const AdamWParams hp = {.lr = strtof(args[ARG_LR].value, NULL), .beta1 = strtof(args[ARG_BETA1].value, NULL),
                            .beta2 = strtof(args[ARG_BETA2].value, NULL), .eps = strtof(args[ARG_EPS].value, NULL),
                            .weight_decay = strtof(args[ARG_WD].value, NULL)};
    AttnMode mode;
    if (attn_mode_parse(args[ARG_ATTN].value, &mode) != 0) die("twin_driver: attn must be %s", attn_mode_choices());
    if (steps < 1) die("twin_driver: steps must be >= 1");

    GPTCpu m;
    gpt_cpu_init(&m, &cfg, B, T, mode);
    gpt_cpu_init_weights(&m, strtoull(args[ARG_SEED].value, NULL, 10));
    save_checkpoint(dir, "model.bin", &cfg, m.params, 0);
    save_checkpoint(dir, "model_bf16.bin", &cfg, m.params, 1);

    const size_t batch = (size_t)B * T;
    int* tokens = (int*)mallocCheck((size_t)steps * 2 * batch * sizeof(int));
    {
        char path[1024];
        snprintf(path, sizeof(path), "%s/tokens.bin", dir);
        FILE* fp = fopenCheck(path, "rb");
        freadCheck(tokens, sizeof(int), (size_t)steps * 2 * batch, fp, "tokens.bin");
        fcloseCheck(fp);
    }

    float* adam_m = (float*)callocCheck(m.num_params, sizeof(float));
    float* adam_v = (float*)callocCheck(m.num_params, sizeof(float));
    float* losses = (float*)mallocCheck((size_t)steps * sizeof(float));
    float* norms = (float*)mallocCheck((size_t)steps * sizeof(float));
    for (int step = 0; step < steps; step++) {
        const int* inputs = tokens + (size_t)step * 2 * batch;
        const int* targets = inputs + batch;
        gpt_cpu_zero_grad(&m);
        gpt_cpu_forward(&m, inputs, targets, B, T);
        gpt_cpu_backward(&m);
        if (step == 0) {
            write_floats(dir, "logits0.bin", m.logits, batch * cfg.padded_vocab_size);
            write_floats(dir, "grads0.bin", m.grads, m.num_params);
        }
        losses[step] = m.mean_loss;
        norms[step] = grad_global_norm_cpu(m.grads, m.num_params);
        adamw_cpu_step(m.params, m.grads, adam_m, adam_v, m.num_params, step + 1, hp, m.params_info);
        if (step == 0) save_checkpoint(dir, "step1.bin", &cfg, m.params, 0);
    }
    write_floats(dir, "losses.bin", losses, (size_t)steps);
    write_floats(dir, "norms.bin", norms, (size_t)steps);
    save_checkpoint(dir, "final.bin", &cfg, m.params, 0);
    printf("twin_driver: %d steps, loss %.6f -> %.6f\n", steps, losses[0], losses[steps - 1]);

    free(tokens); free(adam_m); free(adam_v); free(losses); free(norms);
    gpt_cpu_free(&m);
    return 0;
}
