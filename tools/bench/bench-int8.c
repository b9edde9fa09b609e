/* Held-weight Linear throughput on decoding shapes: the fp32 panels (AVX2 and AVX-512 kernels)
 * against the int8 kernels
 * (model/kernels/cpu/held_int8.h), and oneDNN's int8 matmul when the build found it
 * (LUNA_WITH_DNNL).
 *
 *   bench-int8 [--rows 4,128] [--threads 1] [--reps 200] [--d 256] [--ffn 1024] [--vocab 7792]
 *              [--cold MB] [--wall]
 *
 * For each row count and Linear shape of a decoder step (d→d, d→ffn, ffn→d, d→vocab) prints
 * CPU microseconds per call (process CPU time: the machines are shared; --wall: elapsed time, for
 * several threads on an idle machine, whose CPU time counts the waits; median of 5 rounds of
 * REPS calls, the variants interleaved round by round) and GOP/s (2·rows·in·out per call). The int8
 * times include the per-row quantization of x and the dequantizing epilogue; oneDNN's include
 * quantizing x (one scale per tensor, less work than per row) and its scaled f32 output with the
 * bias. --cold MB holds enough copies of each weight (at least MB megabytes of fp32 weights, at
 * least 1 copy) and cycles through them call by call, so that a call finds its weights out of the
 * core's caches as a decoding step does (its ~20-30 MB of weights go round between two uses of
 * one; oneDNN keeps its one copy); without it every call reuses the same, cache-warm weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/quantize.h"
#include "model/kernels/cpu/cpu_ops.h"
#include "model/kernels/cpu/held_int8.h"
#include "model/kernels/registry.h"
#include "tools/programs/program_start.h"

#ifdef LUNA_WITH_DNNL
#include <math.h>

#include <dnnl.h>
#endif

/* CPU time of the process: on a shared, oversubscribed machine it counts the cycles this
 * process ran, not the time others held the cores (with --threads 1 it is the call's time). */
static bool wall_clock; /* --wall: elapsed time instead (several threads on an idle machine) */
static double now_seconds(void) {
    struct timespec t;
    clock_gettime(wall_clock ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#ifdef LUNA_WITH_DNNL
/* y [rows, out] = dequant(u8(x) · s8(W)ᵀ) + b through a oneDNN matmul primitive created once. */
typedef struct {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst, bias, scales, zp;
    uint8_t *xq;
    int rows, in, out;
} dnnl_linear;

#define DN(call)                                                                                   \
    do {                                                                                           \
        dnnl_status_t s_ = (call);                                                                 \
        if (s_ != dnnl_success) {                                                                  \
            fprintf(stderr, "bench-int8: %s failed (%d)\n", #call, (int)s_);                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void dnnl_create(dnnl_linear *L, const float *W, const float *b, int rows, int in, int out) {
    memset(L, 0, sizeof *L);
    L->rows = rows, L->in = in, L->out = out;
    DN(dnnl_engine_create(&L->eng, dnnl_cpu, 0));
    DN(dnnl_stream_create(&L->stream, L->eng, dnnl_stream_default_flags));
    dnnl_memory_desc_t sd, wd, dd, bd;
    DN(dnnl_memory_desc_init_by_tag(&sd, 2, (dnnl_dims_t){rows, in}, dnnl_u8, dnnl_ab));
    DN(dnnl_memory_desc_init_by_tag(&wd, 2, (dnnl_dims_t){in, out}, dnnl_s8, dnnl_format_tag_any));
    DN(dnnl_memory_desc_init_by_tag(&dd, 2, (dnnl_dims_t){rows, out}, dnnl_f32, dnnl_ab));
    DN(dnnl_memory_desc_init_by_tag(&bd, 2, (dnnl_dims_t){1, out}, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &sd, &wd, &bd, &dd));
    dnnl_primitive_attr_t attr;
    DN(dnnl_primitive_attr_create(&attr));
    /* runtime, per column */
    DN(dnnl_primitive_attr_set_output_scales(attr, 1, 1 << 1,
                                             (const float[]){DNNL_RUNTIME_F32_VAL}));
    DN(dnnl_primitive_attr_set_zero_points(attr, DNNL_ARG_SRC, 1, 0,
                                           (const int32_t[]){DNNL_RUNTIME_S32_VAL}));
    dnnl_primitive_desc_t pd;
    DN(dnnl_primitive_desc_create(&pd, &md, attr, L->eng, NULL));
    const dnnl_memory_desc_t *wq = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    DN(dnnl_primitive_create(&L->prim, pd));
    /* the weights, quantized per output channel and reordered once into oneDNN's layout */
    int8_t *q = malloc((size_t)out * in);
    float *sw = malloc(sizeof(float) * out);
    luna_quantize_rows_int8(W, out, in, q, sw);
    dnnl_memory_desc_t plain;
    DN(dnnl_memory_desc_init_by_tag(&plain, 2, (dnnl_dims_t){in, out}, dnnl_s8, dnnl_ba));
    dnnl_memory_t wplain;
    DN(dnnl_memory_create(&wplain, &plain, L->eng, q));
    DN(dnnl_memory_create(&L->wei, wq, L->eng, DNNL_MEMORY_ALLOCATE));
    dnnl_primitive_desc_t rpd;
    DN(dnnl_reorder_primitive_desc_create(&rpd, &plain, L->eng, wq, L->eng, NULL));
    dnnl_primitive_t reorder;
    DN(dnnl_primitive_create(&reorder, rpd));
    dnnl_exec_arg_t rargs[] = {{DNNL_ARG_FROM, wplain}, {DNNL_ARG_TO, L->wei}};
    DN(dnnl_primitive_execute(reorder, L->stream, 2, rargs));
    DN(dnnl_stream_wait(L->stream));
    L->xq = malloc((size_t)rows * in);
    DN(dnnl_memory_create(&L->src, &sd, L->eng, L->xq));
    DN(dnnl_memory_create(&L->dst, &dd, L->eng, DNNL_MEMORY_ALLOCATE));
    DN(dnnl_memory_create(&L->bias, &bd, L->eng, (void *)b));
    dnnl_memory_desc_t scd, zpd;
    DN(dnnl_memory_desc_init_by_tag(&scd, 1, (dnnl_dims_t){out}, dnnl_f32, dnnl_a));
    DN(dnnl_memory_desc_init_by_tag(&zpd, 1, (dnnl_dims_t){1}, dnnl_s32, dnnl_a));
    DN(dnnl_memory_create(&L->scales, &scd, L->eng, DNNL_MEMORY_ALLOCATE));
    DN(dnnl_memory_create(&L->zp, &zpd, L->eng, DNNL_MEMORY_ALLOCATE));
    void *h;
    DN(dnnl_memory_get_data_handle(L->scales, &h));
    memcpy(h, sw, sizeof(float) * out); /* × the activation scale at run time */
    DN(dnnl_memory_get_data_handle(L->zp, &h));
    *(int32_t *)h = 128;
    dnnl_primitive_destroy(reorder);
    dnnl_primitive_desc_destroy(rpd);
    dnnl_memory_destroy(wplain);
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    free(q);
    free(sw);
}

static void dnnl_run(dnnl_linear *L, const float *x, float *sw_times_sx, const float *sw) {
    float amax = 0.0f;
    const size_t n = (size_t)L->rows * L->in;
    for (size_t i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    const float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
    for (size_t i = 0; i < n; i++)
        L->xq[i] = (uint8_t)(int)(nearbyintf(x[i] * inv) + 128.0f);
    void *h;
    DN(dnnl_memory_get_data_handle(L->scales, &h));
    for (int j = 0; j < L->out; j++)
        sw_times_sx[j] = sw[j] * s;
    memcpy(h, sw_times_sx, sizeof(float) * L->out);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, L->src},
                              {DNNL_ARG_WEIGHTS, L->wei},
                              {DNNL_ARG_BIAS, L->bias},
                              {DNNL_ARG_DST, L->dst},
                              {DNNL_ARG_ATTR_OUTPUT_SCALES, L->scales},
                              {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, L->zp}};
    DN(dnnl_primitive_execute(L->prim, L->stream, 6, args));
    DN(dnnl_stream_wait(L->stream));
}
#endif

int main(int argc, char **argv) {
    luna_program_start("bench-int8", argv);
    int reps = 200, threads = 1, d = 256, ffn = 1024, vocab = 7792, cold_mb = 0;
    char rows_list[64] = "4,128";
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--wall")) {
            wall_clock = true;
            i--;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench-int8: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--rows"))
            snprintf(rows_list, sizeof rows_list, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--d"))
            d = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ffn"))
            ffn = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--vocab"))
            vocab = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cold"))
            cold_mb = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench-int8: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    luna_backend_options bo = luna_backend_options_default();
    bo.num_threads = threads;
    luna_backend *be;
    if (luna_backend_create(&be, "cpu", &bo) != LUNA_OK) {
        fprintf(stderr, "bench-int8: %s\n", luna_error_message());
        return 1;
    }
    const int shapes[][2] = {{d, d}, {d, ffn}, {ffn, d}, {d, vocab}};
    enum { NV = 5 };
    const char *names[NV] = {"fp32 avx2", "fp32 avx512", "int8 avx2", "int8 avx512-vnni",
                             "oneDNN int8"};
    /* fp32 variants: -1 - the fp32 kernel; int8: the int8 kernel; -9: oneDNN */
    const int kernels[NV] = {-1 - LUNA_F32_AVX2, -1 - LUNA_F32_AVX512, LUNA_INT8_AVX2,
                             LUNA_INT8_AVX512_VNNI, -9};
    printf("| rows | in → out | variant | µs / call | GOP/s |\n|---|---|---|---|---|\n");
    for (char *tok = strtok(rows_list, ","); tok; tok = strtok(NULL, ",")) {
        const int rows = atoi(tok);
        for (int s = 0; s < 4; s++) {
            const int in = shapes[s][0], out = shapes[s][1];
            float *x = malloc(sizeof(float) * (size_t)rows * in);
            const size_t wbytes = sizeof(float) * (size_t)out * in;
            const int copies = (int)(((size_t)cold_mb << 20) / wbytes) + 1;
            float **Wc = malloc(sizeof(float *) * (size_t)copies);
            float **W8c = malloc(sizeof(float *) * (size_t)copies);
            float *W = malloc(wbytes), *b = calloc(out, sizeof(float));
            float *y = malloc(sizeof(float) * (size_t)rows * out),
                  *tmp = malloc(sizeof(float) * out);
            float *W8 = malloc(sizeof(float) * (size_t)out * in);
            for (size_t i = 0; i < (size_t)rows * in; i++)
                x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
            for (size_t i = 0; i < (size_t)out * in; i++)
                W[i] = W8[i] = (float)((i * 40503u) % 2001) / 20000.0f - 0.05f;
            int8_t *q = malloc((size_t)out * in);
            float *sw = malloc(sizeof(float) * out);
            luna_quantize_rows_int8(W, out, in, q, sw);
            bool have[NV] = {luna_cpu_set_f32_kernel(be, LUNA_F32_AVX2) == LUNA_OK,
                             luna_cpu_set_f32_kernel(be, LUNA_F32_AVX512) == LUNA_OK,
                             luna_int8_kernel_available(LUNA_INT8_AVX2),
                             luna_int8_kernel_available(LUNA_INT8_AVX512_VNNI), false};
            luna_error_clear();
#ifdef LUNA_WITH_DNNL
            dnnl_linear L;
            dnnl_create(&L, W, b, rows, in, out);
            have[4] = true;
#endif
            for (int c = 0; c < copies; c++) { /* copy 0 is W itself */
                Wc[c] = c ? malloc(wbytes) : W;
                W8c[c] = c ? malloc(wbytes) : W8;
                if (!Wc[c] || !W8c[c]) {
                    fprintf(stderr, "bench-int8: out of memory for %d copies\n", copies);
                    return 1;
                }
                if (c) memcpy(Wc[c], W, wbytes), memcpy(W8c[c], W8, wbytes);
                if (be->ops->hold_weights(be, Wc[c], out, in, LUNA_F32) != LUNA_OK ||
                    be->ops->hold_weights(be, W8c[c], out, in, LUNA_I8) != LUNA_OK) {
                    fprintf(stderr, "bench-int8: %s\n", luna_error_message());
                    return 1;
                }
            }
            double t[NV][5];
            for (int round = 0; round < 5; round++)
                for (int v = 0; v < NV; v++) {
                    if (!have[v]) continue;
                    if (kernels[v] >= 0) (void)luna_cpu_set_int8_kernel(be, kernels[v]);
                    if (kernels[v] < 0 && kernels[v] != -9)
                        (void)luna_cpu_set_f32_kernel(be, -1 - kernels[v]);
                    const double t0 = now_seconds();
                    for (int r = 0; r < reps; r++) {
                        if (kernels[v] == -9) {
#ifdef LUNA_WITH_DNNL
                            dnnl_run(&L, x, tmp, sw);
#endif
                        } else if (be->ops->linear_forward(be, y, x,
                                                           v < 2 ? Wc[r % copies] : W8c[r % copies],
                                                           b, rows, in, out) != LUNA_OK) {
                            fprintf(stderr, "bench-int8: %s\n", luna_error_message());
                            return 1;
                        }
                    }
                    t[v][round] = (now_seconds() - t0) / reps;
                }
            for (int v = 0; v < NV; v++) {
                if (!have[v]) continue;
                qsort(t[v], 5, sizeof(double), cmp_double);
                printf("| %d | %d → %d | %s | %.1f | %.1f |\n", rows, in, out, names[v],
                       t[v][2] * 1e6, 2.0 * rows * in * out / t[v][2] / 1e9);
            }
            for (int c = 0; c < copies; c++) {
                (void)be->ops->release_weights(be, Wc[c]);
                (void)be->ops->release_weights(be, W8c[c]);
                free(Wc[c]), free(W8c[c]);
            }
            free(Wc), free(W8c);
            free(x), free(b), free(y), free(tmp), free(q), free(sw);
        }
    }
    luna_backend_free(be);
    return 0;
}
