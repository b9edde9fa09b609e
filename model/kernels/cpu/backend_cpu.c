/* The CPU backend: host memory, OpenMP threads, OpenBLAS GEMM. Its kernels are the reference
 * implementation every other backend is tested against. */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/allocator.h"
#include "core/attention_composed.h"
#include "core/backend.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "model/kernels/cpu/cpu_ops.h"

/* The kernels behind core/op_checks.c's checks (be->kernels), in struct luna_ops's order. */
static const luna_ops cpu_kernels = {
    .gemm = luna_cpu_gemm,
    .gemm_grid = luna_cpu_gemm_grid,
    .linear_forward = luna_cpu_linear_forward,
    .linear_relu_forward = luna_cpu_linear_relu_forward,
    .linear_backward = luna_cpu_linear_backward,
    .linear_forward_multi = luna_cpu_linear_forward_multi,
    .linear_backward_multi = luna_cpu_linear_backward_multi,
    .residual_norm_forward = luna_cpu_residual_norm_forward,
    .residual_norm_backward = luna_cpu_residual_norm_backward,
    .bias_relu_dropout_forward = luna_cpu_bias_relu_dropout_forward,
    .bias_relu_dropout_backward = luna_cpu_bias_relu_dropout_backward,
    .softmax_dropout_forward = luna_cpu_softmax_dropout_forward,
    .softmax_dropout_backward = luna_cpu_softmax_dropout_backward,
    .cross_entropy_forward = luna_cpu_cross_entropy_forward,
    .cross_entropy_forward_backward = luna_cpu_cross_entropy_forward_backward,
    .loss_sums = luna_cpu_loss_sums,
    .softmax_forward = luna_cpu_softmax_forward,
    .attention_forward = luna_attention_composed_forward,
    .attention_backward = luna_attention_composed_backward,
    .causal_contraction_forward = luna_cpu_causal_contraction_forward,
    .causal_contraction_backward = luna_cpu_causal_contraction_backward,
    .embedding_forward = luna_cpu_embedding_forward,
    .embedding_backward = luna_cpu_embedding_backward,
    .sinusoidal_table = luna_cpu_sinusoidal_table,
    .positions_add = luna_cpu_positions_add,
    .dropout_forward = luna_cpu_dropout_forward,
    .dropout_backward = luna_cpu_dropout_backward,
    .softplus_ln2_forward = luna_cpu_softplus_ln2_forward,
    .softplus_ln2_backward = luna_cpu_softplus_ln2_backward,
    .elu_plus_one_forward = luna_cpu_elu_plus_one_forward,
    .elu_plus_one_backward = luna_cpu_elu_plus_one_backward,
    .add = luna_cpu_add,
    .axpy = luna_cpu_axpy,
    .scale_act = luna_cpu_scale_act,
    .split_heads = luna_cpu_split_heads,
    .merge_heads = luna_cpu_merge_heads,
    .broadcast_rows = luna_cpu_broadcast_rows,
    .sum_broadcast = luna_cpu_sum_broadcast,
    .multi_sum_squares = luna_cpu_multi_sum_squares,
    .clip_coefficients = luna_cpu_clip_coefficients,
    .multi_scale = luna_cpu_multi_scale,
    .multi_apollo_update = luna_cpu_multi_apollo_update,
    .multi_adam_update = luna_cpu_multi_adam_update,
    .gather_rows = luna_cpu_gather_rows,
    .gather_rows_in_groups = luna_cpu_gather_rows_in_groups,
    .index_rows_update = luna_cpu_index_rows_update,
    .log_softmax_topk = luna_cpu_log_softmax_topk,
    .causal_step_products = luna_cpu_causal_step_products,
    .cache_products = luna_cpu_cache_products,
    .cache_write = luna_cpu_cache_write,
    .cross_attention = luna_cpu_cross_attention,
    .beam_select = luna_cpu_beam_select,
    .hold_weights = luna_cpu_hold_weights,
    .release_weights = luna_cpu_release_weights,
};

/* Large buffers are mapped from the OS and unmapped on release, so that a released one gives its
 * pages back: the C heap keeps freed blocks resident once glibc has raised its mmap threshold past
 * their size (it does after freeing a mapped block of up to 32 MiB), and a buffer that grows by
 * reallocation (decoding's key/value pages, decoding/kv_pages.h) would leave every smaller copy
 * in the process. Under AddressSanitizer everything stays on its heap, which checks the ends. */
#if defined(__SANITIZE_ADDRESS__)
#define LUNA_CPU_MAP_BYTES ((size_t)-1)
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LUNA_CPU_MAP_BYTES ((size_t)-1)
#endif
#endif
#ifndef LUNA_CPU_MAP_BYTES
#define LUNA_CPU_MAP_BYTES ((size_t)1 << 20)
#endif

/* 256-byte aligned host memory: the arena's alignment, as cudaMalloc gives on the GPU (a mapping
 * is page-aligned). */
static void *cpu_alloc(luna_backend *be, size_t bytes) {
    (void)be;
    if (bytes >= LUNA_CPU_MAP_BYTES) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = NULL;
    size_t rounded = (bytes + 255) & ~(size_t)255;
    if (posix_memalign(&p, 256, rounded ? rounded : 256) != 0) return NULL;
    return p;
}
static void cpu_release(luna_backend *be, void *p, size_t bytes) {
    (void)be;
    if (bytes >= LUNA_CPU_MAP_BYTES)
        (void)munmap(p, bytes);
    else
        free(p);
}
static luna_status cpu_zero(luna_backend *be, void *p, size_t bytes) {
    (void)be;
    memset(p, 0, bytes);
    return LUNA_OK;
}
/* Host and "device" are the same memory: every copy is a memmove (regions may overlap). */
static luna_status cpu_copy(luna_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
    return LUNA_OK;
}
static luna_status cpu_synchronize(luna_backend *be) {
    (void)be;
    return LUNA_OK;
}

static void cpu_destroy(luna_backend *be) {
    luna_cpu_held_free(be->impl); /* weights held and not released */
    be->impl = NULL;
}

static const luna_backend_memory cpu_memory = {
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .from_host = cpu_copy,
    .to_host = cpu_copy,
    .synchronize = cpu_synchronize,
    .destroy = cpu_destroy,
};

void luna_backend_cpu_set_threads(luna_backend *be, int num_threads) {
    if (num_threads <= 0) num_threads = omp_get_max_threads();
    be->num_threads = num_threads;
    omp_set_num_threads(num_threads);
    /* GEMM is parallelised by luna itself over fixed tiles of C (gemm.c), each tile a
     * single-threaded OpenBLAS call, so results do not depend on the thread count. OpenBLAS's own
     * pthread pool is therefore kept at one thread. */
    openblas_set_num_threads(1);
}

luna_status luna_backend_cpu_create(luna_backend **out, int num_threads) {
    luna_backend *be = calloc(1, sizeof *be);
    if (!be) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "backend: cannot allocate the CPU backend");
    be->name = "cpu";
    be->device = LUNA_DEVICE_CPU;
    be->act_dtype = LUNA_F32;
    be->mem = &cpu_memory;
    luna_backend_cpu_set_threads(be, num_threads);
    luna_status st = luna_backend_set_kernels(be, &cpu_kernels);
    if (st == LUNA_OK) st = luna_arena_create(&be->scratch, be, (size_t)16 << 20);
    if (st != LUNA_OK) {
        free(be);
        return st;
    }
    *out = be;
    return LUNA_OK;
}
