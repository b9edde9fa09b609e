/* The CUDA execution harness itself (tests/cuda_emu/README.md): kernels of selftest_kernels.cu
 * run as fibers on the CPU, in the thread order of LUNA_EMU_ORDER (CTest runs this suite once
 * per order); the broken-kernel cases set orders and the record error mode themselves. Host
 * code here is plain C against NVIDIA's cuda_runtime_api.h, linked with luna_cuda_emu. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/cuda_emu/luna_cuda_emu_api.h"
#include "tests/cuda_emu/selftest_kernels.h"
#include "tests/test_util.h"

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    ck_assert_int_eq(cudaMalloc(&p, bytes), cudaSuccess);
    return p;
}
static float *dev_upload(const float *h, size_t n) {
    float *d = dev_alloc(n * sizeof *d);
    ck_assert_int_eq(cudaMemcpy(d, h, n * sizeof *d, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}
static void download(void *h, const void *d, size_t bytes) {
    ck_assert_int_eq(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}
static float *random_vector(size_t n, uint64_t seed) {
    luna_test_rng rng;
    luna_test_rng_seed(&rng, seed);
    float *x = malloc(n * sizeof *x);
    luna_test_fill_uniform(&rng, x, n, -1.0f, 1.0f);
    return x;
}
/* An expected kernel error: the launcher reports the sticky cudaErrorLaunchFailure and the
 * harness's message contains `what`; cudaDeviceReset clears it (and frees device memory). */
static void expect_kernel_error(cudaError_t got, const char *what) {
    ck_assert_int_eq(got, cudaErrorLaunchFailure);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    ck_assert_msg(strstr(luna_emu_last_error(), what), "message '%s' lacks '%s'",
                  luna_emu_last_error(), what);
    ck_assert_int_eq(cudaDeviceReset(), cudaSuccess);
}

/* Block reduction with LUNA_SHARED and __syncthreads, n not a multiple of the block. */
static int block_sum_ok(int n, int missing_barrier) {
    float *x = random_vector((size_t)n, 11), *xd = dev_upload(x, (size_t)n);
    int blocks = (n + 255) / 256, ok = 1;
    float *outd = dev_alloc((size_t)blocks * sizeof(float)),
          *out = malloc((size_t)blocks * sizeof(float));
    ck_assert_int_eq(selftest_block_sum(outd, xd, n, missing_barrier), cudaSuccess);
    download(out, outd, (size_t)blocks * sizeof(float));
    for (int b = 0; b < blocks; b++) {
        double ref = 0.0;
        for (int i = b * 256; i < n && i < (b + 1) * 256; i++)
            ref += x[i];
        if (!(fabs(out[b] - ref) <= 1e-5 * 256)) ok = 0;
    }
    cudaFree(xd), cudaFree(outd), free(x), free(out);
    return ok;
}

START_TEST(test_block_sum) {
    printf("order %s\n", luna_emu_order_name(luna_emu_get_order()));
    ck_assert(block_sum_ok(1000, 0));
    ck_assert(block_sum_ok(1, 0));
}
END_TEST

START_TEST(test_block_sum_dynamic_shared) {
    const int sizes[] = {32, 64, 512, 1024};
    for (int s = 0; s < 4; s++) {
        int n = 3 * sizes[s] + 5, threads = sizes[s], blocks = (n + threads - 1) / threads;
        float *x = random_vector((size_t)n, 12), *xd = dev_upload(x, (size_t)n);
        float *outd = dev_alloc((size_t)blocks * sizeof(float)), out[8];
        ck_assert_int_eq(selftest_block_sum_dynamic(outd, xd, n, threads), cudaSuccess);
        download(out, outd, (size_t)blocks * sizeof(float));
        for (int b = 0; b < blocks; b++) {
            double ref = 0.0;
            for (int i = b * threads; i < n && i < (b + 1) * threads; i++)
                ref += x[i];
            ck_assert_double_le(fabs(out[b] - ref), 1e-4);
        }
        cudaFree(xd), cudaFree(outd), free(x);
    }
}
END_TEST

/* __shfl_xor_sync butterfly sum, __shfl_up_sync prefix sum, __ballot_sync; 3 blocks, one with
 * only 2 of its 4 warps live (the others leave before any warp intrinsic). */
START_TEST(test_warp_ops) {
    const int n = 320, warps = n / 32;
    float *x = random_vector(n, 13), *xd = dev_upload(x, n);
    float *sumd = dev_alloc(warps * sizeof(float)), *prefd = dev_alloc(n * sizeof(float));
    unsigned *balld = dev_alloc(warps * sizeof(unsigned)), ball[10];
    float sum[10], pref[320];
    ck_assert_int_eq(selftest_warp_sum(sumd, balld, prefd, xd, n), cudaSuccess);
    download(sum, sumd, sizeof sum), download(ball, balld, sizeof ball),
        download(pref, prefd, sizeof pref);
    for (int w = 0; w < warps; w++) {
        double ref = 0.0, run = 0.0;
        unsigned bits = 0;
        for (int l = 0; l < 32; l++) {
            ref += x[32 * w + l], run += x[32 * w + l];
            bits |= (unsigned)(x[32 * w + l] > 0.0f) << l;
            ck_assert_double_le(fabs(pref[32 * w + l] - run), 1e-5);
        }
        ck_assert_double_le(fabs(sum[w] - ref), 1e-5);
        ck_assert_uint_eq(ball[w], bits);
    }
    cudaFree(xd), cudaFree(sumd), cudaFree(prefd), cudaFree(balld), free(x);
}
END_TEST

/* The lesson of the prototype: a missing barrier that one order hides. Forward runs thread 0
 * to the first reads before thread 128 has stored (caught: it reads NaN); reverse runs the
 * storing threads first (hidden); random catches it. */
START_TEST(test_missing_barrier_caught) {
    const luna_emu_order orders[] = {LUNA_EMU_FORWARD, LUNA_EMU_REVERSE, LUNA_EMU_RANDOM};
    int correct[3];
    for (int o = 0; o < 3; o++) {
        luna_emu_set_order(orders[o], 5);
        ck_assert(block_sum_ok(1000, 0)); /* the correct kernel passes in every order */
        correct[o] = block_sum_ok(1000, 1);
        printf("missing __syncthreads, order %s: %s\n", luna_emu_order_name(orders[o]),
               correct[o] ? "passes (bug hidden)" : "wrong result (bug caught)");
    }
    ck_assert(!correct[0] && correct[1] && !correct[2]);
}
END_TEST

START_TEST(test_shuffle_mask_names_exited_lane) {
    luna_emu_set_error_mode(LUNA_EMU_RECORD);
    float *outd = dev_alloc(32 * sizeof(float));
    expect_kernel_error(selftest_shuffle_exited_lane(outd, 16), "names lane 16, which has exited");
    outd = dev_alloc(32 * sizeof(float));
    ck_assert_int_eq(selftest_shuffle_exited_lane(outd, 32), cudaSuccess); /* all lanes: fine */
    cudaFree(outd);
}
END_TEST

START_TEST(test_partial_syncthreads) {
    luna_emu_set_error_mode(LUNA_EMU_RECORD);
    float *outd = dev_alloc(64 * sizeof(float));
    expect_kernel_error(selftest_partial_syncthreads(outd, 40), "exited before a __syncthreads");
}
END_TEST

START_TEST(test_divergent_barriers_deadlock) {
    luna_emu_set_error_mode(LUNA_EMU_RECORD);
    float *outd = dev_alloc(32 * sizeof(float));
    expect_kernel_error(selftest_divergent_sync(outd),
                        "lane 16 waits at __syncthreads instead (deadlock)");
}
END_TEST

START_TEST(test_host_pointer_argument) {
    luna_emu_set_error_mode(LUNA_EMU_RECORD);
    float host[4] = {0}, *xd = dev_alloc(4 * sizeof(float));
    cudaError_t e = selftest_template_scale(host, xd, 4, 2);
    ck_assert_int_eq(e, cudaErrorIllegalAddress);
    ck_assert(strstr(luna_emu_last_error(), "pointer argument 0"));
    ck_assert_int_eq(cudaDeviceReset(), cudaSuccess);
}
END_TEST

/* bf16: round to nearest even (ties included), NaN, infinities, subnormals, overflow. */
static float bf16_reference(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return f; /* NaN stays NaN */
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
START_TEST(test_bf16_round_trip) {
    enum { N = 1024 };
    float x[N], y[N], s[N];
    luna_test_rng rng;
    luna_test_rng_seed(&rng, 14);
    const float special[] = {1.00390625f, 1.01171875f, -1.00390625f, 3.3895314e38f,
                             1e-40f,      -0.0f,       INFINITY,     -INFINITY,
                             NAN,         65504.0f,    1.0f / 3.0f};
    for (int i = 0; i < N; i++)
        x[i] = i < 11 ? special[i]
                      : luna_test_uniform(&rng, -4.0f, 4.0f) * powf(2.0f, (float)(i % 40 - 20));
    float *xd = dev_upload(x, N), *yd = dev_alloc(sizeof y), *sd = dev_alloc(sizeof s);
    ck_assert_int_eq(selftest_bf16(yd, sd, xd, N), cudaSuccess);
    download(y, yd, sizeof y), download(s, sd, sizeof s);
    for (int i = 0; i < N; i++) {
        float r = bf16_reference(x[i]);
        if (isnan(r)) {
            ck_assert(isnan(y[i]) && isnan(s[i]));
            continue;
        }
        ck_assert_msg(memcmp(&y[i], &r, 4) == 0, "x %a: bf16 %a, reference %a", x[i], y[i], r);
        float twice = bf16_reference(r + r);
        ck_assert_msg(s[i] == twice, "x %a: b + b = %a, reference %a", x[i], s[i], twice);
    }
    ck_assert_float_eq(y[0], 1.0f);      /* tie to even: 1 + 2^-8 -> 1 */
    ck_assert_float_eq(y[1], 1.015625f); /* tie to even: 1 + 3·2^-8 -> 1 + 2^-6 */
    cudaFree(xd), cudaFree(yd), cudaFree(sd);
}
END_TEST

START_TEST(test_transpose_2d_shared_and_template_launch) {
    const int rows = 37, cols = 70;
    float *x = random_vector((size_t)rows * cols, 15), *xd = dev_upload(x, (size_t)rows * cols);
    float *td = dev_alloc((size_t)rows * cols * sizeof(float)),
          *t = malloc((size_t)rows * cols * sizeof(float));
    ck_assert_int_eq(selftest_transpose(td, xd, rows, cols), cudaSuccess);
    download(t, td, (size_t)rows * cols * sizeof(float));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            ck_assert_float_eq(t[c * rows + r], x[r * cols + c]);
    for (int k = 2; k <= 3; k++) {
        ck_assert_int_eq(selftest_template_scale(td, xd, 100, k), cudaSuccess);
        download(t, td, 100 * sizeof(float));
        for (int i = 0; i < 100; i++)
            ck_assert_float_eq(t[i], x[i] * (float)k);
    }
    cudaFree(xd), cudaFree(td), free(x), free(t);
}
END_TEST

START_TEST(test_row_sum_readme_example) {
    const int rows = 5, d = 1000;
    float *x = random_vector((size_t)rows * d, 16), *xd = dev_upload(x, (size_t)rows * d);
    float *outd = dev_alloc(rows * sizeof(float)), out[5];
    ck_assert_int_eq(selftest_row_sum(outd, xd, rows, d), cudaSuccess);
    download(out, outd, sizeof out);
    for (int r = 0; r < rows; r++) {
        double ref = 0.0;
        for (int j = 0; j < d; j++)
            ref += x[r * d + j];
        ck_assert_double_le(fabs(out[r] - ref), 1e-4);
    }
    cudaFree(xd), cudaFree(outd), free(x);
}
END_TEST

/* The fake runtime checks its arguments like the real one (or stricter). */
START_TEST(test_runtime_argument_checks) {
    float host[64] = {0}, *d = dev_alloc(64 * sizeof(float)), *d2 = dev_alloc(16 * sizeof(float));
    ck_assert_int_eq(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d, d2, 16, cudaMemcpyHostToDevice),
                     cudaErrorInvalidValue); /* src is device */
    ck_assert_int_eq(cudaMemcpy(host, d, sizeof host, cudaMemcpyHostToDevice),
                     cudaErrorInvalidValue);
    ck_assert_int_eq(cudaMemcpy(host, d2, 17 * sizeof(float), cudaMemcpyDeviceToHost),
                     cudaErrorInvalidValue);
    ck_assert_int_eq(cudaMemcpy(d2, d + 1, 16 * sizeof(float), cudaMemcpyDeviceToDevice),
                     cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d, d + 1, 16, cudaMemcpyDeviceToDevice),
                     cudaErrorInvalidValue); /* overlap */
    ck_assert_int_eq(cudaMemset(d2, 0, 16 * sizeof(float) + 1), cudaErrorInvalidValue);
    ck_assert_int_eq(cudaGetLastError(), cudaErrorInvalidValue); /* non-sticky: cleared */
    ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
    ck_assert_int_eq(cudaFree(d + 1), cudaErrorInvalidValue); /* interior pointer */
    ck_assert_int_eq(cudaFree(host), cudaErrorInvalidValue);
    ck_assert_int_eq(cudaFree(d), cudaSuccess);
    ck_assert_int_eq(cudaFree(d), cudaErrorInvalidValue); /* double free */
    void *pinned = NULL;
    ck_assert_int_eq(cudaMallocHost(&pinned, 64), cudaSuccess);
    ck_assert_int_eq(cudaFree(pinned), cudaErrorInvalidValue);
    ck_assert_int_eq(cudaFreeHost(pinned), cudaSuccess);
    cudaStream_t s;
    ck_assert_int_eq(cudaStreamCreate(&s), cudaSuccess);
    ck_assert_int_eq(cudaMemsetAsync(d2, 0, 16, s), cudaSuccess);
    ck_assert_int_eq(cudaStreamDestroy(s), cudaSuccess);
    ck_assert_int_eq(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    ck_assert_int_eq(cudaFree(d2), cudaSuccess);
    ck_assert_uint_eq(luna_emu_device_bytes(), 0);
    /* an invalid configuration is a non-sticky launch error */
    ck_assert_int_eq(selftest_block_sum_dynamic(NULL, NULL, 1, 2048),
                     cudaErrorInvalidConfiguration);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    int count = 0;
    ck_assert_int_eq(cudaGetDeviceCount(&count), cudaSuccess);
    ck_assert_int_eq(count, 1);
    ck_assert_int_eq(cudaSetDevice(1), cudaErrorInvalidDevice);
}
END_TEST

/* Launches per CPU second of a one-block kernel of 256 threads with 4 __syncthreads (process
 * CPU time: the machine may be shared, and wall time then measures the neighbours). */
START_TEST(test_launch_rate) {
    float *outd = dev_alloc(sizeof(float)), out = 0.0f;
    struct timespec t0, t1;
    int launches = 0;
    double seconds = 0.0;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    do {
        for (int i = 0; i < 100; i++)
            ck_assert_int_eq(selftest_barrier_block(outd), cudaSuccess);
        launches += 100;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
        seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    } while (seconds < 0.3);
    download(&out, outd, sizeof out);
    ck_assert_float_eq(out, 511.0f); /* s[t] = 256 - t after the second store: s[1] + s[0] */
    printf("launch rate (256 threads, 4 barriers, order %s): %.0f launches per CPU second, "
           "%.1f us/launch\n",
           luna_emu_order_name(luna_emu_get_order()), launches / seconds, 1e6 * seconds / launches);
    cudaFree(outd);
}
END_TEST

static Suite *cuda_emu_suite(void) {
    Suite *s = suite_create("cuda_emu");
    TCase *tc = tcase_create("harness");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_block_sum);
    tcase_add_test(tc, test_block_sum_dynamic_shared);
    tcase_add_test(tc, test_warp_ops);
    tcase_add_test(tc, test_missing_barrier_caught);
    tcase_add_test(tc, test_shuffle_mask_names_exited_lane);
    tcase_add_test(tc, test_partial_syncthreads);
    tcase_add_test(tc, test_divergent_barriers_deadlock);
    tcase_add_test(tc, test_host_pointer_argument);
    tcase_add_test(tc, test_row_sum_readme_example);
    tcase_add_test(tc, test_bf16_round_trip);
    tcase_add_test(tc, test_transpose_2d_shared_and_template_launch);
    tcase_add_test(tc, test_runtime_argument_checks);
    tcase_add_test(tc, test_launch_rate);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(cuda_emu_suite()); }
