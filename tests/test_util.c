#define _XOPEN_SOURCE 700
#include "tests/test_util.h"

#include "core/backend.h"
#include "model/kernels/cpu/backend_cpu.h"

#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
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

void luna_test_sentence_pair(luna_test_rng *rng, int V, int32_t *src, int M, int src_len,
                             int32_t *prev, int32_t *tgt, int N, int tgt_len) {
    for (int i = 0; i < M; i++) {
        const int tok = 4 + (int)luna_test_uniform(rng, 0, V - 4 - 1e-3f);
        src[i] = i < src_len - 1 ? tok : i == src_len - 1 ? 2 : 1;
    }
    int32_t y_prev = 2; /* prev[i] = y[i - 1] */
    for (int i = 0; i < N; i++) {
        int y = 4 + (int)luna_test_uniform(rng, 0, V - 4 - 1e-3f);
        if (i == tgt_len - 1) y = 2;
        tgt[i] = i < tgt_len ? y : 1;
        prev[i] = i == 0 ? 2 : i < tgt_len ? y_prev : 1;
        y_prev = y;
    }
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

/* ---- Running the programs ----------------------------------------------------------------- */

void luna_test_find_program(char *path, size_t size, const char *name, const char *env_var) {
    const char *env = env_var ? getenv(env_var) : NULL;
    if (env && *env) {
        snprintf(path, size, "%s", env);
        return;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "cannot read /proc/self/exe to find %s\n", name);
        exit(EXIT_FAILURE);
    }
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(path, size, "%s/%s", self, name);
}

/* A file for the program's output: `path` (created or truncated), or an anonymous one. */
static int open_capture(const char *path) {
    int fd;
    if (path) {
        fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        ck_assert_msg(fd >= 0, "cannot create %s", path);
        return fd;
    }
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char name[4096];
    snprintf(name, sizeof name, "%s/luna-test-output-XXXXXX", base);
    fd = mkstemp(name);
    ck_assert_msg(fd >= 0, "mkstemp failed for %s", name);
    unlink(name);
    return fd;
}

void luna_test_start(luna_test_process *p, const char *program, const char *const *args,
                     const luna_test_exec_options *o) {
    static const luna_test_exec_options none = {0};
    if (!o) o = &none;
    snprintf(p->program, sizeof p->program, "%s", program);
    const char *argv[256] = {program};
    int argc = 1;
    for (; args[argc - 1]; argc++) {
        ck_assert_int_lt(argc, 255);
        argv[argc] = args[argc - 1];
    }
    argv[argc] = NULL;
    p->out_fd = open_capture(o->stdout_path);
    p->err_fd = open_capture(o->stderr_path);
    fflush(stdout);
    fflush(stderr);
    p->pid = fork();
    ck_assert_int_ge(p->pid, 0);
    if (p->pid == 0) {
        if (o->dir && chdir(o->dir) != 0) _exit(127);
        int in = open(o->input ? o->input : "/dev/null", O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0 || dup2(p->out_fd, 1) < 0 || dup2(p->err_fd, 2) < 0)
            _exit(127);
        if (o->max_file_size > 0) {
            struct rlimit rl = {(rlim_t)o->max_file_size, (rlim_t)o->max_file_size};
            signal(SIGXFSZ, SIG_IGN); /* writes past the limit fail with EFBIG instead */
            setrlimit(RLIMIT_FSIZE, &rl);
        }
        execv(program, (char *const *)argv);
        _exit(127);
    }
}

static void read_capture(int fd, char *buf, size_t cap) {
    size_t n = 0;
    ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
    for (ssize_t got; n + 1 < cap && (got = read(fd, buf + n, cap - 1 - n)) > 0;)
        n += (size_t)got;
    buf[n] = '\0';
    close(fd);
}

luna_test_result luna_test_finish(luna_test_process *p) {
    int ws;
    ck_assert_int_eq(waitpid(p->pid, &ws, 0), p->pid);
    luna_test_result r;
    r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    ck_assert_msg(r.status != 127, "cannot run %s (build it first)", p->program);
    read_capture(p->out_fd, r.out, sizeof r.out);
    read_capture(p->err_fd, r.err, sizeof r.err);
    return r;
}

luna_test_result luna_test_exec(const char *program, const char *const *args,
                                const luna_test_exec_options *o) {
    luna_test_process p;
    luna_test_start(&p, program, args, o);
    return luna_test_finish(&p);
}
