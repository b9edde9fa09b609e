/* Token embeddings and sinusoidal positions (spec §1, fairseq conventions).
 *
 * Embedding: out[i] = scale · table[tokens[i]], zeros for padding tokens. Its backward scatters
 * into the shared table without atomics: each thread owns a range of columns of d and walks all n
 * tokens in order, so repeated tokens are summed in the same order for any thread count.
 *
 * Positions follow fairseq's SinusoidalPositionalEmbedding exactly:
 *   half = d/2, f_i = exp(-i · ln(10000)/(half - 1)),  PE(pos) = [sin(pos·f_0..half-1) |
 *   cos(pos·f_0..half-1)] (concatenated), and a zero last column when d is odd.
 *   position(b, t) = padding_idx + #{non-pad tokens in tokens[b, 0..t]} (make_positions), so the
 *   first real token is at padding_idx + 1 = 2 whatever the left padding; pads get nothing.
 * fairseq evaluates the angles in fp32; here they are evaluated in double and rounded once.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "core/allocator.h"
#include "model/kernels/cpu/cpu_ops.h"

/* tokens [n], table [V, d] -> out [n, d] = scale · table[tokens] (padding rows: zeros). */
luna_status luna_cpu_embedding_forward(luna_backend *be, luna_act *out_, const float *table,
                                       const int32_t *tokens, int64_t n, int V, int d, float scale,
                                       int padding_idx) {
    float *out = (float *)out_;
    LUNA_TRY(luna_op_check_ids("embedding_forward", "token id", tokens, n, V, NULL));
    float *restrict o = out;
    const float *restrict tab = table;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (n * d >= LUNA_CPU_PAR_ROWS_WORK)
    for (int64_t i = 0; i < n; i++) {
        float *restrict oi = o + i * d;
        int tok = tokens[i];
        if (tok == padding_idx) {
            for (int c = 0; c < d; c++)
                oi[c] = 0.0f;
        } else {
            const float *restrict row = tab + (int64_t)tok * d;
            for (int c = 0; c < d; c++)
                oi[c] = scale * row[c];
        }
    }
    return LUNA_OK;
}

/* dout [n, d]: dtable [V, d] row tokens[i] += scale · dout[i] for tokens[i] != padding_idx.
 * Thread-owned column tiles; tokens visited in order 0..n-1 (deterministic, no atomics). */
luna_status luna_cpu_embedding_backward(luna_backend *be, float *dtable, const luna_act *dout_,
                                        const int32_t *tokens, int64_t n, int V, int d, float scale,
                                        int padding_idx) {
    const float *dout = (const float *)dout_;
    LUNA_TRY(luna_op_check_ids("embedding_backward", "token id", tokens, n, V, NULL));
    int threads = be->num_threads;
    int tile = luna_cpu_col_tile(d, threads);
    int ntiles = (d + tile - 1) / tile;
    float *restrict dt = dtable;
    const float *restrict g = dout;
#pragma omp parallel for num_threads(threads) schedule(static) if (n * d >= LUNA_CPU_PAR_ROWS_WORK)
    for (int t = 0; t < ntiles; t++) {
        int c0 = t * tile, w = d - c0 < tile ? d - c0 : tile;
        for (int64_t i = 0; i < n; i++) {
            int tok = tokens[i];
            if (tok == padding_idx) continue;
            float *restrict row = dt + (int64_t)tok * d + c0;
            const float *restrict gi = g + i * d + c0;
            for (int j = 0; j < w; j++)
                row[j] += scale * gi[j];
        }
    }
    return LUNA_OK;
}

/* f [half] = exp(-i · ln(10000)/(half - 1)) in double. half = 1 (d = 2 or 3), where fairseq
 * divides by zero, takes the limit f_0 = exp(0) = 1. */
static void frequencies(double *f, int half) {
    double c = half > 1 ? log(10000.0) / (double)(half - 1) : 0.0;
    for (int i = 0; i < half; i++)
        f[i] = exp((double)i * -c);
}

/* out [npos, d]: row j = PE(first_pos + j) = [sin(pos·f) | cos(pos·f) | 0 if d odd]. */
static void fill_table(luna_backend *be, float *out, const double *f, int first_pos, int npos,
                       int d) {
    int half = d / 2;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if ((int64_t)npos * d >= LUNA_CPU_PAR_ROWS_WORK / 8)
    for (int j = 0; j < npos; j++) {
        float *restrict row = out + (int64_t)j * d;
        double pos = (double)first_pos + (double)j;
        for (int i = 0; i < half; i++) {
            double a = pos * f[i];
            row[i] = (float)sin(a);
            row[half + i] = (float)cos(a);
        }
        if (d % 2) row[d - 1] = 0.0f;
    }
}

luna_status luna_cpu_sinusoidal_table(luna_backend *be, luna_act *out_, int first_pos, int npos,
                                      int d) {
    float *out = (float *)out_;
    if (npos == 0 || d == 0) return LUNA_OK;
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    double *f = luna_arena_alloc(be->scratch, (size_t)(d / 2 + 1) * sizeof *f);
    if (!f) {
        luna_error_prefix("sinusoidal_table: scratch for the frequencies");
        return LUNA_ERR_OUT_OF_MEMORY;
    }
    frequencies(f, d / 2);
    fill_table(be, out, f, first_pos, npos, d);
    luna_arena_release(be->scratch, mark);
    return LUNA_OK;
}

/* x [B, n, d] += PE(position(b, t)) for tokens[b, t] != padding_idx, where
 *   position(b, t) = padding_idx + Σ_{t' ≤ t} [tokens[b, t'] != padding_idx].
 * The n possible positions padding_idx+1 .. padding_idx+n are tabulated once in scratch
 * (table [n, d]), so a batch costs n·d sines, not B·n·d. */
luna_status luna_cpu_positions_add(luna_backend *be, luna_act *x_, const int32_t *tokens, int B,
                                   int n, int d, int padding_idx) {
    float *x = (float *)x_;
    if (B == 0 || n == 0 || d == 0) return LUNA_OK;
    luna_arena_mark mark = luna_arena_get_mark(be->scratch);
    int64_t rows = (int64_t)B * n;
    double *f = luna_arena_alloc(be->scratch, (size_t)(d / 2 + 1) * sizeof *f);
    float *table = luna_arena_alloc(be->scratch, (size_t)n * (size_t)d * sizeof *table);
    int32_t *count = luna_arena_alloc(be->scratch, (size_t)rows * sizeof *count);
    if (!f || !table || !count) {
        luna_arena_release(be->scratch, mark);
        luna_error_prefix("positions_add: scratch for the position table");
        return LUNA_ERR_OUT_OF_MEMORY;
    }
    frequencies(f, d / 2);
    fill_table(be, table, f, padding_idx + 1, n, d);
    /* count [B, n]: 1-based index of each real token in its sentence (0 for pads). */
    for (int b = 0; b < B; b++) {
        int32_t k = 0;
        for (int t = 0; t < n; t++) {
            int64_t i = (int64_t)b * n + t;
            count[i] = tokens[i] == padding_idx ? 0 : ++k;
        }
    }
    float *restrict xx = x;
    const float *restrict tab = table;
#pragma omp parallel for num_threads(be->num_threads)                                              \
    schedule(static) if (rows * d >= LUNA_CPU_PAR_ROWS_WORK)
    for (int64_t i = 0; i < rows; i++) {
        if (count[i] == 0) continue;
        float *restrict xi = xx + i * d;
        const float *restrict pe = tab + (int64_t)(count[i] - 1) * d;
        for (int c = 0; c < d; c++)
            xi[c] += pe[c];
    }
    luna_arena_release(be->scratch, mark);
    return LUNA_OK;
}
