/* GEMM throughput through the backend op table (the path model code uses).
 *
 *   bench-gemm [--m 512] [--n 2048] [--k 512] [--threads 1,2] [--reps 30]
 *
 * Prints GFLOP/s (2·M·N·K per product) for each thread count and each transpose combination the
 * model uses (NN: activations × weightsᵀ is NT in row-major; TN: weight gradients), and the
 * OpenBLAS kernel family in use (openblas_get_corename; override with OPENBLAS_CORETYPE). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "tools/programs/program_start.h"

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void usage(void) {
    printf("usage: bench-gemm [--m M] [--n N] [--k K] [--threads LIST] [--reps R]\n"
           "  GEMM GFLOP/s through luna's CPU backend (default 512x2048x512, threads 1,2)\n");
}

int main(int argc, char **argv) {
    luna_program_start("bench-gemm", argv);
    int M = 512, N = 2048, K = 512, reps = 30;
    char threads_list[64] = "1,2";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench-gemm: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--m"))
            M = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--n"))
            N = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--k"))
            K = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads"))
            snprintf(threads_list, sizeof threads_list, "%s", argv[++i]);
        else {
            fprintf(stderr, "bench-gemm: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (M <= 0 || N <= 0 || K <= 0 || reps <= 0) {
        fprintf(stderr, "bench-gemm: sizes and reps must be positive\n");
        return 2;
    }
    luna_backend *be;
    if (luna_backend_cpu_create(&be, 1) != LUNA_OK) {
        fprintf(stderr, "bench-gemm: %s\n", luna_error_message());
        return 1;
    }
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)K * N);
    float *C = malloc(sizeof(float) * (size_t)M * N);
    for (size_t i = 0; i < (size_t)M * K; i++)
        A[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)K * N; i++)
        B[i] = (float)(i % 5) * 0.1f;
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf("gemm %dx%dx%d %s core=%s (OPENBLAS_CORETYPE=%s)\n", M, N, K, OPENBLAS_VERSION,
           openblas_get_corename(), coretype ? coretype : "unset");
    struct {
        const char *name;
        bool ta, tb;
    } forms[] = {{"NN", false, false}, {"NT", false, true}, {"TN", true, false}};
    char *save = NULL;
    for (char *tok = strtok_r(threads_list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int threads = atoi(tok);
        luna_backend_cpu_set_threads(be, threads);
        for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
            /* Stored shapes: A [M,K] or [K,M], B [K,N] or [N,K]. */
            int lda = forms[f].ta ? M : K, ldb = forms[f].tb ? K : N;
            luna_status st = be->ops->gemm(be, forms[f].ta, forms[f].tb, M, N, K, 1.0f, A, lda, 0,
                                           B, ldb, 0, 0.0f, C, N, 0, 1); /* warm-up */
            if (st != LUNA_OK) {
                fprintf(stderr, "bench-gemm: %s\n", luna_error_message());
                return 1;
            }
            double best = 1e30;
            for (int trial = 0; trial < 3; trial++) {
                double t0 = now_seconds();
                for (int r = 0; r < reps; r++)
                    be->ops->gemm(be, forms[f].ta, forms[f].tb, M, N, K, 1.0f, A, lda, 0, B, ldb, 0,
                                  0.0f, C, N, 0, 1);
                double t = (now_seconds() - t0) / reps;
                if (t < best) best = t;
            }
            printf("  threads=%d %s  %7.1f GFLOP/s  (%.3f ms)\n", threads, forms[f].name,
                   2.0 * M * N * K / best / 1e9, best * 1e3);
        }
    }
    free(A);
    free(B);
    free(C);
    luna_backend_free(be);
    return 0;
}
