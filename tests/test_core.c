/* Tests of the compute core's infrastructure: arena accounting, tensors, the counter-based RNG, the
 * double exp shared by the backends' log-softmax (core/exp_double.h). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/exp_double.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "tests/test_util.h"

START_TEST(arena_counts_used_and_peak) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_arena *arena;
    ck_assert_int_eq(luna_arena_create(&arena, be, 4096), LUNA_OK);
    void *a = luna_arena_alloc(arena, 100); /* rounds to 256 */
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq((uintptr_t)a % LUNA_ARENA_ALIGNMENT, 0);
    ck_assert_uint_eq(luna_arena_used_bytes(arena), 256);
    luna_arena_mark mark = luna_arena_get_mark(arena);
    void *b = luna_arena_alloc(arena, 1000);    /* 1024 */
    void *big = luna_arena_alloc(arena, 10000); /* larger than a chunk: own chunk, 10240 */
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(big);
    memset(big, 1, 10000);
    ck_assert_uint_eq(luna_arena_used_bytes(arena), 256 + 1024 + 10240);
    ck_assert_uint_eq(luna_arena_peak_bytes(arena), 256 + 1024 + 10240);
    luna_arena_release(arena, mark);
    ck_assert_uint_eq(luna_arena_used_bytes(arena), 256);
    ck_assert_uint_eq(luna_arena_peak_bytes(arena), 256 + 1024 + 10240);
    /* Reuse after release returns the same memory: no growth in reserved bytes. */
    size_t reserved = luna_arena_reserved_bytes(arena);
    void *b2 = luna_arena_alloc(arena, 1000);
    ck_assert_ptr_eq(b2, b);
    ck_assert_uint_eq(luna_arena_reserved_bytes(arena), reserved);
    luna_arena_reset_peak(arena);
    ck_assert_uint_eq(luna_arena_peak_bytes(arena), 256 + 1024);
    /* Backend counters include the arena's chunks. */
    ck_assert_uint_ge(be->bytes_in_use, reserved);
    luna_arena_free(arena);
    luna_backend_free(be);
}
END_TEST

/* Requests that keep growing a little after each reset (translation batches sorted by length)
 * must not add a chunk per new size: reserved memory stays within a small factor of the peak. */
START_TEST(arena_growing_requests_stay_bounded) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_arena *arena;
    ck_assert_int_eq(luna_arena_create(&arena, be, 1 << 16), LUNA_OK);
    size_t largest = 0;
    for (int round = 0; round < 200; round++) {
        luna_arena_reset(arena);
        size_t total = 0;
        for (int k = 0; k < 3; k++) { /* three tensors per "batch", each larger than a chunk */
            size_t bytes = (size_t)(100000 + 1000 * round + 37 * k);
            ck_assert_ptr_nonnull(luna_arena_alloc(arena, bytes));
            total += bytes;
        }
        largest = total > largest ? total : largest;
        ck_assert_msg(luna_arena_reserved_bytes(arena) <= 3 * largest + (1 << 16),
                      "round %d: %zu bytes reserved for a peak of %zu", round,
                      luna_arena_reserved_bytes(arena), largest);
    }
    ck_assert_uint_eq(be->bytes_in_use, luna_arena_reserved_bytes(arena));
    luna_arena_free(arena);
    ck_assert_uint_eq(be->bytes_in_use, 0);
    luna_backend_free(be);
}
END_TEST

START_TEST(arena_many_chunks_stack_discipline) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    luna_arena *arena;
    ck_assert_int_eq(luna_arena_create(&arena, be, 1024), LUNA_OK);
    float *blocks[50];
    for (int i = 0; i < 50; i++) {
        blocks[i] = luna_arena_alloc(arena, 200 * sizeof(float));
        ck_assert_ptr_nonnull(blocks[i]);
        for (int j = 0; j < 200; j++)
            blocks[i][j] = (float)(i * 1000 + j);
    }
    /* No block overlaps another: every value is still intact. */
    for (int i = 0; i < 50; i++)
        for (int j = 0; j < 200; j++)
            ck_assert_float_eq(blocks[i][j], (float)(i * 1000 + j));
    ck_assert_uint_eq(luna_arena_used_bytes(arena), 50 * 1024);
    luna_arena_reset(arena);
    ck_assert_uint_eq(luna_arena_used_bytes(arena), 0);
    luna_arena_free(arena);
    ck_assert_uint_eq(be->bytes_in_use, luna_arena_reserved_bytes(be->scratch));
    luna_backend_free(be);
}
END_TEST

START_TEST(tensor_create_counts_bytes) {
    luna_backend *be;
    ck_assert_int_eq(luna_backend_cpu_create(&be, 1), LUNA_OK);
    size_t before = be->bytes_in_use;
    luna_tensor t;
    int64_t shape[3] = {2, 3, 5};
    ck_assert_int_eq(luna_tensor_create(&t, be, LUNA_F32, 3, shape), LUNA_OK);
    ck_assert_int_eq(luna_tensor_numel(&t), 30);
    ck_assert_uint_eq(luna_tensor_bytes(&t), 120);
    ck_assert_uint_eq(be->bytes_in_use - before, 120);
    for (int i = 0; i < 30; i++)
        ck_assert_float_eq(((float *)t.data)[i], 0.0f);
    char buf[64];
    ck_assert_str_eq(luna_tensor_describe(&t, buf, sizeof buf), "F32[2,3,5]");
    luna_tensor_free(&t);
    ck_assert_uint_eq(be->bytes_in_use, before);
    ck_assert_uint_ge(be->peak_bytes, before + 120);
    int64_t bad[1] = {-1};
    ck_assert_int_eq(luna_tensor_create(&t, be, LUNA_F32, 1, bad), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "negative size"));
    luna_backend_free(be);
}
END_TEST

/* Known-answer test from the Random123 distribution (kat_vectors: philox4x32_10). */
START_TEST(philox_known_answers) {
    uint32_t out[4];
    uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    luna_philox4x32(c0, k0, out);
    ck_assert_uint_eq(out[0], 0x6627e8d5u);
    ck_assert_uint_eq(out[1], 0xe169c58du);
    ck_assert_uint_eq(out[2], 0xbc57ac4cu);
    ck_assert_uint_eq(out[3], 0x9b00dbd8u);
    uint32_t c1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    uint32_t k1[2] = {0xffffffffu, 0xffffffffu};
    luna_philox4x32(c1, k1, out);
    ck_assert_uint_eq(out[0], 0x408f276du);
    ck_assert_uint_eq(out[1], 0x41c83b0eu);
    ck_assert_uint_eq(out[2], 0xa20bc7c6u);
    ck_assert_uint_eq(out[3], 0x6d5451fdu);
    uint32_t c2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
    uint32_t k2[2] = {0xa4093822u, 0x299f31d0u};
    luna_philox4x32(c2, k2, out);
    ck_assert_uint_eq(out[0], 0xd16cfe09u);
    ck_assert_uint_eq(out[1], 0x94fdccebu);
    ck_assert_uint_eq(out[2], 0x5001e420u);
    ck_assert_uint_eq(out[3], 0x24126ea1u);
}
END_TEST

/* The same stream drawn by 1, 2 and 3 threads in different element orders is bit-identical:
 * element i's value depends only on (key, i). */
START_TEST(rng_reproducible_across_thread_counts) {
    const int n = 100003;
    luna_rng_key key = {.seed = 1234, .step = 77, .stream_id = 5};
    float *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got);
    for (int i = 0; i < n; i++)
        ref[i] = luna_rng_uniform(key, (uint64_t)i);
    for (int threads = 1; threads <= 3; threads++) {
        memset(got, 0, n * sizeof *got);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 97)
        for (int i = n - 1; i >= 0; i--)
            got[i] = luna_rng_uniform(key, (uint64_t)i);
        ck_assert_int_eq(memcmp(ref, got, n * sizeof *got), 0);
    }
    free(ref);
    free(got);
}
END_TEST

/* The same bits from the C++ compilation of core/philox.h (tests/philox_cxx.cc), as a CUDA kernel
 * would compile it (the known answers of the shared function: philox_known_answers above). */
uint32_t luna_test_philox_cxx_bits(uint64_t seed, uint64_t step, uint32_t stream, uint64_t index);
int luna_test_philox_cxx_keep(uint64_t seed, uint64_t step, uint32_t stream, uint64_t index,
                              float p);

START_TEST(philox_cxx_equals_c) {
    const uint64_t seeds[] = {0, 1, 0x123456789abcdefull};
    const uint64_t steps[] = {0, 7, (uint64_t)1 << 40};
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 3; t++)
            for (uint64_t i = 0; i < 4099; i += 13) {
                luna_rng_key key = {.seed = seeds[s], .step = steps[t], .stream_id = 0x10203u};
                ck_assert_uint_eq(luna_rng_bits(key, i),
                                  luna_test_philox_cxx_bits(seeds[s], steps[t], 0x10203u, i));
                ck_assert_int_eq(luna_rng_dropout_keep(key, i, 0.3f),
                                 luna_test_philox_cxx_keep(seeds[s], steps[t], 0x10203u, i, 0.3f));
            }
}
END_TEST

/* The eight-lane block generator gives exactly luna_rng_bits' words, for block counts that are
 * and are not multiples of eight, offsets past 2^32 blocks, and 64-bit steps and seeds. */
START_TEST(rng_bits_blocks_equal_scalar) {
    const luna_rng_key keys[] = {
        {.seed = 1, .step = 0, .stream_id = 0},
        {.seed = 0x123456789abcdefull, .step = 0xfedcba9876ull, .stream_id = 77}};
    const uint64_t starts[] = {0, 5, 0xfffffffcull};
    const int64_t counts[] = {1, 7, 8, 9, 64, 131};
    uint32_t got[4 * 131];
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        for (size_t s = 0; s < sizeof starts / sizeof starts[0]; s++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                memset(got, 0, sizeof got);
                luna_rng_bits_blocks(keys[k], starts[s], counts[c], got);
                for (int64_t i = 0; i < 4 * counts[c]; i++)
                    ck_assert_msg(got[i] == luna_rng_bits(keys[k], 4 * starts[s] + (uint64_t)i),
                                  "key %zu start %llu count %lld: word %lld differs", k,
                                  (unsigned long long)starts[s], (long long)counts[c],
                                  (long long)i);
            }
}
END_TEST

START_TEST(rng_streams_differ_and_are_uniform) {
    const int n = 200000;
    luna_rng_key a = {.seed = 1, .step = 0, .stream_id = 0};
    luna_rng_key b = a, c = a, d = a;
    b.stream_id = 1;
    c.step = 1;
    d.seed = 2;
    int same_b = 0, same_c = 0, same_d = 0;
    double sum = 0, sum2 = 0;
    int kept = 0;
    for (int i = 0; i < n; i++) {
        float u = luna_rng_uniform(a, (uint64_t)i);
        ck_assert(u >= 0.0f && u < 1.0f);
        sum += u;
        sum2 += (double)u * u;
        same_b += u == luna_rng_uniform(b, (uint64_t)i);
        same_c += u == luna_rng_uniform(c, (uint64_t)i);
        same_d += u == luna_rng_uniform(d, (uint64_t)i);
        kept += luna_rng_dropout_keep(a, (uint64_t)i, 0.1f);
    }
    double mean = sum / n, var = sum2 / n - mean * mean;
    ck_assert_msg(fabs(mean - 0.5) < 0.005, "mean %f", mean);
    ck_assert_msg(fabs(var - 1.0 / 12) < 0.002, "variance %f", var);
    ck_assert_msg(fabs((double)kept / n - 0.9) < 0.005, "dropout keep rate %f", (double)kept / n);
    /* Independent streams: coincidences are as rare as chance (24-bit values). */
    ck_assert_int_lt(same_b, 10);
    ck_assert_int_lt(same_c, 10);
    ck_assert_int_lt(same_d, 10);
}
END_TEST

START_TEST(rng_normal_moments) {
    const int n = 200000;
    luna_rng_key key = {.seed = 9, .step = 0, .stream_id = 3};
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; i++) {
        double z = luna_rng_normal(key, (uint64_t)i);
        ck_assert(isfinite(z));
        sum += z;
        sum2 += z * z;
    }
    double mean = sum / n, var = sum2 / n - mean * mean;
    ck_assert_msg(fabs(mean) < 0.01, "mean %f", mean);
    ck_assert_msg(fabs(var - 1.0) < 0.015, "variance %f", var);
}
END_TEST

/* luna_exp_nonpositive within 1 ulp of libm's exp over [−708, 0] (a grid, the reduction's
 * boundaries n·ln2/2 and their neighbours, tiny |t|), exact at 0, and 0 / NaN where documented. */
static double ulps_from_libm(double t) {
    const double want = exp(t), got = luna_exp_nonpositive(t);
    return fabs(got - want) / (nextafter(want, INFINITY) - want);
}

START_TEST(exp_double_within_one_ulp_of_libm) {
    double worst = 0.0, at = 0.0;
#define TRY(tv)                                                                                    \
    do {                                                                                           \
        const double t_ = (tv), u_ = ulps_from_libm(t_);                                           \
        if (u_ > worst) worst = u_, at = t_;                                                       \
    } while (0)
    for (int i = 0; i <= 2000000; i++)
        TRY(-708.0 * i / 2000000.0);
    for (int n = 1; n <= 2042; n++) { /* t = −n·ln2/2, where the rounding of n flips, ±1 ulp */
        const double b = -0.34657359027997264 * n;
        TRY(nextafter(b, 0.0));
        TRY(b);
        if (n < 2042) TRY(nextafter(b, -INFINITY));
    }
    for (double t = -1e-300; t > -1.0; t *= 3.7)
        TRY(t);
#undef TRY
    ck_assert_msg(worst <= 1.0, "exp(%.17g): %.3f ulp from libm", at, worst);
    ck_assert(luna_exp_nonpositive(0.0) == 1.0);
    ck_assert(luna_exp_nonpositive(-0.0) == 1.0);
    ck_assert(luna_exp_nonpositive(-708.5) == 0.0);
    ck_assert(luna_exp_nonpositive(-INFINITY) == 0.0);
    ck_assert(isnan(luna_exp_nonpositive(NAN)));
}
END_TEST

static Suite *core_suite(void) {
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, arena_counts_used_and_peak);
    tcase_add_test(tc, arena_many_chunks_stack_discipline);
    tcase_add_test(tc, arena_growing_requests_stay_bounded);
    tcase_add_test(tc, tensor_create_counts_bytes);
    tcase_add_test(tc, philox_known_answers);
    tcase_add_test(tc, rng_reproducible_across_thread_counts);
    tcase_add_test(tc, rng_bits_blocks_equal_scalar);
    tcase_add_test(tc, philox_cxx_equals_c);
    tcase_add_test(tc, rng_streams_differ_and_are_uniform);
    tcase_add_test(tc, rng_normal_moments);
    tcase_add_test(tc, exp_double_within_one_ulp_of_libm);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(core_suite()); }
