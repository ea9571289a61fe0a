/*
 * attention/cudnn/attention_cudnn_none.cu - cudnn mode in a build without cuDNN: every entry point of
 * attention_cudnn.cuh stops with one message that names the fix (the Makefile links this unit when it
 * finds no cudnn.h / libcudnn, and attention_cudnn.cu otherwise).
 */
#include "attention/cudnn/attention_cudnn.cuh"
#include "common/utils.h"

static void no_cudnn(const char* who) {
    die("%s: this build has no cuDNN: install cuDNN 9 (cudnn.h, libcudnn) and rebuild; make prints "
        "[build] cuDNN: found/not found\n  hint: the other attention modes (%s) need no cuDNN",
        who, attn_emulated_mode_choices());
}

int attention_cudnn_available(void) { return 0; }
void attention_cudnn_require(const char* who) { no_cudnn(who); }
long attention_cudnn_version(void) { return 0; }
long attention_cudnn_header_version(void) { return 0; }

void attention_forward_cudnn(AttnShape, const __nv_bfloat16*, __nv_bfloat16*, float*, cudaStream_t) {
    no_cudnn("attention_forward_cudnn (--attn cudnn)");
}
void attention_backward_cudnn(AttnShape, const __nv_bfloat16*, const __nv_bfloat16*, const float*,
                              const __nv_bfloat16*, __nv_bfloat16*, cudaStream_t) {
    no_cudnn("attention_backward_cudnn (--attn cudnn)");
}
const char* attention_cudnn_describe(AttnShape) { return "cudnn: not in this build (no cuDNN found)"; }

CudnnAttnPlan* attention_cudnn_plan_build(AttnShape, int, CudnnAttnVariant, char*, size_t) {
    no_cudnn("attention_cudnn_plan_build");
    return 0;
}
const char* attention_cudnn_plan_describe(const CudnnAttnPlan*) { return "no cuDNN"; }
const char* attention_cudnn_plan_json(const CudnnAttnPlan*) { return ""; }
size_t attention_cudnn_plan_workspace_bytes(const CudnnAttnPlan*) { return 0; }
int attention_cudnn_plan_forward(CudnnAttnPlan*, const __nv_bfloat16*, __nv_bfloat16*, float*, cudaStream_t, char*,
                                 size_t) {
    no_cudnn("attention_cudnn_plan_forward");
    return 1;
}
int attention_cudnn_plan_backward(CudnnAttnPlan*, const __nv_bfloat16*, const __nv_bfloat16*, const float*,
                                  const __nv_bfloat16*, __nv_bfloat16*, cudaStream_t, char*, size_t) {
    no_cudnn("attention_cudnn_plan_backward");
    return 1;
}
void attention_cudnn_plan_free(CudnnAttnPlan*) {}
