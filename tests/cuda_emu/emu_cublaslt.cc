// luna-cuda-emu: the cuBLASLt subset of a GEMM path, defined against NVIDIA's cublasLt.h.
//
// Supported: column-major layouts (CUBLASLT_ORDER_COL) of CUDA_R_32F or CUDA_R_16BF with batch
// count and strided batch offset, or pointer-array batches (CUBLASLT_MATRIX_LAYOUT_BATCH_MODE =
// CUBLASLT_BATCH_MODE_POINTER_ARRAY on all four layouts: A, B, C, D are then device arrays of
// batch-count device pointers, each matrix checked as a strided one is); A and B of one type, C and
// D of one type (fp32 A/B need fp32 D); compute CUBLAS_COMPUTE_32F (_PEDANTIC, _FAST_TF32,
// _FAST_16BF), scale type CUDA_R_32F, alpha/beta on host or device; TRANSA/TRANSB; epilogues
// DEFAULT, RELU, BIAS, RELU_BIAS (bias of length M, type D's or CUDA_R_32F, BIAS_BATCH_STRIDE).
// Anything else is CUBLAS_STATUS_NOT_SUPPORTED with a message, never silently ignored.
//
// Computed in double from the stored inputs (rounded to TF32 / bf16 first for the FAST_TF32 /
// FAST_16BF compute types, as the tensor cores do), then alpha·AB + beta·C (+ bias, ReLU) rounded
// to fp32 and stored as D's type (round to nearest even for bf16). C is not read when beta = 0.
// Naive O(MNK); fine for test shapes (a 512³ GEMM takes ~0.13 s of CPU).
//
// Checked like the real library, or stricter: attribute sizes; shapes (op(A) M×K, op(B) K×N,
// C and D M×N); ld ≥ rows; equal batch counts; D's batches must not overlap; every matrix and
// the bias inside one device allocation; pointers aligned to the element size and, with an
// algorithm from cublasLtMatmulAlgoGetHeuristic, to min(16, the preference's minimum alignment
// (default 256)) bytes; workspace size at least the algorithm's; C == D only with equal layouts.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "emu_internal.h"

using namespace luna_emu;

struct cublasLtContext {
    int unused;
};

namespace {

struct lt_desc {
    cublasComputeType_t compute;
    int32_t scale_type, pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
    int64_t bias_stride = 0;
    int32_t bias_type = -1; // D's type
};
struct lt_layout {
    uint32_t type;
    int32_t order = CUBLASLT_ORDER_COL;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch = 1;
    int64_t stride = 0;
    uint32_t batch_mode = CUBLASLT_BATCH_MODE_STRIDED;
};
struct lt_pref {
    uint64_t max_workspace = 0;
    uint32_t align[4] = {256, 256, 256, 256}; // A, B, C, D
};
const uint64_t k_algo_magic = 0x6c756e61656d75ull; // "lunaemu"
const size_t k_algo_workspace = 1 << 20;           // what the emulated algorithm asks for at most

std::set<const void *> g_objects;     // live handles and descriptors
bool g_refuse_pointer_arrays = false; // luna_emu_cublaslt_refuse_pointer_arrays

cublasStatus_t lt_error(cublasStatus_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
cublasStatus_t lt_error(cublasStatus_t st, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "luna-cuda-emu: cuBLASLt: %s\n", msg);
    set_message(msg);
    return st;
}

template <class T>
cublasStatus_t set_attr(T &field, const void *buf, size_t size, const char *what) {
    if (!buf || size != sizeof(T))
        return lt_error(CUBLAS_STATUS_INVALID_VALUE, "%s: %zu bytes given, the attribute has %zu",
                        what, size, sizeof(T));
    memcpy(&field, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

size_t elem_size(uint32_t type) { return type == CUDA_R_16BF ? 2 : 4; }

float load(const void *p, uint32_t type, int64_t i) {
    if (type == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    return static_cast<const float *>(p)[i];
}

float round_mantissa(float x, int bits) { // round to nearest even keeping `bits` mantissa bits
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    int drop = 23 - bits;
    u += ((1u << (drop - 1)) - 1) + ((u >> drop) & 1);
    u &= ~((1u << drop) - 1);
    memcpy(&x, &u, 4);
    return x;
}

// Elements of a layout's storage: the last element of the last batch + 1.
uint64_t extent(const lt_layout &l) {
    return (uint64_t)(l.batch - 1) * (uint64_t)(l.stride < 0 ? -l.stride : l.stride) +
           (l.cols - 1) * (uint64_t)l.ld + l.rows;
}

struct problem {
    uint64_t m, n, k;
};

cublasStatus_t validate_epilogue(const lt_desc *d, const lt_layout *const l[4]);

// Validates the descriptors' contents (shared by the heuristic, the matmul and its replays).
cublasStatus_t validate_problem(const lt_desc *d, const lt_layout *const l[4], problem *p) {
    static const char *const names[4] = {"A", "B", "C", "D"};
    for (int i = 0; i < 4; i++) {
        if (l[i]->order != CUBLASLT_ORDER_COL)
            return lt_error(CUBLAS_STATUS_NOT_SUPPORTED,
                            "layout %s: only CUBLASLT_ORDER_COL is emulated", names[i]);
        if (l[i]->type != CUDA_R_32F && l[i]->type != CUDA_R_16BF)
            return lt_error(CUBLAS_STATUS_NOT_SUPPORTED,
                            "layout %s: type %u (CUDA_R_32F, CUDA_R_16BF only)", names[i],
                            l[i]->type);
        if (l[i]->rows == 0 || l[i]->cols == 0 || l[i]->ld < (int64_t)l[i]->rows)
            return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                            "layout %s: %llu x %llu with ld %lld (ld must be >= rows)", names[i],
                            (unsigned long long)l[i]->rows, (unsigned long long)l[i]->cols,
                            (long long)l[i]->ld);
        if (l[i]->batch < 1 || l[i]->batch != l[0]->batch)
            return lt_error(CUBLAS_STATUS_INVALID_VALUE, "layout %s: batch count %d, A has %d",
                            names[i], l[i]->batch, l[0]->batch);
    }
    if (l[0]->type != l[1]->type || l[2]->type != l[3]->type ||
        (l[0]->type == CUDA_R_32F && l[3]->type != CUDA_R_32F))
        return lt_error(CUBLAS_STATUS_NOT_SUPPORTED,
                        "types A %u B %u C %u D %u (A = B, C = D, fp32 A needs fp32 D)", l[0]->type,
                        l[1]->type, l[2]->type, l[3]->type);
    if ((d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
         d->compute != CUBLAS_COMPUTE_32F_FAST_TF32 &&
         d->compute != CUBLAS_COMPUTE_32F_FAST_16BF) ||
        d->scale_type != CUDA_R_32F)
        return lt_error(CUBLAS_STATUS_NOT_SUPPORTED,
                        "compute type %d / scale type %d (32F variants, CUDA_R_32F)",
                        (int)d->compute, d->scale_type);
    if (d->transc != CUBLAS_OP_N || (d->transa != CUBLAS_OP_N && d->transa != CUBLAS_OP_T) ||
        (d->transb != CUBLAS_OP_N && d->transb != CUBLAS_OP_T))
        return lt_error(CUBLAS_STATUS_NOT_SUPPORTED, "transa %d transb %d transc %d (N or T; C: N)",
                        d->transa, d->transb, d->transc);
    const bool ta = d->transa == CUBLAS_OP_T, tb = d->transb == CUBLAS_OP_T;
    p->m = ta ? l[0]->cols : l[0]->rows;
    p->k = ta ? l[0]->rows : l[0]->cols;
    p->n = tb ? l[1]->rows : l[1]->cols;
    if ((tb ? l[1]->cols : l[1]->rows) != p->k || l[2]->rows != p->m || l[2]->cols != p->n ||
        l[3]->rows != p->m || l[3]->cols != p->n)
        return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                        "shapes: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu",
                        (unsigned long long)p->m, (unsigned long long)p->k,
                        (unsigned long long)(tb ? l[1]->cols : l[1]->rows),
                        (unsigned long long)p->n, (unsigned long long)l[2]->rows,
                        (unsigned long long)l[2]->cols, (unsigned long long)l[3]->rows,
                        (unsigned long long)l[3]->cols);
    for (int i = 1; i < 4; i++)
        if (l[i]->batch_mode != l[0]->batch_mode)
            return lt_error(CUBLAS_STATUS_NOT_SUPPORTED,
                            "layout %s: batch mode %u, A has %u (one mode for all four)", names[i],
                            l[i]->batch_mode, l[0]->batch_mode);
    if (l[0]->batch_mode == CUBLASLT_BATCH_MODE_POINTER_ARRAY)
        return validate_epilogue(d, l); // D's matrices are checked by the matmul
    // Batches of D are disjoint when stacked (stride ≥ one matrix's span) or interleaved within
    // each column (rows ≤ stride and the last batch's rows end within ld: heads side by side).
    const uint64_t dstride = (uint64_t)(l[3]->stride < 0 ? -l[3]->stride : l[3]->stride);
    const bool stacked = dstride >= (l[3]->cols - 1) * (uint64_t)l[3]->ld + l[3]->rows;
    const bool interleaved =
        dstride >= l[3]->rows &&
        (uint64_t)(l[3]->batch - 1) * dstride + l[3]->rows <= (uint64_t)l[3]->ld;
    if (l[3]->batch > 1 && !stacked && !interleaved)
        return lt_error(CUBLAS_STATUS_INVALID_VALUE, "D's batches overlap (stride %lld)",
                        (long long)l[3]->stride);
    return validate_epilogue(d, l);
}

// Validates the handle and the descriptors (live objects), then their contents.
cublasStatus_t validate(cublasLtHandle_t h, const lt_desc *d, const lt_layout *const l[4],
                        problem *p) {
    static const char *const names[4] = {"A", "B", "C", "D"};
    if (!g_objects.count(h) || !g_objects.count(d))
        return lt_error(CUBLAS_STATUS_NOT_INITIALIZED, "unknown handle or matmul descriptor");
    for (int i = 0; i < 4; i++)
        if (!g_objects.count(l[i]))
            return lt_error(CUBLAS_STATUS_INVALID_VALUE, "unknown layout %s", names[i]);
    return validate_problem(d, l, p);
}

cublasStatus_t validate_epilogue(const lt_desc *d, const lt_layout *const l[4]) {
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_RELU &&
        d->epilogue != CUBLASLT_EPILOGUE_BIAS && d->epilogue != CUBLASLT_EPILOGUE_RELU_BIAS)
        return lt_error(CUBLAS_STATUS_NOT_SUPPORTED, "epilogue %u (DEFAULT, RELU, BIAS, RELU_BIAS)",
                        d->epilogue);
    const int32_t bias_type = d->bias_type < 0 ? (int32_t)l[3]->type : d->bias_type;
    if ((d->epilogue & CUBLASLT_EPILOGUE_BIAS) && bias_type != CUDA_R_32F &&
        bias_type != (int32_t)l[3]->type)
        return lt_error(CUBLAS_STATUS_NOT_SUPPORTED, "bias type %d", bias_type);
    return CUBLAS_STATUS_SUCCESS;
}

bool aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

// A matmul as the library copies it at the call: descriptor and layouts by value, alpha and beta
// by value in host pointer mode; the memory the pointers name (device-side alpha and beta too) is
// read when it runs, at the call or at each replay of one recorded by a stream capture.
struct lt_call {
    lt_desc d;
    lt_layout l[4];
    float alpha, beta; // host pointer mode
    const void *alpha_p, *beta_p;
    const void *A, *B, *C;
    void *D;
    bool has_algo;
    cublasLtMatmulAlgo_t algo;
    void *workspace;
    size_t workspace_bytes;
};

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new cublasLtContext{0};
    g_objects.insert(*h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!g_objects.erase(h))
        return lt_error(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: unknown handle");
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }
const char *cublasLtGetStatusName(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
    }
}
const char *cublasLtGetStatusString(cublasStatus_t st) { return cublasLtGetStatusName(st); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *out, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    lt_desc *d = new lt_desc;
    d->compute = compute;
    d->scale_type = scale;
    g_objects.insert(d);
    *out = reinterpret_cast<cublasLtMatmulDesc_t>(d);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    lt_desc *d = reinterpret_cast<lt_desc *>(desc);
    if (!g_objects.erase(d))
        return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                        "cublasLtMatmulDescDestroy: unknown descriptor");
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t size) {
    lt_desc *d = reinterpret_cast<lt_desc *>(desc);
    if (!g_objects.count(d))
        return lt_error(CUBLAS_STATUS_INVALID_VALUE, "unknown matmul descriptor");
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set_attr(d->compute, buf, size, "COMPUTE_TYPE");
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set_attr(d->scale_type, buf, size, "SCALE_TYPE");
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        return set_attr(d->pointer_mode, buf, size, "POINTER_MODE");
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_attr(d->transa, buf, size, "TRANSA");
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_attr(d->transb, buf, size, "TRANSB");
    case CUBLASLT_MATMUL_DESC_TRANSC: return set_attr(d->transc, buf, size, "TRANSC");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_attr(d->epilogue, buf, size, "EPILOGUE");
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_attr(d->bias, buf, size, "BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
        return set_attr(d->bias_stride, buf, size, "BIAS_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        return set_attr(d->bias_type, buf, size, "BIAS_DATA_TYPE");
    default:
        return lt_error(CUBLAS_STATUS_NOT_SUPPORTED,
                        "matmul descriptor attribute %d is not emulated", (int)attr);
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *out, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    lt_layout *l = new lt_layout;
    l->type = type, l->rows = rows, l->cols = cols, l->ld = ld;
    g_objects.insert(l);
    *out = reinterpret_cast<cublasLtMatrixLayout_t>(l);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    lt_layout *l = reinterpret_cast<lt_layout *>(layout);
    if (!g_objects.erase(l))
        return lt_error(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutDestroy: unknown layout");
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
    lt_layout *l = reinterpret_cast<lt_layout *>(layout);
    if (!g_objects.count(l)) return lt_error(CUBLAS_STATUS_INVALID_VALUE, "unknown matrix layout");
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return set_attr(l->type, buf, size, "LAYOUT_TYPE");
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return set_attr(l->order, buf, size, "LAYOUT_ORDER");
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return set_attr(l->rows, buf, size, "LAYOUT_ROWS");
    case CUBLASLT_MATRIX_LAYOUT_COLS: return set_attr(l->cols, buf, size, "LAYOUT_COLS");
    case CUBLASLT_MATRIX_LAYOUT_LD: return set_attr(l->ld, buf, size, "LAYOUT_LD");
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set_attr(l->batch, buf, size, "BATCH_COUNT");
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        return set_attr(l->stride, buf, size, "STRIDED_BATCH_OFFSET");
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: {
        cublasStatus_t st = set_attr(l->batch_mode, buf, size, "BATCH_MODE");
        if (st == CUBLAS_STATUS_SUCCESS && l->batch_mode != CUBLASLT_BATCH_MODE_STRIDED &&
            l->batch_mode != CUBLASLT_BATCH_MODE_POINTER_ARRAY)
            return lt_error(CUBLAS_STATUS_NOT_SUPPORTED, "batch mode %u is not emulated",
                            l->batch_mode);
        return st;
    }
    default:
        return lt_error(CUBLAS_STATUS_NOT_SUPPORTED, "matrix layout attribute %d is not emulated",
                        (int)attr);
    }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *out) {
    lt_pref *p = new lt_pref;
    g_objects.insert(p);
    *out = reinterpret_cast<cublasLtMatmulPreference_t>(p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    lt_pref *p = reinterpret_cast<lt_pref *>(pref);
    if (!g_objects.erase(p))
        return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                        "cublasLtMatmulPreferenceDestroy: unknown preference");
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
    lt_pref *p = reinterpret_cast<lt_pref *>(pref);
    if (!g_objects.count(p))
        return lt_error(CUBLAS_STATUS_INVALID_VALUE, "unknown matmul preference");
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        return set_attr(p->max_workspace, buf, size, "MAX_WORKSPACE_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
        return set_attr(p->align[0], buf, size, "MIN_ALIGNMENT_A_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
        return set_attr(p->align[1], buf, size, "MIN_ALIGNMENT_B_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
        return set_attr(p->align[2], buf, size, "MIN_ALIGNMENT_C_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        return set_attr(p->align[3], buf, size, "MIN_ALIGNMENT_D_BYTES");
    default:
        return lt_error(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute %d is not emulated",
                        (int)attr);
    }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                              cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned) {
    const lt_layout *l[4] = {reinterpret_cast<lt_layout *>(A), reinterpret_cast<lt_layout *>(B),
                             reinterpret_cast<lt_layout *>(C), reinterpret_cast<lt_layout *>(D)};
    const lt_pref *p = reinterpret_cast<const lt_pref *>(pref);
    if (!g_objects.count(p) || requested < 1 || !results || !returned)
        return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                        "cublasLtMatmulAlgoGetHeuristic: bad preference or result array");
    *returned = 0;
    problem pr;
    cublasStatus_t st = validate(h, reinterpret_cast<lt_desc *>(desc), l, &pr);
    if (st) return st;
    if (g_refuse_pointer_arrays && l[0]->batch_mode == CUBLASLT_BATCH_MODE_POINTER_ARRAY)
        return CUBLAS_STATUS_SUCCESS; /* no algorithm (*returned = 0) */
    memset(&results[0], 0, sizeof results[0]);
    uint64_t *a = results[0].algo.data;
    a[0] = k_algo_magic;
    for (int i = 0; i < 4; i++)
        a[1 + i] = p->align[i] < 16 ? p->align[i] : 16;
    a[5] = p->max_workspace < k_algo_workspace ? p->max_workspace : k_algo_workspace;
    results[0].workspaceSize = a[5];
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// Checks a matmul's pointers and memory, then (`compute`) computes D.
static cublasStatus_t run_matmul(const lt_call &c, bool compute) {
    static const char *const names[4] = {"A", "B", "C", "D"};
    const lt_desc *d = &c.d;
    const lt_layout *l[4] = {&c.l[0], &c.l[1], &c.l[2], &c.l[3]};
    const cublasLtMatmulAlgo_t *algo = c.has_algo ? &c.algo : nullptr;
    const void *A = c.A, *B = c.B, *C = c.C, *D = c.D, *workspace = c.workspace;
    const size_t workspace_bytes = c.workspace_bytes;
    problem pr;
    cublasStatus_t st = validate_problem(d, l, &pr);
    if (st) return st;
    const bool dev_scalars = d->pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
    if (dev_scalars && (!device_range(c.alpha_p, 4) || !device_range(c.beta_p, 4)))
        return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                        "POINTER_MODE_DEVICE: alpha/beta are not device memory");
    const float al = dev_scalars ? *static_cast<const float *>(c.alpha_p) : c.alpha;
    const float be = dev_scalars ? *static_cast<const float *>(c.beta_p) : c.beta;
    const void *ptr[4] = {A, B, C, D};
    if (!C && be == 0.0f) ptr[2] = nullptr;
    if (C == D && (l[2]->ld != l[3]->ld || l[2]->stride != l[3]->stride))
        return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                        "in place (C == D) needs equal C and D layouts");
    const int64_t batch = l[0]->batch;
    const bool ptr_mode = l[0]->batch_mode == CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    std::vector<const char *> mat[4]; // each operand's matrices, batch by batch
    for (int i = 0; i < 4; i++) {
        if (i == 2 && !ptr[2]) continue;
        const size_t es = elem_size(l[i]->type);
        size_t need = algo ? (size_t)algo->data[1 + i] : es;
        if (need < es) need = es;
        if (ptr_mode) {
            if (!ptr[i] || !aligned(ptr[i], sizeof(void *)) ||
                !device_range(ptr[i], (size_t)batch * sizeof(void *)))
                return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                                "pointer array %s (%p, %lld pointers) is not device memory",
                                names[i], ptr[i], (long long)batch);
            // A recorded call's array is read at each replay, as on a GPU: by then a launch
            // recorded before it (the graph's own fill) may have written it, so it is checked then.
            if (!compute) continue;
            lt_layout one = *l[i];
            one.batch = 1;
            for (int64_t bi = 0; bi < batch; bi++) {
                const char *m = static_cast<const char *const *>(ptr[i])[bi];
                if (!m || !device_range(m, extent(one) * es))
                    return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                                    "matrix %s[%lld] (%p, %llu elements) is not inside one device "
                                    "allocation",
                                    names[i], (long long)bi, (const void *)m,
                                    (unsigned long long)extent(one));
                if (!aligned(m, need))
                    return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                                    "matrix %s[%lld] at %p is not %zu-byte aligned (the "
                                    "algorithm's requirement)",
                                    names[i], (long long)bi, (const void *)m, need);
                mat[i].push_back(m);
            }
            continue;
        }
        if (!ptr[i] || !device_range(ptr[i], extent(*l[i]) * es))
            return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                            "matrix %s (%p, %llu elements) is not inside one device allocation",
                            names[i], ptr[i], (unsigned long long)extent(*l[i]));
        if (!aligned(ptr[i], need))
            return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                            "matrix %s at %p is not %zu-byte aligned (the algorithm's requirement)",
                            names[i], ptr[i], need);
        for (int64_t bi = 0; bi < batch; bi++)
            mat[i].push_back(static_cast<const char *>(ptr[i]) + bi * l[i]->stride * (int64_t)es);
    }
    if (ptr_mode && compute) { // D's matrices must not share an element
        std::vector<const char *> at;
        const size_t es = elem_size(l[3]->type);
        for (int64_t bi = 0; bi < batch; bi++)
            for (uint64_t j = 0; j < l[3]->cols; j++)
                for (uint64_t r = 0; r < l[3]->rows; r++)
                    at.push_back(mat[3][bi] + (j * (uint64_t)l[3]->ld + r) * es);
        std::sort(at.begin(), at.end());
        if (std::adjacent_find(at.begin(), at.end()) != at.end())
            return lt_error(CUBLAS_STATUS_INVALID_VALUE, "D's matrices overlap");
    }
    if (algo && algo->data[0] != k_algo_magic)
        return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                        "algo does not come from cublasLtMatmulAlgoGetHeuristic");
    const size_t ws_need = algo ? (size_t)algo->data[5] : 0;
    if (workspace_bytes < ws_need || (workspace_bytes && !device_range(workspace, workspace_bytes)))
        return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                        "workspace %p of %zu bytes (the algorithm needs %zu of device memory)",
                        workspace, workspace_bytes, ws_need);
    const uint32_t btype = d->bias_type < 0 ? l[3]->type : (uint32_t)d->bias_type;
    if (d->epilogue & CUBLASLT_EPILOGUE_BIAS) {
        uint64_t n = (uint64_t)(batch - 1) *
                         (uint64_t)(d->bias_stride < 0 ? -d->bias_stride : d->bias_stride) +
                     pr.m;
        if (!d->bias || !device_range(d->bias, n * elem_size(btype)) ||
            !aligned(d->bias, elem_size(btype)))
            return lt_error(CUBLAS_STATUS_INVALID_VALUE,
                            "bias %p (%llu elements) is not inside one device allocation", d->bias,
                            (unsigned long long)n);
    }
    if (!compute) return CUBLAS_STATUS_SUCCESS;
    const bool ta = d->transa == CUBLAS_OP_T, tb = d->transb == CUBLAS_OP_T;
    const int round_bits = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32   ? 10
                           : d->compute == CUBLAS_COMPUTE_32F_FAST_16BF ? 7
                                                                        : 23;
    const uint64_t M = pr.m, N = pr.n, K = pr.k;
    std::vector<double> a(M * K), b(K * N); // op(A) row-major, op(B) column-major
    std::vector<float> out(M * N);
    for (int64_t bi = 0; bi < batch; bi++) {
        const void *Ab = mat[0][bi], *Bb = mat[1][bi];
        const void *Cb = ptr[2] ? mat[2][bi] : nullptr;
        void *Db = const_cast<char *>(mat[3][bi]);
        for (uint64_t i = 0; i < M; i++)
            for (uint64_t k = 0; k < K; k++) {
                float v = load(Ab, l[0]->type, (int64_t)(ta ? k + i * l[0]->ld : i + k * l[0]->ld));
                a[i * K + k] = round_bits < 23 ? round_mantissa(v, round_bits) : v;
            }
        for (uint64_t j = 0; j < N; j++)
            for (uint64_t k = 0; k < K; k++) {
                float v = load(Bb, l[1]->type, (int64_t)(tb ? j + k * l[1]->ld : k + j * l[1]->ld));
                b[j * K + k] = round_bits < 23 ? round_mantissa(v, round_bits) : v;
            }
        for (uint64_t j = 0; j < N; j++)
            for (uint64_t i = 0; i < M; i++) {
                double acc = 0.0;
                for (uint64_t k = 0; k < K; k++)
                    acc += a[i * K + k] * b[j * K + k];
                double v = al * acc;
                if (be != 0.0f) v += be * (double)load(Cb, l[2]->type, (int64_t)(i + j * l[2]->ld));
                if (d->epilogue & CUBLASLT_EPILOGUE_BIAS)
                    v += load(d->bias, btype, bi * d->bias_stride + (int64_t)i);
                if ((d->epilogue & CUBLASLT_EPILOGUE_RELU) && !(v > 0.0)) v = 0.0;
                out[j * M + i] = (float)v;
            }
        for (uint64_t j = 0; j < N; j++) // stored after every read of C (C may be D)
            for (uint64_t i = 0; i < M; i++) {
                int64_t at = (int64_t)(i + j * l[3]->ld);
                if (l[3]->type == CUDA_R_16BF)
                    static_cast<__nv_bfloat16 *>(Db)[at] = __float2bfloat16_rn(out[j * M + i]);
                else
                    static_cast<float *>(Db)[at] = out[j * M + i];
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cudaError_t replay_matmul(void *ctx, cudaStream_t) {
    if (sticky_error() != cudaSuccess) return sticky_error();
    if (run_matmul(*static_cast<const lt_call *>(ctx), true) == CUBLAS_STATUS_SUCCESS)
        return cudaSuccess;
    const std::string why = luna_emu_last_error();
    return api_error(cudaErrorIllegalAddress, true,
                     "cudaGraphLaunch: the recorded cublasLtMatmul cannot run: %s", why.c_str());
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    const lt_desc *d = reinterpret_cast<const lt_desc *>(desc);
    const lt_layout *l[4] = {
        reinterpret_cast<lt_layout *>(Adesc), reinterpret_cast<lt_layout *>(Bdesc),
        reinterpret_cast<lt_layout *>(Cdesc), reinterpret_cast<lt_layout *>(Ddesc)};
    problem pr;
    cublasStatus_t st = validate(h, d, l, &pr);
    if (st) return st;
    if (sticky_error() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (!stream_valid(stream))
        return lt_error(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: unknown stream");
    if (!alpha || !beta)
        return lt_error(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: alpha or beta is NULL");
    bool record = false;
    if (capture_enqueue("cublasLtMatmul", stream, &record)) return CUBLAS_STATUS_EXECUTION_FAILED;
    lt_call c{};
    c.d = *d;
    for (int i = 0; i < 4; i++)
        c.l[i] = *l[i];
    c.alpha_p = alpha, c.beta_p = beta, c.A = A, c.B = B, c.C = C, c.D = D;
    c.has_algo = algo != nullptr, c.workspace = workspace, c.workspace_bytes = workspace_bytes;
    if (algo) c.algo = *algo;
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE) // host scalars: read at the call
        c.alpha = *static_cast<const float *>(alpha), c.beta = *static_cast<const float *>(beta);
    st = run_matmul(c, !record); // checks everything; computes unless recorded
    if (st != CUBLAS_STATUS_SUCCESS) {
        capture_failed(stream, cudaErrorInvalidValue);
        return st;
    }
    if (record)
        capture_record(stream, make_graph_op("cublasLtMatmul", new lt_call(c), replay_matmul,
                                             [](void *p) { delete static_cast<lt_call *>(p); }));
    return CUBLAS_STATUS_SUCCESS;
}

void luna_emu_cublaslt_refuse_pointer_arrays(bool refuse) { g_refuse_pointer_arrays = refuse; }

} // extern "C"
