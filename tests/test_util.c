#define _XOPEN_SOURCE 700
#include "tests/test_util.h"

#include "model/backend.h"

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int luna_test_run(Suite *suite) {
    SRunner *runner = srunner_create(suite);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

void luna_test_rng_seed(luna_test_rng *rng, uint64_t seed) {
    rng->state = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    if (rng->state == 0) rng->state = 1;
}

static uint64_t xorshift64(luna_test_rng *rng) {
    uint64_t x = rng->state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng->state = x;
    return x;
}

float luna_test_uniform(luna_test_rng *rng, float lo, float hi) {
    double u = (double)(xorshift64(rng) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

void luna_test_fill_uniform(luna_test_rng *rng, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++)
        x[i] = luna_test_uniform(rng, lo, hi);
}

char *luna_test_make_temp_dir(void) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    size_t len = strlen(base) + 32;
    char *path = malloc(len);
    ck_assert_ptr_nonnull(path);
    snprintf(path, len, "%s/luna-test-XXXXXX", base);
    ck_assert_msg(mkdtemp(path) != NULL, "mkdtemp failed for %s", path);
    return path;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void luna_test_remove_tree(const char *path) {
    if (path) nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void luna_test_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    size_t n = strlen(text);
    ck_assert_uint_eq(fwrite(text, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

double luna_test_max_rel_error(const float *a, const float *b, size_t n, double floor) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double denom = fmax(fabs((double)b[i]), floor);
        double err = fabs((double)a[i] - (double)b[i]) / denom;
        if (isnan(err)) return INFINITY;
        if (err > worst) worst = err;
    }
    return worst;
}

double luna_test_weighted_sum(const float *out, const float *w, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)out[i] * (double)w[i];
    return s;
}

double luna_test_gradcheck(const char *what, luna_test_loss_fn loss, void *ctx, float *x, size_t n,
                           const float *analytic, double eps, double rtol, double abs_floor) {
    double max_an = 0.0;
    for (size_t i = 0; i < n; i++)
        max_an = fmax(max_an, fabs((double)analytic[i]));
    double atol = abs_floor * fmax(max_an, 1e-30);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        float saved = x[i];
        float h = (float)(eps * fmax(1.0, fabs((double)saved)));
        x[i] = saved + h;
        double up = loss(ctx);
        x[i] = saved - h;
        double down = loss(ctx);
        x[i] = saved;
        /* The actual perturbation is what fp32 could represent. */
        double step = (double)(saved + h) - (double)(saved - h);
        double fd = (up - down) / step;
        double an = (double)analytic[i];
        double err = fabs(fd - an);
        double rel = err / (fabs(an) + atol);
        if (rel > worst) worst = rel;
        ck_assert_msg(err <= atol + rtol * fabs(an),
                      "%s: gradient mismatch at index %zu: finite difference %.8g, analytic %.8g "
                      "(|diff| %.3g > %.3g)",
                      what, i, fd, an, err, atol + rtol * fabs(an));
    }
    return worst;
}

luna_backend *luna_test_backend(int threads) {
    luna_backend *be = NULL;
    ck_assert_msg(luna_backend_cpu_create(&be, threads) == LUNA_OK, "%s", luna_error_message());
    return be;
}

float *luna_test_random_vector(luna_test_rng *rng, size_t n, float lo, float hi) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    ck_assert_ptr_nonnull(v);
    luna_test_fill_uniform(rng, v, n, lo, hi);
    return v;
}

float *luna_test_zeros(size_t n) {
    float *v = calloc(n ? n : 1, sizeof *v);
    ck_assert_ptr_nonnull(v);
    return v;
}
