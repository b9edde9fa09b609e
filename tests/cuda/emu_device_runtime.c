/* The CUDA backend's device runtime (model/kernels/cuda/device_runtime.h) against the CPU
 * execution harness's CUDA runtime (tests/cuda_emu): the caching allocator reuses released blocks
 * (a steady-state "training step" makes no cudaMalloc), counts in-use / peak / reserved bytes,
 * rounds to its size classes, retries after trimming when cudaMalloc fails, rejects foreign and
 * double releases; CUDA errors become one-line statuses naming the call; device selection gives
 * one line when no GPU or driver is usable (LUNA_EMU_NO_DEVICE) and for an id out of range. */
#include <stdlib.h>
#include <string.h>

#include "luna_cuda_emu_api.h"
#include "model/kernels/cuda/device_runtime.h"
#include "tests/test_util.h"

START_TEST(size_classes) {
    ck_assert_uint_eq(luna_cuda_cache_class(0), 512);
    ck_assert_uint_eq(luna_cuda_cache_class(1), 512);
    ck_assert_uint_eq(luna_cuda_cache_class(512), 512);
    ck_assert_uint_eq(luna_cuda_cache_class(513), 1024);
    ck_assert_uint_eq(luna_cuda_cache_class((size_t)1 << 20), (size_t)1 << 20);
    ck_assert_uint_eq(luna_cuda_cache_class(((size_t)1 << 20) + 1), (size_t)2 << 20);
    ck_assert_uint_eq(luna_cuda_cache_class((size_t)5 << 20), (size_t)6 << 20);
}
END_TEST

/* A "training step": the same sequence of allocations and releases, as a pass's arenas and
 * temporaries make. After the first step the driver is not asked again. */
START_TEST(steady_state_steps_make_no_cudamalloc) {
    luna_cuda_cache *c;
    LUNA_CHECK_OK(luna_cuda_cache_create(&c));
    const uint64_t device0 = luna_emu_device_bytes();
    const size_t sizes[] = {100, 4096, 70000, (size_t)3 << 20, 513, 100, 8 << 20};
    enum { N = sizeof sizes / sizeof sizes[0] };
    uint64_t mallocs_after_first = 0;
    for (int step = 0; step < 5; step++) {
        void *p[N];
        for (int i = 0; i < N; i++) {
            LUNA_CHECK_OK(luna_cuda_cache_alloc(c, sizes[i], &p[i]));
            ck_assert_ptr_nonnull(p[i]);
            ck_assert_uint_eq((uintptr_t)p[i] % 256, 0);
            /* the block is usable device memory of at least the size asked */
            LUNA_CHECK_OK(luna_cuda_check(cudaMemset(p[i], 0, sizes[i]), "cudaMemset"));
        }
        for (int i = N; i-- > 0;)
            LUNA_CHECK_OK(luna_cuda_cache_release(c, p[i]));
        if (step == 0) mallocs_after_first = luna_cuda_cache_get_stats(c).mallocs;
    }
    luna_cuda_cache_stats s = luna_cuda_cache_get_stats(c);
    ck_assert_uint_eq(s.mallocs, mallocs_after_first);
    ck_assert_uint_eq(s.mallocs, N);
    ck_assert_uint_eq(s.cache_hits, 4 * N);
    ck_assert_uint_eq(s.in_use, 0);
    size_t total = 0;
    for (int i = 0; i < N; i++)
        total += luna_cuda_cache_class(sizes[i]);
    ck_assert_uint_eq(s.peak, total);
    ck_assert_uint_eq(s.reserved, total);
    ck_assert_uint_eq(luna_emu_device_bytes() - device0, total); /* exactly what the driver gave */
    LUNA_CHECK_OK(luna_cuda_cache_trim(c));
    s = luna_cuda_cache_get_stats(c);
    ck_assert_uint_eq(s.reserved, 0);
    ck_assert_uint_eq(s.frees, N);
    ck_assert_uint_eq(luna_emu_device_bytes(), device0);
    luna_cuda_cache_free(c);
}
END_TEST

START_TEST(releases_are_checked_and_free_returns_everything) {
    luna_cuda_cache *c;
    LUNA_CHECK_OK(luna_cuda_cache_create(&c));
    const uint64_t device0 = luna_emu_device_bytes();
    void *a, *b;
    LUNA_CHECK_OK(luna_cuda_cache_alloc(c, 1000, &a));
    LUNA_CHECK_OK(luna_cuda_cache_alloc(c, 1000, &b));
    ck_assert_ptr_ne(a, b); /* in use: never handed out twice */
    LUNA_CHECK_OK(luna_cuda_cache_release(c, a));
    ck_assert_int_eq(luna_cuda_cache_release(c, a), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "released twice"));
    luna_error_clear();
    int host;
    ck_assert_int_eq(luna_cuda_cache_release(c, &host), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "not allocated by this allocator"));
    luna_error_clear();
    LUNA_CHECK_OK(luna_cuda_cache_release(c, NULL));
    /* b still in use when the allocator is freed: returned to the driver too */
    luna_cuda_cache_free(c);
    ck_assert_uint_eq(luna_emu_device_bytes(), device0);
}
END_TEST

START_TEST(out_of_memory_trims_the_cache_then_reports) {
    luna_cuda_cache *c;
    LUNA_CHECK_OK(luna_cuda_cache_create(&c));
    void *p;
    LUNA_CHECK_OK(luna_cuda_cache_alloc(c, 4096, &p));
    LUNA_CHECK_OK(luna_cuda_cache_release(c, p));
    luna_emu_set_error_mode(LUNA_EMU_RECORD);
    /* far beyond any machine: cudaMalloc fails, the cache is trimmed, the retry fails too */
    ck_assert_int_eq(luna_cuda_cache_alloc(c, (size_t)1 << 60, &p), LUNA_ERR_OUT_OF_MEMORY);
    ck_assert_ptr_null(p);
    const char *m = luna_error_message();
    ck_assert_ptr_nonnull(strstr(m, "cudaMalloc"));
    ck_assert_ptr_nonnull(strstr(m, "cudaErrorMemoryAllocation"));
    luna_error_clear();
    luna_cuda_cache_stats s = luna_cuda_cache_get_stats(c);
    ck_assert_uint_eq(s.reserved, 0); /* the cached block went back before the retry */
    ck_assert_uint_eq(s.mallocs, 3);
    luna_emu_set_error_mode(LUNA_EMU_ABORT);
    luna_cuda_cache_free(c);
}
END_TEST

START_TEST(errors_name_the_call) {
    luna_emu_set_error_mode(LUNA_EMU_RECORD);
    int host[4];
    /* device-to-device copy between host pointers: the runtime refuses */
    luna_status st =
        luna_cuda_check(cudaMemcpy(host, host + 2, 8, cudaMemcpyDeviceToDevice), "cudaMemcpy(d2d)");
    ck_assert_int_ne(st, LUNA_OK);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "CUDA: cudaMemcpy(d2d) failed: cudaError"));
    ck_assert_ptr_null(strchr(luna_error_message(), '\n'));
    luna_error_clear();
    /* the non-sticky error is cleared: the next call is not blamed */
    ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
    ck_assert_int_eq(luna_cuda_check(cudaSuccess, "nothing"), LUNA_OK);
    luna_emu_set_error_mode(LUNA_EMU_ABORT);
}
END_TEST

START_TEST(device_selection) {
    int dev = -1;
    LUNA_CHECK_OK(luna_cuda_select_device(-1, &dev));
    ck_assert_int_eq(dev, 0);
    ck_assert_int_eq(luna_cuda_select_device(3, &dev), LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "GPU 3 requested, this machine has 1"));
    luna_error_clear();
    /* no usable driver (as on this project's machines with the real runtime) */
    setenv("LUNA_EMU_NO_DEVICE", "1", 1);
    luna_emu_set_error_mode(LUNA_EMU_RECORD);
    ck_assert_int_eq(luna_cuda_select_device(-1, &dev), LUNA_ERR_UNSUPPORTED);
    const char *m = luna_error_message();
    ck_assert_ptr_nonnull(strstr(m, "--device cuda: no usable GPU"));
    ck_assert_ptr_nonnull(strstr(m, "cudaErrorInsufficientDriver"));
    ck_assert_ptr_null(strchr(m, '\n'));
    luna_error_clear();
    unsetenv("LUNA_EMU_NO_DEVICE");
    luna_emu_set_error_mode(LUNA_EMU_ABORT);
    LUNA_CHECK_OK(luna_cuda_select_device(0, &dev));
}
END_TEST

static Suite *runtime_suite(void) {
    Suite *s = suite_create("cuda_device_runtime");
    TCase *tc = tcase_create("runtime");
    tcase_add_test(tc, size_classes);
    tcase_add_test(tc, steady_state_steps_make_no_cudamalloc);
    tcase_add_test(tc, releases_are_checked_and_free_returns_everything);
    tcase_add_test(tc, out_of_memory_trims_the_cache_then_reports);
    tcase_add_test(tc, errors_name_the_call);
    tcase_add_test(tc, device_selection);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(runtime_suite()); }
