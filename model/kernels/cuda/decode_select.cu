/* log_softmax_topk on the GPU (core/backend.h "Decoding"; CPU reference
 * model/kernels/cpu/decode_select.c, reproduced step for step): one thread per row.
 *   max over the row and a NaN check; Σ exp(x − max) with core/exp_double.h's exp (the CPU's
 *   function) in four lanes j mod 4, the tail into lane 0, (l0 + l1) + (l2 + l3); lse = max +
 *   log Σ; lp_j = (float)(x_j − lse) + bias_j, NaN as −inf; the k best by insertion into the
 *   output row itself (best first, ties to the lower index); picked = x_pick − lse unbiased.
 * So top_lp / top_idx equal the CPU's bit for bit under the CPU execution harness (a GPU's double
 * log may differ from glibc's by an ulp of lse). A row per thread costs O(V) sequential work: at
 * beam-search sizes (rows = sentences × beam, V ≈ 32k) that is ~0.1 ms per step, small beside the
 * output GEMM; a block-per-row selection is the faster design when the cost model asks for it. */
#include "model/kernels/cuda/cuda_compat.h"

#include "core/exp_double.h"
#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

template <typename T>
__global__ void topk_kernel(const T *logits, const float *bias, int64_t rows, int V, int k,
                            float *top_lp, int32_t *top_idx, const int32_t *pick, float *picked) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const T *x = logits + r * V;
    float mx = -INFINITY;
    int nan = 0;
    for (int j = 0; j < V; j++) {
        const float v = load(x, j);
        mx = v > mx ? v : mx;
        nan |= v != v;
    }
    double sum;
    if (nan || isinf(mx)) {
        sum = luna_f64_from_bits(0x7ff8000000000000LL); /* NaN, as libm's exp would give */
    } else {
        double lane[4] = {0.0, 0.0, 0.0, 0.0};
        int j = 0;
        for (; j + 4 <= V; j += 4)
            for (int l = 0; l < 4; l++)
                lane[l] =
                    __dadd_rn(lane[l], luna_exp_nonpositive((double)load(x, j + l) - (double)mx));
        for (; j < V; j++)
            lane[0] = __dadd_rn(lane[0], luna_exp_nonpositive((double)load(x, j) - (double)mx));
        sum = __dadd_rn(__dadd_rn(lane[0], lane[1]), __dadd_rn(lane[2], lane[3]));
    }
    const double lse = (double)mx + log(sum);
    if (pick) picked[r] = (float)((double)load(x, pick[r]) - lse);
    if (k == 0) return;
    float *tl = top_lp + r * k;
    int32_t *ti = top_idx + r * k;
    int n = 0;
    for (int j = 0; j < V; j++) {
        float lp = (float)((double)load(x, j) - lse);
        if (bias) lp = __fadd_rn(lp, bias[j]);
        if (lp != lp) lp = -INFINITY;
        if (n == k && !(lp > tl[k - 1])) continue;
        int i = n < k ? n++ : k - 1;
        while (i > 0 && tl[i - 1] < lp) {
            tl[i] = tl[i - 1];
            ti[i] = ti[i - 1];
            i--;
        }
        tl[i] = lp;
        ti[i] = j;
    }
}

typedef __nv_bfloat16 bf16_t;

} // namespace

extern "C" cudaError_t luna_cuda_log_softmax_topk(cudaStream_t s, int bf16, const void *logits,
                                                  const float *bias, int64_t rows, int V, int k,
                                                  float *top_lp, int32_t *top_idx,
                                                  const int32_t *pick, float *picked) {
    if (rows <= 0 || V <= 0) return cudaSuccess;
    const unsigned blocks = (unsigned)((rows + 63) / 64);
    if (bf16)
        LUNA_LAUNCH(topk_kernel<bf16_t>, blocks, 64, 0, s, static_cast<const bf16_t *>(logits),
                    bias, rows, V, k, top_lp, top_idx, pick, picked);
    else
        LUNA_LAUNCH(topk_kernel<float>, blocks, 64, 0, s, static_cast<const float *>(logits), bias,
                    rows, V, k, top_lp, top_idx, pick, picked);
    return cudaGetLastError();
}
