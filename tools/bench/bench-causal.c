/* bench-causal: times the causal normalised contraction (forward + backward) on the CPU backend
 * for the Luna decoder shapes: B = 32 sentences × H = 8 heads (G = 256 groups), n = 64 target
 * tokens, d_h = 64, l = 32, in both orientations of spec §3:
 *   S: (x, a, b) = (Q, K, Φ)  p = d_h, q = l
 *   O: (x, a, b) = (A, Φ, V)  p = l,   q = d_h
 * on 1 and 2 threads (or the counts given as arguments).
 *
 * Flop count (per position and group): 2·p·q for each state update and each vector–matrix
 * product of the documented algorithm: forward = 1 update + 1 product = 4pq; backward = 2 updates
 * (S_t, R_s) + 3 products (dx, da, db) = 10pq. (The kernel keeps R_s in both layouts and so
 * executes 12pq in backward; the figure reported uses 10pq.)
 *
 * usage: bench-causal [threads...]       a benchmark, not a test: it prints, it does not check.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/backend.h"
#include "core/rng.h"
#include "model/kernels/cpu/backend_cpu.h"
#include "tools/programs/program_start.h"

enum { B = 32, H = 8, N = 64, DH = 64, L = 32, REPEATS = 30 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *random_buffer(size_t count, uint32_t stream) {
    float *v = malloc(count * sizeof *v);
    if (!v) {
        fprintf(stderr, "bench-causal: out of memory\n");
        exit(1);
    }
    luna_rng_key key = {.seed = 1, .step = 0, .stream_id = stream};
    for (size_t i = 0; i < count; i++)
        v[i] = 2.0f * luna_rng_uniform(key, i) - 1.0f;
    return v;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median (returned) and best (*best) of REPEATS timings of forward (which = 0) or backward (1). */
static double time_op(luna_backend *be, int which, int G, int p, int q, float *bufs[8],
                      double *best) {
    double t[REPEATS];
    for (int r = -3; r < REPEATS; r++) { /* 3 warm-up runs */
        double start = now();
        luna_status st =
            which == 0 ? be->ops->causal_contraction_forward(be, bufs[0], bufs[1], bufs[2], bufs[3],
                                                             G, N, p, q, 1.0f, NULL)
                       : be->ops->causal_contraction_backward(be, bufs[4], bufs[5], bufs[6],
                                                              bufs[7], bufs[1], bufs[2], bufs[3], G,
                                                              N, p, q, 1.0f, NULL);
        double elapsed = now() - start;
        if (st != LUNA_OK) {
            fprintf(stderr, "bench-causal: %s\n", luna_error_message());
            exit(1);
        }
        if (r >= 0) t[r] = elapsed;
    }
    qsort(t, REPEATS, sizeof t[0], cmp_double);
    *best = t[0];
    return t[REPEATS / 2];
}

int main(int argc, char **argv) {
    luna_program_start("bench-causal", argv);
    int thread_counts[8] = {1, 2}, nthreads = 2;
    if (argc > 1) {
        nthreads = 0;
        for (int i = 1; i < argc && nthreads < 8; i++)
            thread_counts[nthreads++] = atoi(argv[i]);
    }
    const int G = B * H;
    const int shapes[2][2] = {{DH, L}, {L, DH}};
    const char *names[2] = {"S (Q,K,Phi)  p=d_h q=l", "O (A,Phi,V)  p=l q=d_h"};
    printf("causal_contraction, G = %d (B=%d x H=%d), n = %d; ms: median of %d runs, GFLOP/s: "
           "best run\n",
           G, B, H, N, REPEATS);
    printf("%-24s %7s %8s %8s %8s %8s %9s\n", "shape", "threads", "fwd ms", "fwd GF/s", "bwd ms",
           "bwd GF/s", "f+b GF/s");
    for (int s = 0; s < 2; s++) {
        int p = shapes[s][0], q = shapes[s][1];
        size_t np = (size_t)G * N * p, nq = (size_t)G * N * q;
        /* out, x, a, b, dx, da, db, dout */
        float *bufs[8] = {random_buffer(nq, 1), random_buffer(np, 2), random_buffer(np, 3),
                          random_buffer(nq, 4), random_buffer(np, 5), random_buffer(np, 6),
                          random_buffer(nq, 7), random_buffer(nq, 8)};
        double positions = (double)G * N;
        double fwd_flops = positions * 4.0 * p * q, bwd_flops = positions * 10.0 * p * q;
        for (int k = 0; k < nthreads; k++) {
            luna_backend *be;
            if (luna_backend_cpu_create(&be, thread_counts[k]) != LUNA_OK) {
                fprintf(stderr, "bench-causal: %s\n", luna_error_message());
                return 1;
            }
            double bf, bb;
            double tf = time_op(be, 0, G, p, q, bufs, &bf), tb = time_op(be, 1, G, p, q, bufs, &bb);
            printf("%-24s %7d %8.3f %8.2f %8.3f %8.2f %9.2f\n", names[s], be->num_threads, 1e3 * tf,
                   1e-9 * fwd_flops / bf, 1e3 * tb, 1e-9 * bwd_flops / bb,
                   1e-9 * (fwd_flops + bwd_flops) / (bf + bb));
            luna_backend_free(be);
        }
        for (int i = 0; i < 8; i++)
            free(bufs[i]);
    }
    return 0;
}
