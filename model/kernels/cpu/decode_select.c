/* Decoding ops (core/backend.h, "Decoding"): row gathers for beam reordering and strided cache
 * writes, and the fused log-softmax + top-k that hands the host k candidates per row instead of
 * the [rows, V] log-probabilities.
 *
 * log_softmax_topk computes exactly what the host-side code before it did (lse in double from a
 * sequential sum; each log-prob rounded to fp32, then the bias added in fp32), so translations
 * are unchanged; rows are independent, so any thread count gives the same bits. */
#include <math.h>
#include <string.h>

#include "core/allocator.h"
#include "model/kernels/cpu/cpu_ops.h"

luna_status luna_cpu_gather_rows(luna_backend *be, luna_act *dst_, int64_t dst_stride,
                                 const luna_act *src_, int64_t src_stride, const int32_t *idx,
                                 int64_t n, int64_t cols) {
    float *dst = (float *)dst_;
    const float *src = (const float *)src_;
    if (n < 0 || cols < 0 || dst_stride < cols || src_stride < cols)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "gather_rows: bad sizes (n %lld, cols %lld, strides %lld, %lld)",
                          (long long)n, (long long)cols, (long long)dst_stride,
                          (long long)src_stride);
    if (n == 0 || cols == 0) return LUNA_OK;
    if (!dst || !src) return luna_error(LUNA_ERR_INVALID_ARGUMENT, "gather_rows: null pointer");
    const int threads = be->num_threads > 0 ? be->num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (n * cols >= 65536)
    for (int64_t i = 0; i < n; i++) {
        const int64_t from = idx ? idx[i] : i;
        memcpy(dst + i * dst_stride, src + from * src_stride, sizeof(float) * (size_t)cols);
    }
    return LUNA_OK;
}

typedef struct {
    float lp;
    int32_t j;
} candidate;

/* Insert (lp, j) into the sorted list top[0..*n) of at most k (best first; candidates arrive in
 * increasing j, so an equal value goes after the ones already there). */
static inline void topk_insert(candidate *top, int *n, int k, float lp, int32_t j) {
    if (*n == k && !(lp > top[k - 1].lp)) return;
    int i = *n < k ? (*n)++ : k - 1;
    while (i > 0 && top[i - 1].lp < lp) {
        top[i] = top[i - 1];
        i--;
    }
    top[i] = (candidate){lp, j};
}

luna_status luna_cpu_log_softmax_topk(luna_backend *be, const luna_act *logits_, const float *bias,
                                      int64_t rows, int V, int k, float *top_lp, int32_t *top_idx,
                                      const int32_t *pick, float *picked) {
    const float *logits = (const float *)logits_;
    if (rows < 0 || V < 1 || k < 0 || k > V)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "log_softmax_topk: bad sizes (rows %lld, V %d, k %d)", (long long)rows,
                          V, k);
    if (rows == 0) return LUNA_OK;
    if (!logits || (k > 0 && (!top_lp || !top_idx)) || (pick && !picked))
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "log_softmax_topk: null pointer");
    if (pick)
        for (int64_t r = 0; r < rows; r++)
            if (pick[r] < 0 || pick[r] >= V)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "log_softmax_topk: row %lld: token %d out of [0, %d)",
                                  (long long)r, pick[r], V);
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    candidate *lists = NULL;
    if (k > 0) {
        lists = luna_arena_alloc(be->scratch, sizeof(candidate) * (size_t)rows * (size_t)k);
        if (!lists)
            return luna_error(LUNA_ERR_OUT_OF_MEMORY, "log_softmax_topk: scratch exhausted");
    }
    const int threads = be->num_threads > 0 ? be->num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * V >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            mx = x[j] > mx ? x[j] : mx; /* = fmaxf (a NaN never wins), inlined */
        double sum = 0.0;
        for (int j = 0; j < V; j++)
            sum += exp((double)x[j] - (double)mx);
        const double lse = (double)mx + log(sum);
        if (pick) {
            const int j = pick[r];
            picked[r] = (float)((double)x[j] - lse); /* without the bias */
        }
        if (k == 0) continue;
        candidate *top = lists + r * k;
        int n = 0;
        for (int j = 0; j < V; j++) {
            float lp = (float)((double)x[j] - lse);
            if (bias) lp += bias[j];
            if (isnan(lp)) lp = -INFINITY;
            topk_insert(top, &n, k, lp, j);
        }
        for (int i = 0; i < k; i++) {
            top_lp[r * k + i] = top[i].lp;
            top_idx[r * k + i] = top[i].j;
        }
    }
    luna_arena_release(be->scratch, mark);
    return LUNA_OK;
}
