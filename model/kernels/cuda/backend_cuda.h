/* The CUDA backend's private state, shared by its files: backend_cuda.c (creation, the memory
 * vtable, device error flags), cuda_ops.c (the op table over the kernel launchers) and
 * weight_copies.c (bf16 copies of the fp32 weights, and the holds of hold_weights).
 *
 * One device, one compute stream, one cuBLASLt handle; device memory from the caching allocator
 * (device_runtime.h). Not thread-safe beyond the allocator (which data workers may call). */
#ifndef LUNA_KERNELS_CUDA_BACKEND_CUDA_H
#define LUNA_KERNELS_CUDA_BACKEND_CUDA_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "core/backend.h"
#include "core/tensor_table.h"
#include "model/kernels/cuda/device_runtime.h"
#include "model/kernels/cuda/gemm_lt.h"

/* A bf16 copy of an fp32 weight (bf16 mode): converted on first use by linear, valid until an
 * op or memory call writes any byte of the fp32 original (then reconverted on next use). */
typedef struct {
    uintptr_t src; /* the fp32 weight (device address) */
    size_t numel;
    void *copy; /* numel bf16 values, from the allocator */
    bool valid;
} luna_cuda_weight_copy;

/* A weight held by hold_weights (counted; nothing is kept for it on CUDA: cuBLASLt reads the
 * weight, or its bf16 copy, as it is). */
typedef struct {
    const float *W;
    int out, in; /* the shape it was held with */
    int count;
} luna_cuda_hold;

#define LUNA_CUDA_ID_RANGES 8 /* a training pass uploads source, previous and target tokens */

typedef struct {
    int device;
    bool bf16;         /* activations bf16 (else fp32) */
    bool cache_memory; /* false (LUNA_CUDA_CACHE=0): exact cudaMalloc/cudaFree per allocation */
    cudaStream_t stream;
    luna_cuda_cache *cache;
    pthread_mutex_t alloc_lock; /* the allocator is shared with data-loading threads */
    luna_cuda_blas blas;
    int *first_bad;  /* device int: luna_cuda_check_ids's result */
    int *pinned_ids; /* 2 host ints in pinned memory: luna_cuda_check_ids's "none" and result */
    /* from_host's staging (backend_cuda.c): pinned memory in two halves used in turn */
    unsigned char *staging;
    size_t staging_used; /* bytes taken in the current half */
    int staging_half;
    cudaEvent_t half_done[2]; /* recorded when a half is left: its copies are then queued */
    bool half_pending[2];
    pthread_mutex_t staging_lock;
    luna_cuda_weight_copy *copies;
    size_t ncopies, cap_copies;
    luna_cuda_hold *holds;
    size_t nholds, cap_holds;
    /* ranges of token ids uploaded with ids_from_host since the last to_host / synchronize */
    struct {
        const int32_t *p;
        int64_t n;
        int32_t lo, hi;
    } id_ranges[LUNA_CUDA_ID_RANGES];
    int nid_ranges;
    pthread_mutex_t id_lock;  /* loader threads upload and free beside the training thread */
    _Atomic uint64_t waits;   /* host waits on the stream or a staging event (device_stats) */
    _Atomic uint64_t wait_ns; /* and the host's time in them */
    /* graphs (graphs.c): the stream is capturing, on this thread; graph launches so far */
    bool capturing;
    pthread_t capture_thread;
    _Atomic uint64_t graph_launches;
} luna_cuda_impl;

static inline luna_cuda_impl *luna_cuda_impl_of(const luna_backend *be) {
    return (luna_cuda_impl *)be->impl;
}

/* Graphs (core/backend.h luna_backend_memory; graphs.c): stream capture of the backend's
 * stream, instantiated as a cudaGraphExec_t. */
luna_status luna_cuda_graph_begin(luna_backend *be);
luna_status luna_cuda_graph_end(luna_backend *be, void **graph);
luna_status luna_cuda_graph_launch(luna_backend *be, void *graph);
void luna_cuda_graph_free(luna_backend *be, void *graph);
/* LUNA_OK, or an error naming `what` when this thread is capturing the stream (a host transfer
 * or allocation cannot be part of a graph). */
luna_status luna_cuda_not_capturing(luna_backend *be, const char *what);

/* The kernel table behind core/op_checks.c's checks (cuda_ops.c). */
extern const luna_ops luna_cuda_kernels;

/* Device memory [p, p + bytes) is about to be written (or freed): bf16 copies of any weight
 * overlapping it become stale (freed: dropped). */
void luna_cuda_weights_written(luna_backend *be, const void *p, size_t bytes);
/* A hash of the copies (weight, copy, current or not): the backend's graph_state. */
uint64_t luna_cuda_weights_state(luna_backend *be);
void luna_cuda_weights_freed(luna_backend *be, const void *p);
/* The bf16 copy of W [numel] (converted now when stale), for linear in bf16 mode. */
luna_status luna_cuda_weight_bf16(luna_backend *be, const float *W, size_t numel,
                                  const void **copy);
luna_status luna_cuda_hold_weights(luna_backend *be, const float *W, int out, int in,
                                   luna_dtype dtype);
luna_status luna_cuda_release_weights(luna_backend *be, const float *W);
/* Frees every copy and hold (backend teardown). */
void luna_cuda_weights_clear(luna_backend *be);

/* Token ids live on the device, so the ops that must reject ids outside [0, V) (embedding, cross
 * entropy, the picked tokens of log_softmax_topk) check them with a kernel and read the answer
 * back: the error of luna_op_bad_id (core/backend.h) for the first id outside [0, V) and not
 * *exempt (exempt NULL: none), as the CPU's luna_op_check_ids gives. Waits for the stream —
 * unless the ids lie in a range uploaded with ids_from_host since the last to_host/synchronize
 * whose values, seen on the host, are all in [0, V). */
luna_status luna_cuda_check_ids(luna_backend *be, const char *op, const char *what,
                                const int32_t *ids, int64_t n, int V, const int *exempt);

/* Raw allocation outside the counted luna_mem_alloc (the backend's own buffers). */
void *luna_cuda_raw_alloc(luna_backend *be, size_t bytes);
void luna_cuda_raw_release(luna_backend *be, void *p);

/* cuda_ops_optim.c: the optimizer ops of the table (clipping and the multi-tensor updates). */
luna_status luna_cuda_op_multi_sum_squares(luna_backend *be, float *result, const float *x,
                                           const luna_tensor_table *tt);
luna_status luna_cuda_op_clip_coefficients(luna_backend *be, float *coef, double *summary,
                                           const float *sumsq, int n, double clip_norm, int mode,
                                           const double *also_finite, int num_also);
luna_status luna_cuda_op_multi_scale(luna_backend *be, float *x, const luna_tensor_table *tt,
                                     const float *coef, float alpha);
luna_status luna_cuda_op_multi_apollo_update(luna_backend *be, float *theta, const float *g,
                                             float *exp_avg, float *approx_hessian, float *update,
                                             const luna_tensor_table *tt, int64_t *steps,
                                             const double *gate, double lr, double beta, double eps,
                                             double sigma, int rebound, double weight_decay,
                                             int wd_type);
luna_status luna_cuda_op_multi_adam_update(luna_backend *be, float *theta, const float *g,
                                           float *exp_avg, float *exp_avg_sq,
                                           const luna_tensor_table *tt, int64_t *steps,
                                           const double *gate, double lr, double beta1,
                                           double beta2, double eps, double weight_decay);

/* cuda_ops_fused.c: the fused ops of the table (fused.cu). */
luna_status luna_cuda_op_residual_norm_forward(luna_backend *be, luna_act *y, luna_act *r,
                                               float *mean, float *rstd, const luna_act *sub,
                                               const float *bias, const luna_act *res,
                                               const float *gamma, const float *beta, int64_t rows,
                                               int d, float eps, float p, luna_rng_key key);
luna_status luna_cuda_op_residual_norm_backward(luna_backend *be, luna_act *dres, luna_act *dsub,
                                                float *dbias, float *dgamma, float *dbeta,
                                                const luna_act *dy, const luna_act *r,
                                                const float *mean, const float *rstd,
                                                const float *gamma, int64_t rows, int d, float p,
                                                luna_rng_key key);
luna_status luna_cuda_op_bias_relu_dropout_forward(luna_backend *be, luna_act *a, luna_act *h,
                                                   const float *bias, int64_t rows, int cols,
                                                   float p, luna_rng_key key);
luna_status luna_cuda_op_bias_relu_dropout_backward(luna_backend *be, luna_act *dh, float *dbias,
                                                    const luna_act *da, const luna_act *h,
                                                    int64_t rows, int cols, float p,
                                                    luna_rng_key key);
luna_status luna_cuda_op_attention_forward(luna_backend *be, luna_act *o, luna_act *a,
                                           luna_act *a_d, const luna_act *q, const luna_act *k,
                                           const luna_act *v, const luna_attention_shape *s,
                                           float p, luna_rng_key key);
luna_status luna_cuda_op_attention_backward(luna_backend *be, luna_act *dq, luna_act *dk,
                                            luna_act *dv, luna_act *ds, const luna_act *d_o,
                                            const luna_act *q, const luna_act *k, const luna_act *v,
                                            const luna_act *a, const luna_act *a_d,
                                            const luna_attention_shape *s, float p,
                                            luna_rng_key key);
luna_status luna_cuda_op_softmax_dropout_forward(luna_backend *be, luna_act *y, luna_act *yd,
                                                 const luna_act *x, int64_t rows, int cols,
                                                 const int32_t *valid_cols, int64_t rows_per_group,
                                                 int causal_period, float p, luna_rng_key key);
luna_status luna_cuda_op_softmax_dropout_backward(luna_backend *be, luna_act *dx,
                                                  const luna_act *dyd, const luna_act *y,
                                                  int64_t rows, int cols, float p,
                                                  luna_rng_key key);

#endif
