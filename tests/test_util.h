/* Shared helpers for the Check suites in tests/.
 *
 * Each tests/test_<name>.c is one executable registered with CTest (label "cpu"); it builds a
 * Suite and calls luna_test_run(), which runs it and returns the exit status CTest expects.
 */
#ifndef LUNA_TEST_UTIL_H
#define LUNA_TEST_UTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "model/kernels/cpu/backend_cpu.h"

/* Run a suite (CK_NORMAL output), return EXIT_SUCCESS iff no test failed. */
int luna_test_run(Suite *suite);

/* Deterministic test data (xorshift-based, independent of the library's RNG under test). */
typedef struct {
    uint64_t state;
} luna_test_rng;
void luna_test_rng_seed(luna_test_rng *rng, uint64_t seed);
float luna_test_uniform(luna_test_rng *rng, float lo, float hi);
void luna_test_fill_uniform(luna_test_rng *rng, float *x, size_t n, float lo, float hi);

/* A fresh temporary directory (mkdtemp under $TMPDIR or /tmp); caller frees the string and
 * removes the directory with luna_test_remove_tree(). */
char *luna_test_make_temp_dir(void);
void luna_test_remove_tree(const char *path);

/* Write `text` to `path` (creating/truncating it); ck_assert on failure. */
void luna_test_write_file(const char *path, const char *text);

/* Largest |a-b| / max(|b|, floor) over n elements (relative error with a floor for tiny values). */
double luna_test_max_rel_error(const float *a, const float *b, size_t n, double floor);

/* ---- Finite-difference gradient checking -----------------------------------------------------
 * `loss(ctx)` runs the op's forward on the current inputs and returns a scalar in double, usually
 * L = Σ_i w_i · out_i with fixed random weights w (so dL/dout = w is what the backward gets).
 * luna_test_gradcheck perturbs each x[i] by ±eps·max(1, |x[i]|), forms the central difference,
 * and compares it with analytic[i]:  |fd − an| ≤ atol + rtol·|an|,  atol = abs_floor·max|an|.
 * On failure it reports (via ck_assert_msg) the first bad index. Returns the worst error
 * |fd − an| / (|an| + abs_floor·max|an|) seen, for the test's log.  x is restored. */
typedef double (*luna_test_loss_fn)(void *ctx);
double luna_test_gradcheck(const char *what, luna_test_loss_fn loss, void *ctx, float *x, size_t n,
                           const float *analytic, double eps, double rtol, double abs_floor);

/* Σ w_i · out_i in double. */
double luna_test_weighted_sum(const float *out, const float *w, size_t n);

/* ---- Small conveniences shared by the op suites -----------------------------------------------
 */
struct luna_backend;
/* A CPU backend with `threads` threads (ck_assert on failure); free with luna_backend_free_all. */
struct luna_backend *luna_test_backend(int threads);
/* malloc'd vectors (at least one element, so n = 0 is fine): uniform in [lo, hi), or zeros. */
float *luna_test_random_vector(luna_test_rng *rng, size_t n, float lo, float hi);
/* One right-padded sentence pair of a test batch (vocabulary V; pad 1, </s> 2, words from 4):
 * src[0..M) of length src_len ending with </s>, tgt[0..N) of length tgt_len ending with </s>,
 * prev = tgt shifted right behind </s>. Draws M source then N target words from rng, whatever
 * the lengths (so a batch's words do not depend on its lengths). */
void luna_test_sentence_pair(luna_test_rng *rng, int V, int32_t *src, int M, int src_len,
                             int32_t *prev, int32_t *tgt, int N, int tgt_len);
float *luna_test_zeros(size_t n);
/* ck_assert with a printf-style message, evaluated only on failure (cheap in tight loops). */
/* A call that must succeed (a backend memory call, an op): fails the test with its message. */
#define LUNA_CHECK_OK(expr)                                                                        \
    do {                                                                                           \
        luna_status check_ok_status_ = (expr);                                                     \
        ck_assert_msg(check_ok_status_ == LUNA_OK, "%s: %s", #expr, luna_error_message());         \
    } while (0)

#define LUNA_EXPECT(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

/* ---- Running the programs (end-to-end suites) -------------------------------------------------
 * The programs (luna-train, luna-translate, ...) are built next to the test executables. */

/* `path` = $env_var when that is set and not empty, else <directory of this executable>/name.
 * Prints a message and exits when /proc/self/exe cannot be read (call it from main or setup). */
void luna_test_find_program(char *path, size_t size, const char *name, const char *env_var);

typedef struct {
    const char *dir;         /* working directory of the program (NULL: the test's) */
    const char *input;       /* file read as stdin, relative to `dir` (NULL: /dev/null) */
    const char *stdout_path; /* where stdout/stderr go (NULL: an anonymous temporary file) */
    const char *stderr_path;
    long max_file_size; /* > 0: RLIMIT_FSIZE, writes beyond fail with EFBIG (a full disk) */
} luna_test_exec_options;

typedef struct {
    int status;                 /* exit status; 128 + N when killed by signal N */
    char out[65536], err[8192]; /* stdout and stderr, NUL-terminated (cut to fit) */
} luna_test_result;

typedef struct {
    pid_t pid;
    int out_fd, err_fd;
    char program[4096];
} luna_test_process;

/* Start `program` with the NULL-terminated `args` (argv[1..]); `o` may be NULL. */
void luna_test_start(luna_test_process *p, const char *program, const char *const *args,
                     const luna_test_exec_options *o);
/* Wait for it and collect its exit status and output; ck_assert that it could be run. */
luna_test_result luna_test_finish(luna_test_process *p);
/* luna_test_start + luna_test_finish. */
luna_test_result luna_test_exec(const char *program, const char *const *args,
                                const luna_test_exec_options *o);

#endif
