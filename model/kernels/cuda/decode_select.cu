/* log_softmax_topk on the GPU (core/backend.h "Decoding"; CPU reference
 * model/kernels/cpu/decode_select.c): one block of 256 threads per row, each thread taking every
 * 256th token.
 *   the row's max and a NaN check (a block reduction); Σ exp(x − max) in double with
 *   core/exp_double.h's exp (the CPU's function), each thread's terms in token order, then a
 *   fixed tree over the threads (run-to-run identical; the CPU's four lanes add in another order,
 *   which moves the double by ulps that the fp32 log-probs absorb); lse = max + log Σ;
 *   lp_j = (float)(x_j − lse) + bias_j, NaN as −inf; each thread keeps its k best in a sorted
 *   list (ties to the lower index: its tokens arrive in increasing order), then k rounds of a
 *   block arg-max over the lists' heads give the row's k best, best first, ties to the lower
 *   index; picked = x_pick − lse unbiased.
 * Above kListCap (n-gram bans, wide beams: beam_select asks for 2·beam plus the most bans a row
 * can have) the lists hold kListCap each; the row's k best are exact as long as no thread's list
 * runs out while it had to drop tokens, which the merge checks each round (a thread holding 32 of
 * a row's best k: a row whose best tokens share one residue mod 256); then, rarely, one thread
 * selects that row by a heap instead. k above kBlockMaxK (very wide beams) takes the
 * one-thread-per-row kernel: the same heap over the row, O(V log k).
 * Also cache_products, a decoding step's attention products over the beam-indexed KV cache, and
 * cross_attention, its fused attention to the source (below, before the launchers). */
#include "model/kernels/cuda/cuda_compat.h"

#include "core/exp_double.h"
#include "core/topk_heap.h"
#include "model/kernels/cuda/act_io.cuh"
#include "model/kernels/cuda/cuda_kernels.h"

namespace {

/* lp_j = (float)(x_j − lse) + bias_j, NaN as −inf */
template <typename T>
__device__ inline float log_prob(const T *x, int j, double lse, const float *bias) {
    float lp = (float)((double)load(x, j) - lse);
    if (bias) lp = __fadd_rn(lp, bias[j]);
    return lp != lp ? -INFINITY : lp;
}

/* Token j (tokens arrive in increasing order) into tl/ti, the n ≤ k best so far, best first: a
 * token that only ties the worst kept one ranks below it (higher index) and is refused. */
__device__ inline void offer(float *tl, int32_t *ti, int &n, int k, float lp, int j) {
    if (n == k && !(lp > tl[k - 1])) return;
    int i = n < k ? n++ : k - 1;
    while (i > 0 && tl[i - 1] < lp) {
        tl[i] = tl[i - 1];
        ti[i] = ti[i - 1];
        i--;
    }
    tl[i] = lp;
    ti[i] = j;
}

/* The k best of a row by core/topk_heap.h's heap (the CPU's) in the output row itself, tokens
 * offered in increasing order, then sorted best first. O(V log k). */
template <typename T>
__device__ void heap_select_row(const T *x, double lse, const float *bias, int V, int k, float *hl,
                                int32_t *hi) {
    int n = 0;
    for (int j = 0; j < V; j++)
        luna_topk_offer(hl, hi, &n, k, log_prob(x, j, lse, bias), j);
    luna_topk_sort(hl, hi, n);
}

/* One thread per row, the tokens in order, the k best by a heap in the output row: for k above
 * kBlockMaxK (the block kernel below is the common path). */
template <typename T>
__global__ void topk_row_kernel(const T *logits, const float *bias, int64_t rows, int V, int k,
                                float *top_lp, int32_t *top_idx, const int32_t *pick,
                                float *picked) {
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
    heap_select_row(x, lse, bias, V, k, top_lp + r * k, top_idx + r * k);
}

constexpr int kTopkThreads = 256, kTopkWarps = kTopkThreads / 32, kListCap = 32, kBlockMaxK = 256;

/* A candidate: log-prob and token; `valid` false for an exhausted list. */
struct Cand {
    float lp;
    int j;
    bool valid;
};

/* a ranks before b: valid first, then the higher log-prob, then the lower token */
__device__ inline bool before(const Cand &a, const Cand &b) {
    return a.valid && (!b.valid || a.lp > b.lp || (a.lp == b.lp && a.j < b.j));
}

__device__ inline Cand shfl_cand(const Cand &c, int m) {
    Cand o;
    o.lp = __shfl_xor_sync(0xffffffffu, c.lp, m);
    o.j = __shfl_xor_sync(0xffffffffu, c.j, m);
    o.valid = __shfl_xor_sync(0xffffffffu, (int)c.valid, m) != 0;
    return o;
}

template <typename T>
__global__ void __launch_bounds__(kTopkThreads)
    topk_block_kernel(const T *logits, const float *bias, int V, int k, float *top_lp,
                      int32_t *top_idx, const int32_t *pick, float *picked) {
    LUNA_SHARED(float, s_max, kTopkWarps);
    LUNA_SHARED(int, s_nan, kTopkWarps);
    LUNA_SHARED(double, s_sum, kTopkWarps);
    LUNA_SHARED(Cand, s_best, kTopkWarps);
    LUNA_SHARED(double, s_lse, 1);
    const int64_t r = blockIdx.x;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const T *x = logits + r * V;
    /* the max (a NaN never wins: v > mx ? v : mx) and whether any logit is NaN */
    float mx = -INFINITY;
    int nan = 0;
    for (int j = tid; j < V; j += kTopkThreads) {
        const float v = load(x, j);
        mx = v > mx ? v : mx;
        nan |= v != v;
    }
    for (int m = 16; m > 0; m /= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, mx, m);
        mx = o > mx ? o : mx;
        nan |= __shfl_xor_sync(0xffffffffu, nan, m);
    }
    if (lane == 0) s_max[warp] = mx, s_nan[warp] = nan;
    __syncthreads();
    mx = -INFINITY, nan = 0;
    for (int w = 0; w < kTopkWarps; w++)
        mx = s_max[w] > mx ? s_max[w] : mx, nan |= s_nan[w];
    /* Σ exp(x − mx) in double: a NaN logit, or ±inf − ±inf at the maximum, makes the row NaN */
    const bool dead = nan || isinf(mx);
    double sum = 0.0;
    if (!dead)
        for (int j = tid; j < V; j += kTopkThreads)
            sum = __dadd_rn(sum, luna_exp_nonpositive((double)load(x, j) - (double)mx));
    for (int m = 16; m > 0; m /= 2)
        sum = __dadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, m));
    if (lane == 0) s_sum[warp] = sum;
    __syncthreads();
    if (tid == 0) {
        double total = 0.0;
        for (int w = 0; w < kTopkWarps; w++)
            total = __dadd_rn(total, s_sum[w]);
        if (dead) total = luna_f64_from_bits(0x7ff8000000000000LL); /* NaN, as libm's exp gives */
        s_lse[0] = (double)mx + log(total);
        if (pick) picked[r] = (float)((double)load(x, pick[r]) - s_lse[0]);
    }
    __syncthreads();
    if (k == 0) return;
    const double lse = s_lse[0];
    /* this thread's min(k, kListCap) best, best first; dropped: it refused or evicted a token */
    const int cap = k < kListCap ? k : kListCap;
    float tl[kListCap];
    int32_t ti[kListCap];
    int n = 0;
    bool dropped = false;
    for (int j = tid; j < V; j += kTopkThreads) {
        dropped = dropped || n == cap;
        offer(tl, ti, n, cap, log_prob(x, j, lse, bias), j);
    }
    /* k rounds: the best head over all lists is the next of the row, unless a list that dropped
     * tokens has run out (its next best is unknown): then thread 0 selects the row by a heap */
    int taken = 0;
    for (int out = 0; out < k; out++) {
        if (__syncthreads_or(taken == n && dropped)) {
            if (tid == 0) heap_select_row(x, lse, bias, V, k, top_lp + r * k, top_idx + r * k);
            return;
        }
        Cand c = {taken < n ? tl[taken] : 0.0f, taken < n ? ti[taken] : 0, taken < n};
        for (int m = 16; m > 0; m /= 2) {
            const Cand o = shfl_cand(c, m);
            if (before(o, c)) c = o;
        }
        if (lane == 0) s_best[warp] = c;
        __syncthreads();
        Cand best = s_best[0];
        for (int w = 1; w < kTopkWarps; w++)
            if (before(s_best[w], best)) best = s_best[w];
        if (tid == 0) top_lp[r * k + out] = best.lp, top_idx[r * k + out] = best.j;
        if (taken < n && ti[taken] == best.j) taken++; /* tokens are distinct: one owner */
        __syncthreads(); /* s_best is read before the next round writes it */
    }
}

/* cache_products (core/backend.h "Decoding"): one block per group g = r·H + h. Row p of the
 * group's cache lives in slot ind[r·T_cap + p], at C + ((slot·H + h)·page + p mod page)·dh; row r
 * reads its first T_r = lens ? lens[r] : Tn positions.
 *   scores  (values false): thread per p,  y[g·Tn + p] = Σ_{k<dh} x[g·dh + k] · C_p[k]
 *   outputs (values true):  thread per j,  y[g·dh + j] = Σ_{p<T_r} x[g·Tn + p] · C_p[j]
 * Each sum is one fmaf chain in ascending order from 0, stored once. */
template <typename T>
__global__ void cache_scores_kernel(T *y, const T *x, const T *C, const int32_t *ind,
                                    const int32_t *lens, int H, int dh, int Tn, int T_cap,
                                    int page) {
    const int64_t g = blockIdx.x;
    const int64_t r = g / H, h = g % H;
    const int Tr = lens ? lens[r] : Tn;
    const T *xg = x + g * dh;
    for (int p = threadIdx.x; p < Tr; p += blockDim.x) {
        const int64_t slot = ind[r * T_cap + p];
        const T *c = C + ((slot * H + h) * page + p % page) * dh;
        float acc = 0.0f;
        for (int k = 0; k < dh; k++)
            acc = fmaf(load(xg, k), load(c, k), acc);
        store(y, g * Tn + p, acc);
    }
}

template <typename T>
__global__ void cache_outputs_kernel(T *y, const T *x, const T *C, const int32_t *ind,
                                     const int32_t *lens, int H, int dh, int Tn, int T_cap,
                                     int page) {
    const int64_t g = blockIdx.x;
    const int64_t r = g / H, h = g % H;
    const int Tr = lens ? lens[r] : Tn;
    const T *xg = x + g * Tn;
    const int32_t *ir = ind + r * T_cap;
    for (int j = threadIdx.x; j < dh; j += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < Tr; p++) {
            const T *c = C + (((int64_t)ir[p] * H + h) * page + p % page) * dh;
            acc = fmaf(load(xg, p), load(c, j), acc);
        }
        store(y, g * dh + j, acc);
    }
}

/* cache_write: thread per element of x [R, H, dh]; row r's newest position p = T_r − 1. */
template <typename T>
__global__ void cache_write_kernel(T *C, const T *x, const int32_t *ind, const int32_t *lens, int R,
                                   int H, int dh, int Tn, int T_cap, int page) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)R * H * dh) return;
    const int64_t r = i / ((int64_t)H * dh), h = i / dh % H, k = i % dh;
    const int p = (lens ? lens[r] : Tn) - 1;
    const int64_t slot = ind[r * T_cap + p];
    C[((slot * H + h) * page + p % page) * dh + k] = x[i];
}

/* cross_attention (core/backend.h "Decoding"): one block per (row, head), kCrossThreads threads.
 * Thread per position p: a_p = alpha · Σ_k q_k K_p[k] (one fmaf chain, k ascending) into shared
 * memory; the block's max, then exp in float and Σ in double by a fixed tree (run-to-run
 * identical); thread per j: y_j = Σ_p w_p V_p[j] (one fmaf chain, p ascending). */
constexpr int kCrossThreads = 128;
constexpr int kCrossMaxM = 8192;

template <typename T>
__global__ void __launch_bounds__(kCrossThreads)
    cross_attention_kernel(T *y, const T *q, const T *K, const T *V, const int32_t *row_slot,
                           const int32_t *slot_len, int H, int dh, int m, float alpha) {
    LUNA_DYNAMIC_SHARED(float, s_a); /* [m] scores, then weights */
    LUNA_SHARED(float, s_max, kCrossThreads);
    LUNA_SHARED(double, s_sum, kCrossThreads);
    const int64_t g = blockIdx.x, r = g / H, h = g % H, s = row_slot[r], d = (int64_t)H * dh;
    int n = slot_len ? slot_len[s] : m;
    n = n < 0 ? 0 : (n > m ? m : n);
    const T *qg = q + r * d + h * dh;
    const int tid = threadIdx.x;
    float mx = -INFINITY;
    for (int p = tid; p < n; p += blockDim.x) {
        const T *kp = K + (s * m + p) * d + h * dh;
        float acc = 0.0f;
        for (int k = 0; k < dh; k++)
            acc = fmaf(load(qg, k), load(kp, k), acc);
        acc *= alpha;
        s_a[p] = acc;
        mx = fmaxf(mx, acc);
    }
    s_max[tid] = mx;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (tid < w) s_max[tid] = fmaxf(s_max[tid], s_max[tid + w]);
        __syncthreads();
    }
    mx = s_max[0];
    double sum = 0.0;
    for (int p = tid; p < n && mx != -INFINITY; p += blockDim.x) {
        const float e = expf(s_a[p] - mx);
        s_a[p] = e;
        sum += (double)e;
    }
    s_sum[tid] = sum;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (tid < w) s_sum[tid] += s_sum[tid + w];
        __syncthreads();
    }
    /* nothing to attend to (n = 0, or only −inf scores): the row's output is 0 */
    const float inv = mx == -INFINITY ? 0.0f : (float)(1.0 / s_sum[0]);
    for (int j = tid; j < dh; j += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < n; p++)
            acc = fmaf(s_a[p] * inv, load(V + (s * m + p) * d + h * dh, j), acc);
        store(y, r * d + h * dh + j, acc);
    }
}

template <typename T>
cudaError_t cache_products_launch(cudaStream_t s, int values, void *y, const void *x, const void *C,
                                  const int32_t *ind, const int32_t *lens, int R, int H, int dh,
                                  int Tn, int T_cap, int page) {
    const unsigned blocks = (unsigned)R * (unsigned)H;
    const int n = values ? dh : Tn;
    const unsigned threads = n >= 256 ? 256u : (unsigned)((n + 31) / 32 * 32);
    if (values)
        LUNA_LAUNCH(cache_outputs_kernel<T>, blocks, threads, 0, s, static_cast<T *>(y),
                    static_cast<const T *>(x), static_cast<const T *>(C), ind, lens, H, dh, Tn,
                    T_cap, page);
    else
        LUNA_LAUNCH(cache_scores_kernel<T>, blocks, threads, 0, s, static_cast<T *>(y),
                    static_cast<const T *>(x), static_cast<const T *>(C), ind, lens, H, dh, Tn,
                    T_cap, page);
    return cudaGetLastError();
}

typedef __nv_bfloat16 bf16_t;

} // namespace

extern "C" cudaError_t luna_cuda_log_softmax_topk(cudaStream_t s, int bf16, const void *logits,
                                                  const float *bias, int64_t rows, int V, int k,
                                                  float *top_lp, int32_t *top_idx,
                                                  const int32_t *pick, float *picked) {
    if (rows <= 0 || V <= 0) return cudaSuccess;
    if (k > kBlockMaxK) {
        const unsigned blocks = (unsigned)((rows + 63) / 64);
        if (bf16)
            LUNA_LAUNCH(topk_row_kernel<bf16_t>, blocks, 64, 0, s,
                        static_cast<const bf16_t *>(logits), bias, rows, V, k, top_lp, top_idx,
                        pick, picked);
        else
            LUNA_LAUNCH(topk_row_kernel<float>, blocks, 64, 0, s,
                        static_cast<const float *>(logits), bias, rows, V, k, top_lp, top_idx, pick,
                        picked);
        return cudaGetLastError();
    }
    if (bf16)
        LUNA_LAUNCH(topk_block_kernel<bf16_t>, (unsigned)rows, kTopkThreads, 0, s,
                    static_cast<const bf16_t *>(logits), bias, V, k, top_lp, top_idx, pick, picked);
    else
        LUNA_LAUNCH(topk_block_kernel<float>, (unsigned)rows, kTopkThreads, 0, s,
                    static_cast<const float *>(logits), bias, V, k, top_lp, top_idx, pick, picked);
    return cudaGetLastError();
}

extern "C" cudaError_t luna_cuda_cache_products(cudaStream_t s, int bf16, int values, void *y,
                                                const void *x, const void *C, const int32_t *ind,
                                                const int32_t *lens, int R, int H, int dh, int T,
                                                int T_cap, int page) {
    if (R <= 0 || H <= 0 || dh <= 0 || T <= 0) return cudaSuccess;
    if (bf16)
        return cache_products_launch<bf16_t>(s, values, y, x, C, ind, lens, R, H, dh, T, T_cap,
                                             page);
    return cache_products_launch<float>(s, values, y, x, C, ind, lens, R, H, dh, T, T_cap, page);
}

extern "C" cudaError_t luna_cuda_cache_write(cudaStream_t s, int bf16, void *C, const void *x,
                                             const int32_t *ind, const int32_t *lens, int R, int H,
                                             int dh, int T, int T_cap, int page) {
    const int64_t n = (int64_t)R * H * dh;
    if (n <= 0) return cudaSuccess;
    const unsigned threads = 256, blocks = (unsigned)((n + threads - 1) / threads);
    if (bf16)
        LUNA_LAUNCH(cache_write_kernel<bf16_t>, blocks, threads, 0, s, static_cast<bf16_t *>(C),
                    static_cast<const bf16_t *>(x), ind, lens, R, H, dh, T, T_cap, page);
    else
        LUNA_LAUNCH(cache_write_kernel<float>, blocks, threads, 0, s, static_cast<float *>(C),
                    static_cast<const float *>(x), ind, lens, R, H, dh, T, T_cap, page);
    return cudaGetLastError();
}

extern "C" cudaError_t luna_cuda_cross_attention(cudaStream_t s, int bf16, void *y, const void *q,
                                                 const void *K, const void *V,
                                                 const int32_t *row_slot, const int32_t *slot_len,
                                                 int R, int H, int dh, int m, float alpha) {
    if (R <= 0 || H <= 0 || dh <= 0 || m <= 0) return cudaSuccess;
    if (m > kCrossMaxM) return cudaErrorInvalidValue;
    const unsigned blocks = (unsigned)R * (unsigned)H;
    const size_t shared = sizeof(float) * (size_t)m;
    if (bf16)
        LUNA_LAUNCH(cross_attention_kernel<bf16_t>, blocks, kCrossThreads, shared, s,
                    static_cast<bf16_t *>(y), static_cast<const bf16_t *>(q),
                    static_cast<const bf16_t *>(K), static_cast<const bf16_t *>(V), row_slot,
                    slot_len, H, dh, m, alpha);
    else
        LUNA_LAUNCH(cross_attention_kernel<float>, blocks, kCrossThreads, shared, s,
                    static_cast<float *>(y), static_cast<const float *>(q),
                    static_cast<const float *>(K), static_cast<const float *>(V), row_slot,
                    slot_len, H, dh, m, alpha);
    return cudaGetLastError();
}
