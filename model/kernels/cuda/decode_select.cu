/* log_softmax_topk on the GPU (core/backend.h "Decoding"; CPU reference
 * model/kernels/cpu/decode_select.c, reproduced step for step): one thread per row.
 *   max over the row and a NaN check; Σ exp(x − max) with core/exp_double.h's exp (the CPU's
 *   function) in four lanes j mod 4, the tail into lane 0, (l0 + l1) + (l2 + l3); lse = max +
 *   log Σ; lp_j = (float)(x_j − lse) + bias_j, NaN as −inf; the k best by insertion into the
 *   output row itself (best first, ties to the lower index); picked = x_pick − lse unbiased.
 * So top_lp / top_idx equal the CPU's bit for bit under the CPU execution harness (a GPU's double
 * log may differ from glibc's by an ulp of lse). A row per thread costs O(V) sequential work: at
 * beam-search sizes (rows = sentences × beam, V ≈ 32k) small beside the output GEMM that produced
 * the row; a block-per-row selection is the faster design when the cost model asks for it.
 * Also cache_products, a decoding step's attention products over the beam-indexed KV cache
 * (below, before the launchers). */
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

/* cache_products (core/backend.h "Decoding"): one block per group g = r·H + h. Row p of the
 * group's cache lives in slot ind[r·T_cap + p], at C + ((slot·H + h)·page + p mod page)·dh.
 *   scores  (values false): thread per p,  y[g·T + p]  = Σ_{k<dh} x[g·dh + k] · C_p[k]
 *   outputs (values true):  thread per j,  y[g·dh + j] = Σ_{p<T}  x[g·T + p] · C_p[j]
 * Each sum is one fmaf chain in ascending order from 0, stored once. */
template <typename T>
__global__ void cache_scores_kernel(T *y, const T *x, const T *C, const int32_t *ind, int H, int dh,
                                    int Tn, int T_cap, int page) {
    const int64_t g = blockIdx.x;
    const int64_t r = g / H, h = g % H;
    const T *xg = x + g * dh;
    for (int p = threadIdx.x; p < Tn; p += blockDim.x) {
        const int64_t slot = ind[r * T_cap + p];
        const T *c = C + ((slot * H + h) * page + p % page) * dh;
        float acc = 0.0f;
        for (int k = 0; k < dh; k++)
            acc = fmaf(load(xg, k), load(c, k), acc);
        store(y, g * Tn + p, acc);
    }
}

template <typename T>
__global__ void cache_outputs_kernel(T *y, const T *x, const T *C, const int32_t *ind, int H,
                                     int dh, int Tn, int T_cap, int page) {
    const int64_t g = blockIdx.x;
    const int64_t r = g / H, h = g % H;
    const T *xg = x + g * Tn;
    const int32_t *ir = ind + r * T_cap;
    for (int j = threadIdx.x; j < dh; j += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < Tn; p++) {
            const T *c = C + (((int64_t)ir[p] * H + h) * page + p % page) * dh;
            acc = fmaf(load(xg, p), load(c, j), acc);
        }
        store(y, g * dh + j, acc);
    }
}

template <typename T>
cudaError_t cache_products_launch(cudaStream_t s, int values, void *y, const void *x, const void *C,
                                  const int32_t *ind, int R, int H, int dh, int Tn, int T_cap,
                                  int page) {
    const unsigned blocks = (unsigned)R * (unsigned)H;
    const int n = values ? dh : Tn;
    const unsigned threads = n >= 256 ? 256u : (unsigned)((n + 31) / 32 * 32);
    if (values)
        LUNA_LAUNCH(cache_outputs_kernel<T>, blocks, threads, 0, s, static_cast<T *>(y),
                    static_cast<const T *>(x), static_cast<const T *>(C), ind, H, dh, Tn, T_cap,
                    page);
    else
        LUNA_LAUNCH(cache_scores_kernel<T>, blocks, threads, 0, s, static_cast<T *>(y),
                    static_cast<const T *>(x), static_cast<const T *>(C), ind, H, dh, Tn, T_cap,
                    page);
    return cudaGetLastError();
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

extern "C" cudaError_t luna_cuda_cache_products(cudaStream_t s, int bf16, int values, void *y,
                                                const void *x, const void *C, const int32_t *ind,
                                                int R, int H, int dh, int T, int T_cap, int page) {
    if (R <= 0 || H <= 0 || dh <= 0 || T <= 0) return cudaSuccess;
    if (bf16)
        return cache_products_launch<bf16_t>(s, values, y, x, C, ind, R, H, dh, T, T_cap, page);
    return cache_products_launch<float>(s, values, y, x, C, ind, R, H, dh, T, T_cap, page);
}
