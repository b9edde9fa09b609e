/* The CUDA backend's elementwise and layout kernels (model/kernels/cuda/elementwise.cu), run by
 * the CPU execution harness (tests/cuda_emu; CTest runs this suite in the forward, reverse and
 * random thread orders) against the CPU backend's ops (the specification):
 *   fp32: bit-equal on sizes 1, 7, 1001 and 70001 (several blocks, a grid-stride tail), inputs
 *         with NaN, ±inf, ±0, subnormals and values either side of the softplus threshold;
 *   bf16: equal to the CPU op computed from the bf16-rounded inputs, rounded to bf16 (the
 *         contract's "one rounding per store");
 * dropout: the same mask as the CPU for several keys and p (core/philox.h shared); the layout
 * ops (split/merge heads, broadcast_rows, gather_rows with and without an index) on odd shapes.
 * Math is exact under the harness; on a GPU expf/log1pf may differ by ulps (tolerance there). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "luna_cuda_emu_api.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "tests/cuda/emu_util.h"
#include "tests/test_util.h"

static const int sizes[] = {1, 7, 1001, 70001};

/* ---- bf16 on the host: round to nearest even (NaN stays a quiet NaN) ---- */

/* Inputs: uniform in [-30, 30] with special values sprinkled in. */
static float *inputs(uint64_t seed, int64_t n) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    float *x = luna_test_random_vector(&rng, (size_t)n, -30.0f, 30.0f);
    const float special[] = {NAN,       INFINITY, -INFINITY, 0.0f,
                             -0.0f,     1e-40f,   -1e-40f,   28.853900817779268f,
                             28.85390f, -100.0f,  100.0f,    1.0f};
    for (size_t k = 0; k < sizeof special / sizeof special[0] && (int64_t)(k * 3) < n; k++)
        x[k * 3] = special[k];
    return x;
}

static void *dev_copy(const void *host, size_t bytes) {
    void *d = NULL;
    ck_assert_int_eq(cudaMalloc(&d, bytes ? bytes : 1), cudaSuccess);
    if (bytes && host)
        ck_assert_int_eq(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}
static void host_copy(void *host, const void *dev, size_t bytes) {
    ck_assert_int_eq(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

static void same_bits(const float *want, const float *got, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &want[i], 4);
        memcpy(&b, &got[i], 4);
        const bool both_nan = isnan(want[i]) && isnan(got[i]);
        ck_assert_msg(a == b || both_nan, "%s: element %lld: CUDA %.9g (0x%08x), CPU %.9g (0x%08x)",
                      what, (long long)i, (double)got[i], b, (double)want[i], a);
    }
}

/* The unary/binary ops under test: which inputs, CPU op, CUDA launcher. */
typedef enum { ADD, AXPY, SCALE_ACT, SP_F, SP_B, ELU_F, ELU_B, DROP } op_kind;
static const char *const op_names[] = {"add",
                                       "axpy",
                                       "scale_act",
                                       "softplus_ln2_forward",
                                       "softplus_ln2_backward",
                                       "elu_plus_one_forward",
                                       "elu_plus_one_backward",
                                       "dropout"};

static void run_cpu(luna_backend *cpu, op_kind k, float *y, const float *a, const float *b,
                    const float *p32, int64_t n, float p, luna_rng_key key) {
    const luna_ops *o = cpu->ops;
    switch (k) {
    case ADD: LUNA_CHECK_OK(o->add(cpu, y, a, b, n)); break;
    case AXPY:
        memcpy(y, a, sizeof(float) * n);
        LUNA_CHECK_OK(o->axpy(cpu, y, 0.37f, p32, n));
        break;
    case SCALE_ACT:
        memcpy(y, a, sizeof(float) * n);
        LUNA_CHECK_OK(o->scale_act(cpu, y, -1.7f, n));
        break;
    case SP_F: LUNA_CHECK_OK(o->softplus_ln2_forward(cpu, y, a, n)); break;
    case SP_B: LUNA_CHECK_OK(o->softplus_ln2_backward(cpu, y, b, a, n)); break;
    case ELU_F: LUNA_CHECK_OK(o->elu_plus_one_forward(cpu, y, a, n)); break;
    case ELU_B: LUNA_CHECK_OK(o->elu_plus_one_backward(cpu, y, b, a, n)); break;
    case DROP: LUNA_CHECK_OK(o->dropout_forward(cpu, y, a, n, p, key)); break;
    }
}

static void run_cuda(op_kind k, int bf16, void *y, const void *a, const void *b, const float *p32,
                     int64_t n, float p, luna_rng_key key, size_t esize) {
    cudaError_t e = cudaSuccess;
    switch (k) {
    case ADD: e = luna_cuda_add(0, bf16, y, a, b, n); break;
    case AXPY:
        ck_assert_int_eq(cudaMemcpy(y, a, esize * n, cudaMemcpyDeviceToDevice), cudaSuccess);
        e = luna_cuda_axpy(0, bf16, y, 0.37f, p32, n);
        break;
    case SCALE_ACT:
        ck_assert_int_eq(cudaMemcpy(y, a, esize * n, cudaMemcpyDeviceToDevice), cudaSuccess);
        e = luna_cuda_scale_act(0, bf16, y, -1.7f, n);
        break;
    case SP_F: e = luna_cuda_softplus_ln2_forward(0, bf16, y, a, n); break;
    case SP_B: e = luna_cuda_softplus_ln2_backward(0, bf16, y, b, a, n); break;
    case ELU_F: e = luna_cuda_elu_plus_one_forward(0, bf16, y, a, n); break;
    case ELU_B: e = luna_cuda_elu_plus_one_backward(0, bf16, y, b, a, n); break;
    case DROP: e = luna_cuda_dropout(0, bf16, y, a, n, p, key); break;
    }
    ck_assert_int_eq(e, cudaSuccess);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
}

/* One op, one size, fp32 and bf16. */
static void check_op(luna_backend *cpu, op_kind k, int n, float p, luna_rng_key key) {
    float *a = inputs(11 + n, n), *b = inputs(23 + n, n), *p32 = inputs(37 + n, n);
    float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    char what[96];
    /* fp32 */
    void *da = dev_copy(a, 4 * n), *db = dev_copy(b, 4 * n), *dy = dev_copy(NULL, 4 * n);
    float *dp = dev_copy(p32, 4 * n);
    run_cpu(cpu, k, want, a, b, p32, n, p, key);
    run_cuda(k, 0, dy, da, db, dp, n, p, key, 4);
    host_copy(got, dy, 4 * n);
    snprintf(what, sizeof what, "%s fp32 n=%lld (%s order)", op_names[k], (long long)n,
             luna_emu_order_name(luna_emu_get_order()));
    same_bits(want, got, n, what);
    cudaFree(da), cudaFree(db), cudaFree(dy);
    /* bf16: inputs rounded, the CPU on the rounded values, its result rounded once */
    uint16_t *ha = malloc(2 * (size_t)n), *hb = malloc(2 * (size_t)n), *hy = malloc(2 * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        ha[i] = to_bf16(a[i]), hb[i] = to_bf16(b[i]);
        a[i] = from_bf16(ha[i]), b[i] = from_bf16(hb[i]);
    }
    da = dev_copy(ha, 2 * n), db = dev_copy(hb, 2 * n), dy = dev_copy(NULL, 2 * n);
    run_cpu(cpu, k, want, a, b, p32, n, p, key);
    run_cuda(k, 1, dy, da, db, dp, n, p, key, 2);
    host_copy(hy, dy, 2 * n);
    for (int64_t i = 0; i < n; i++)
        want[i] = from_bf16(to_bf16(want[i])), got[i] = from_bf16(hy[i]);
    snprintf(what, sizeof what, "%s bf16 n=%lld", op_names[k], (long long)n);
    same_bits(want, got, n, what);
    cudaFree(da), cudaFree(db), cudaFree(dy), cudaFree(dp);
    free(a), free(b), free(p32), free(want), free(got), free(ha), free(hb), free(hy);
}

START_TEST(elementwise_ops_equal_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    const luna_rng_key key = {.seed = 12345, .step = 3, .stream_id = 7};
    for (int k = ADD; k <= DROP; k++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            check_op(cpu, (op_kind)k, sizes[s], 0.1f, key);
    /* dropout: other keys and rates; p close to 1 */
    const float ps[] = {0.01f, 0.5f, 0.9f};
    for (int i = 0; i < 3; i++) {
        const luna_rng_key k2 = {.seed = 99 + (uint64_t)i, .step = (uint64_t)i, .stream_id = 2};
        check_op(cpu, DROP, 70001, ps[i], k2);
    }
    luna_backend_free(cpu);
}
END_TEST

/* The bf16 weight copies (weight_copies.c): every value rounded to nearest even, ties to even,
 * infinities kept, NaN a NaN, at a size that is not a multiple of the block. */
START_TEST(convert_to_bf16_rounds_to_nearest_even) {
    enum { n = 1001 };
    float x[n];
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 31);
    luna_test_fill_uniform(&rng, x, n, -3.0f, 3.0f);
    const uint32_t ties[] = {0x3f808000u, 0x3f818000u, 0x7f800000u, 0xff800000u, 0x7fc00000u};
    for (int i = 0; i < 5; i++)
        memcpy(&x[i], &ties[i], 4);
    float *dx = dev(x, sizeof x);
    uint16_t *dy = dev(NULL, n * sizeof(uint16_t)), got[n];
    ck_assert_int_eq(luna_cuda_convert_to_bf16(0, dy, dx, n), cudaSuccess);
    down(got, dy, sizeof got);
    for (int i = 0; i < n; i++) /* a NaN may come back as any NaN (CUDA's is 0x7fff) */
        ck_assert_msg(got[i] == to_bf16(x[i]) || (isnan(x[i]) && isnan(from_bf16(got[i]))),
                      "element %d: 0x%04x, want 0x%04x", i, got[i], to_bf16(x[i]));
    ck_assert_int_eq(got[0], 0x3f80); /* tie 1.00390625 -> even 1.0 */
    ck_assert_int_eq(got[1], 0x3f82); /* tie 1.01171875 -> even 1.015625 */
    cudaFree(dx), cudaFree(dy);
}
END_TEST

START_TEST(layout_ops_equal_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 1));
    /* dh 2, 8, 64: the heads copies' 8- and 16-byte units (elementwise.cu, heads_launch) */
    const int shapes[][4] = {{1, 1, 1, 1}, {2, 5, 3, 7}, {3, 17, 4, 33},
                             {2, 3, 4, 2}, {2, 3, 4, 8}, {2, 5, 3, 64}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int B = shapes[k][0], n = shapes[k][1], H = shapes[k][2], dh = shapes[k][3];
        const int64_t total = (int64_t)B * n * H * dh;
        float *x = inputs(3 + k, total), *want = malloc(4 * total), *got = malloc(4 * total);
        float *dx = dev_copy(x, 4 * total), *dy = dev_copy(NULL, 4 * total);
        for (int split = 0; split < 2; split++) {
            ck_assert_int_eq(luna_cuda_heads_permute(0, 0, dy, dx, B, n, H, dh, split),
                             cudaSuccess);
            LUNA_CHECK_OK(split ? cpu->ops->split_heads(cpu, want, x, B, n, H, dh)
                                : cpu->ops->merge_heads(cpu, want, x, B, n, H, dh));
            host_copy(got, dy, 4 * total);
            same_bits(want, got, total, split ? "split_heads" : "merge_heads");
            /* bf16: the same permutation of 2-byte elements (2-, 4-, 8- or 16-byte units) */
            ck_assert_int_eq(luna_cuda_heads_permute(0, 1, dy, dx, B, n, H, dh, split),
                             cudaSuccess);
            host_copy(got, dy, 2 * total);
            const uint16_t *xs = (const uint16_t *)x, *gs = (const uint16_t *)got;
            for (int64_t i = 0; i < total; i++) {
                const int64_t e = i % dh, r = i / dh;
                int64_t b, h, t, src;
                if (split)
                    t = r % n, h = (r / n) % H, b = r / ((int64_t)n * H),
                    src = ((b * n + t) * H + h) * dh + e;
                else
                    h = r % H, t = (r / H) % n, b = r / ((int64_t)H * n),
                    src = ((b * H + h) * n + t) * dh + e;
                ck_assert_msg(gs[i] == xs[src], "bf16 heads (split %d, dh %d): element %lld", split,
                              dh, (long long)i);
            }
        }
        /* broadcast_rows: x [n·H, dh] to B copies */
        const int64_t rows = (int64_t)n * H, m = rows * dh;
        float *bw = malloc(4 * (size_t)(B + 1) * m), *bg = malloc(4 * (size_t)(B + 1) * m);
        float *db = dev_copy(NULL, 4 * (size_t)(B + 1) * m);
        ck_assert_int_eq(luna_cuda_broadcast_rows(0, 0, db, dx, B + 1, rows, dh), cudaSuccess);
        LUNA_CHECK_OK(cpu->ops->broadcast_rows(cpu, bw, x, B + 1, rows, dh));
        host_copy(bg, db, 4 * (size_t)(B + 1) * m);
        same_bits(bw, bg, (B + 1) * m, "broadcast_rows");
        /* gather_rows: rows of x (stride dh + 2 view of width dh) by a repeating index, and
         * idx NULL as a strided copy; padding between destination rows untouched */
        const int64_t nr = rows, cols = dh - (dh > 1), sstride = dh, dstride = dh + 3;
        int32_t *idx = malloc(4 * nr);
        for (int64_t i = 0; i < nr; i++)
            idx[i] = (int32_t)((i * 7 + 3) % nr);
        int32_t *didx = dev_copy(idx, 4 * nr);
        for (int with_idx = 0; with_idx < 2; with_idx++) {
            float *gw = malloc(4 * nr * dstride), *gg = malloc(4 * nr * dstride);
            for (int64_t i = 0; i < nr * dstride; i++)
                gw[i] = -7.0f;
            float *dg = dev_copy(gw, 4 * nr * dstride);
            ck_assert_int_eq(luna_cuda_gather_rows(0, 0, dg, dstride, dx, sstride,
                                                   with_idx ? didx : NULL, nr, cols),
                             cudaSuccess);
            LUNA_CHECK_OK(cpu->ops->gather_rows(cpu, gw, dstride, x, sstride, with_idx ? idx : NULL,
                                                nr, cols));
            host_copy(gg, dg, 4 * nr * dstride);
            same_bits(gw, gg, nr * dstride, with_idx ? "gather_rows idx" : "gather_rows NULL");
            cudaFree(dg);
            free(gw), free(gg);
        }
        cudaFree(dx), cudaFree(dy), cudaFree(db), cudaFree(didx);
        free(x), free(want), free(got), free(bw), free(bg), free(idx);
    }
    luna_backend_free(cpu);
}
END_TEST

/* Column sums and broadcasts: sum_broadcast (fp32 in b order) and the bias add bit-equal to the
 * CPU; the bias gradient of the Linear (the CPU's linear_backward with in = 0, in double in the
 * chunked order of column_sum_order.h; the GPU's an fp32 tree of its own, in one round or one
 * chunk a round) within the ACCUM tier; fp32 and bf16 inputs. */
START_TEST(sums_and_bias_equal_cpu) {
    luna_backend *cpu;
    LUNA_CHECK_OK(luna_backend_cpu_create(&cpu, 2));
    const int shapes[][3] = {{1, 1, 1}, {3, 7, 5}, {4, 130, 33}, {2, 300, 257}};
    for (size_t k = 0; k < 4; k++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const int B = shapes[k][0], rows = shapes[k][1], d = shapes[k][2];
            const int64_t m = (int64_t)rows * d;
            float *dout = inputs(1 + k, B * m), *acc = inputs(2 + k, m), *bias = inputs(3 + k, d);
            for (int64_t i = 0; i < B * m; i++) /* finite values only here */
                dout[i] = isfinite(dout[i]) ? dout[i] : 0.5f;
            for (int64_t i = 0; i < m; i++)
                acc[i] = isfinite(acc[i]) ? acc[i] : 0.25f;
            for (int i = 0; i < d; i++)
                bias[i] = isfinite(bias[i]) ? bias[i] : 1.0f;
            uint16_t *h = malloc(2 * (size_t)(B * m));
            for (int64_t i = 0; i < B * m && bf16; i++)
                h[i] = to_bf16(dout[i]), dout[i] = from_bf16(h[i]);
            void *ddout =
                bf16 ? dev_copy(h, 2 * (size_t)(B * m)) : dev_copy(dout, 4 * (size_t)(B * m));
            float *dacc = dev_copy(acc, 4 * m), *dbias = dev_copy(bias, 4 * (size_t)d);
            float *got = malloc(4 * (size_t)(B * m));
            LUNA_CHECK_OK(cpu->ops->sum_broadcast(cpu, acc, dout, B, rows, d));
            ck_assert_int_eq(luna_cuda_sum_broadcast(0, bf16, dacc, ddout, B, rows, d),
                             cudaSuccess);
            host_copy(got, dacc, 4 * m);
            same_bits(acc, got, m, "sum_broadcast");
            /* the bias gradient over all B·rows rows of dout, into the bias */
            float *bias_before = malloc(4 * (size_t)d);
            memcpy(bias_before, bias, 4 * (size_t)d);
            LUNA_CHECK_OK(cpu->ops->linear_backward(cpu, NULL, NULL, bias, dout, NULL, NULL,
                                                    (int64_t)B * rows, 0, d, false));
            /* the launchers' workspace, or the one-chunk-a-round least (k + bf16 odd) */
            luna_cuda_colsum_ws ws = colsum_ws((int64_t)B * rows, d, 1, (int)((k + bf16) & 1));
            ck_assert_int_eq(
                luna_cuda_bias_add_backward(0, bf16, dbias, ddout, (int64_t)B * rows, d, ws),
                cudaSuccess);
            cudaFree(ws.p);
            host_copy(got, dbias, 4 * (size_t)d);
            /* ACCUM: 1e-5 relative to the magnitude of the sum's terms, Σ_r |dout_rc| (with
             * cancellation the result itself may be far smaller) */
            for (int c = 0; c < d; c++) {
                double mag = fabs((double)bias_before[c]);
                for (int64_t r = 0; r < (int64_t)B * rows; r++)
                    mag += fabs((double)dout[r * d + c]);
                ck_assert_msg(fabs((double)got[c] - bias[c]) <= 1e-5 * (mag > 1.0 ? mag : 1.0),
                              "bias gradient: element %d: CUDA %.9g, CPU %.9g (terms %.3g)", c,
                              (double)got[c], (double)bias[c], mag);
            }
            free(bias_before);
            /* from here on both use the CPU's bias */
            ck_assert_int_eq(cudaMemcpy(dbias, bias, 4 * (size_t)d, cudaMemcpyHostToDevice),
                             cudaSuccess);
            /* the bias add onto dout (fp32 only: the CPU is fp32): one fp32 addition each */
            if (!bf16) {
                for (int64_t i = 0; i < B * m; i++)
                    dout[i] += bias[i % d];
                ck_assert_int_eq(
                    luna_cuda_bias_add_forward(0, 0, ddout, dbias, (int64_t)B * rows, d),
                    cudaSuccess);
                host_copy(got, ddout, 4 * (size_t)(B * m));
                same_bits(dout, got, B * m, "bias add");
            }
            cudaFree(ddout), cudaFree(dacc), cudaFree(dbias);
            free(dout), free(acc), free(bias), free(h), free(got);
        }
    luna_backend_free(cpu);
}
END_TEST

static Suite *elementwise_suite(void) {
    Suite *s = suite_create("cuda_elementwise");
    TCase *tc = tcase_create("elementwise");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, elementwise_ops_equal_cpu);
    tcase_add_test(tc, convert_to_bf16_rounds_to_nearest_even);
    tcase_add_test(tc, layout_ops_equal_cpu);
    tcase_add_test(tc, sums_and_bias_equal_cpu);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(elementwise_suite()); }
