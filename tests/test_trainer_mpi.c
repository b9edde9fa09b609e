/* Multi-process data parallelism (MPI builds only, label mpi): `mpiexec -n 2 luna-train` with
 * --update-freq 1 sees, in every update, the batches one process sees with --update-freq 2 (rank r
 * takes batches r, r + 2, ... of the epoch's order; dropout masks are keyed by the batch's place in
 * the update, not by the rank), so both must end with the same parameters and optimizer state up
 * to the order of float summation. Also: a checkpoint of 2 ranks resumes in one process, only
 * rank 0 logs, and a failure on one rank stops all of them instead of leaving the others waiting.
 *
 * mpiexec is LUNA_MPIEXEC (CMake's MPIEXEC_EXECUTABLE) unless $LUNA_MPIEXEC names another;
 * CTest sets Open MPI's variables for running as root and with more ranks than cores. */
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/json.h"
#include "core/safetensors.h"
#include "tests/test_util.h"
#include "model/checkpoint.h"
#include "trainer/synthetic.h"

#ifndef LUNA_MPIEXEC
#define LUNA_MPIEXEC "mpiexec"
#endif
#ifndef LUNA_MPIEXEC_NUMPROC_FLAG
#define LUNA_MPIEXEC_NUMPROC_FLAG "-n"
#endif

/* Float summation order differs (each rank sums its own micro-batches, then the ranks are summed):
 * parameters agree to ~1e-6 after 24 updates. Adam's and Apollo's moments of gradients that are
 * nearly zero amplify that rounding, hence the looser bound for the optimizer state. A wrong
 * reduction or wrong dropout masks give differences of 1e-2 and more. */
#define PARAM_TOLERANCE 1e-6
#define STATE_TOLERANCE 1e-4
/* Updates per run; on the CUDA harness (each kernel thread a fiber) fewer, and validation more
 * often so that the schedule comparison still sees several validations. */
static const char *UPDATES = "24", *HALF_UPDATES = "12", *FOUR_RANK_UPDATES = "20";
static const char *BUCKET_UPDATES = "12", *VALIDATE_INTERVAL = "10";

static char program[4096];
/* LUNA_TEST_DEVICE=cuda: every run on --device cuda (fp32), NCCL between the ranks (in a
 * -DLUNA_CUDA_EMU=ON -DLUNA_MPI=ON build: the CUDA backend on the CPU harness, the fake NCCL) */
static bool on_cuda;
static const char *communicator = "mpi";
static const char *mpiexec;
static char *tmp;
static char bin[1024];

static void setup(void) {
    luna_test_find_program(program, sizeof program, "luna-train", "LUNA_TRAIN");
    const char *device = getenv("LUNA_TEST_DEVICE");
    on_cuda = device && strcmp(device, "cuda") == 0;
    communicator = on_cuda ? "mpi+nccl" : "mpi";
    if (on_cuda) {
        UPDATES = "10";
        HALF_UPDATES = "5";
        FOUR_RANK_UPDATES = "8";
        BUCKET_UPDATES = "6";
        VALIDATE_INTERVAL = "4";
    }
    mpiexec =
        getenv("LUNA_MPIEXEC") && *getenv("LUNA_MPIEXEC") ? getenv("LUNA_MPIEXEC") : LUNA_MPIEXEC;
    tmp = luna_test_make_temp_dir();
    snprintf(bin, sizeof bin, "%s/bin", tmp);
    luna_synthetic_options so;
    luna_synthetic_options_init(&so);
    so.num_train = 500; /* 33 batches of --max-tokens 128: rank 1 repeats one per epoch */
    so.num_valid = 40;
    ck_assert_int_eq(luna_synthetic_data_bin(bin, &so), LUNA_OK);
}

static void teardown(void) {
    luna_test_remove_tree(tmp);
    free(tmp);
}

/* The arguments of a luna-train run with `ranks` MPI ranks (0: as a plain process, no mpiexec)
 * into `save_dir`, `extra` (NULL-terminated, may be NULL) appended; args[0] is the program. */
static int train_args(const char **args, int ranks, const char *optimizer,
                      const char *update_freq, const char *max_update, const char *save_dir,
                      const char *const *extra) {
    static char np[16]; /* args point into it */
    snprintf(np, sizeof np, "%d", ranks);
    int n = 0;
    if (ranks > 0) {
        args[n++] = LUNA_MPIEXEC_NUMPROC_FLAG;
        args[n++] = np;
        args[n++] = program;
    }
    const char *common[] = {bin,
                            "--arch",
                            "luna_tiny",
                            "--optimizer",
                            optimizer,
                            "--lr",
                            strcmp(optimizer, "apollo") == 0 ? "0.01" : "0.001",
                            "--warmup-updates",
                            "5",
                            "--clip-norm",
                            "0.1",
                            "--clip-mode",
                            "each",
                            "--label-smoothing",
                            "0.1",
                            "--dropout",
                            "0.1",
                            "--attention-dropout",
                            "0.1",
                            "--activation-dropout",
                            "0.1",
                            "--max-tokens",
                            "128",
                            "--update-freq",
                            update_freq,
                            "--max-update",
                            max_update,
                            "--validate-interval-updates",
                            VALIDATE_INTERVAL,
                            "--save-dir",
                            save_dir,
                            "--threads",
                            "1",
                            "--no-progress-bar",
                            "--seed",
                            "5",
                            "--log-interval",
                            "4",
                            NULL};
    for (const char *const *a = common; *a; a++)
        args[n++] = *a;
    for (const char *const *a = extra; a && *a; a++)
        args[n++] = *a;
    if (on_cuda) {
        const char *cuda[] = {"--device", "cuda", "--precision", "fp32", NULL};
        for (const char *const *a = cuda; *a; a++)
            args[n++] = *a;
    }
    args[n] = NULL;
    return n;
}

static luna_test_result train_with(int ranks, const char *optimizer, const char *update_freq,
                                   const char *max_update, const char *save_dir,
                                   const char *const *extra) {
    const char *args[80];
    train_args(args + 1, ranks, optimizer, update_freq, max_update, save_dir, extra);
    return luna_test_exec(ranks > 0 ? mpiexec : program, args + 1, NULL);
}

static luna_test_result train(int ranks, const char *optimizer, const char *update_freq,
                              const char *max_update, const char *save_dir) {
    return train_with(ranks, optimizer, update_freq, max_update, save_dir, NULL);
}

static void expect_success(const luna_test_result *r, const char *what) {
    ck_assert_msg(r->status == 0, "%s: exit status %d\nstdout:\n%s\nstderr:\n%s", what, r->status,
                  r->out, r->err);
}

static size_t count_of(const char *haystack, const char *needle) {
    size_t n = 0;
    for (const char *p = strstr(haystack, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static uint64_t state_uint(const luna_safetensors *st, const char *key) {
    const char *text = luna_safetensors_metadata(st, "training_state");
    ck_assert_ptr_nonnull(text);
    luna_json *j;
    ck_assert_int_eq(luna_json_parse(&j, text, strlen(text), NULL), LUNA_OK);
    const luna_json *v = luna_json_get(j, key);
    ck_assert_msg(v && v->type == LUNA_JSON_NUMBER && v->is_int, "training_state.%s", key);
    uint64_t x = v->uint_value;
    luna_json_free(j);
    return x;
}

/* The largest max|a - b| / max|b| over the tensors of two checkpoints, parameters and optimizer
 * state apart; both must hold the same tensors at the same update. */
static void compare(const char *dir_a, const char *dir_b, bool same_position, double *param_diff,
                    double *state_diff, char *worst, size_t worst_size) {
    char pa[1200], pb[1200];
    snprintf(pa, sizeof pa, "%s/checkpoint_last.safetensors", dir_a);
    snprintf(pb, sizeof pb, "%s/checkpoint_last.safetensors", dir_b);
    luna_safetensors *a, *b;
    ck_assert_msg(luna_checkpoint_open(&a, pa) == LUNA_OK, "%s", luna_error_message());
    ck_assert_msg(luna_checkpoint_open(&b, pb) == LUNA_OK, "%s", luna_error_message());
    ck_assert_int_eq(luna_safetensors_count(a), luna_safetensors_count(b));
    ck_assert_uint_eq(state_uint(a, "num_updates"), state_uint(b, "num_updates"));
    if (same_position) { /* the same epoch, the same batch: rank offsets count every 2nd */
        ck_assert_uint_eq(state_uint(a, "epoch"), state_uint(b, "epoch"));
        uint64_t wa = state_uint(a, "world_size"), wb = state_uint(b, "world_size");
        ck_assert_uint_eq(state_uint(a, "iterator_offset") * wa,
                          state_uint(b, "iterator_offset") * wb);
    }
    *param_diff = *state_diff = 0;
    int optimizer_tensors = 0;
    double worst_diff = -1;
    for (int i = 0; i < luna_safetensors_count(a); i++) {
        const luna_st_tensor *ta = luna_safetensors_at(a, i);
        const luna_st_tensor *tb = luna_safetensors_find(b, ta->name);
        ck_assert_msg(tb != NULL, "tensor %s missing in %s", ta->name, pb);
        ck_assert_uint_eq(ta->nbytes, tb->nbytes);
        if (ta->dtype != LUNA_F32) {
            ck_assert_msg(memcmp(ta->data, tb->data, ta->nbytes) == 0, "%s differs", ta->name);
            continue;
        }
        const float *x = ta->data, *y = tb->data;
        double diff = 0, scale = 0;
        for (size_t k = 0; k < ta->nbytes / sizeof(float); k++) {
            diff = fmax(diff, fabs((double)x[k] - (double)y[k]));
            scale = fmax(scale, fabs((double)y[k]));
        }
        double rel = scale > 0 ? diff / scale : diff;
        bool state = strncmp(ta->name, "optimizer.", 10) == 0;
        optimizer_tensors += state;
        double *slot = state ? state_diff : param_diff;
        *slot = fmax(*slot, rel);
        if (rel > worst_diff) {
            worst_diff = rel;
            snprintf(worst, worst_size, "%s (%.3g)", ta->name, rel);
        }
    }
    ck_assert_int_gt(optimizer_tensors, 0);
    luna_safetensors_close(a);
    luna_safetensors_close(b);
}

static void expect_match(const char *mpi_dir, const char *single_dir, const char *what) {
    double param_diff, state_diff;
    char worst[512];
    compare(mpi_dir, single_dir, true, &param_diff, &state_diff, worst, sizeof worst);
    printf("%s: max relative difference: parameters %.3g, optimizer state %.3g; worst %s\n", what,
           param_diff, state_diff, worst);
    ck_assert_msg(param_diff <= PARAM_TOLERANCE && state_diff <= STATE_TOLERANCE,
                  "%s: parameters differ by %.3g (tolerance %g), optimizer state by %.3g "
                  "(tolerance %g); worst %s",
                  what, param_diff, PARAM_TOLERANCE, state_diff, STATE_TOLERANCE, worst);
}

static void check_two_ranks(const char *optimizer) {
    char mpi[1100], single[1100], other[1100], resumed[1100];
    snprintf(mpi, sizeof mpi, "%s/%s-2ranks", tmp, optimizer);
    snprintf(single, sizeof single, "%s/%s-update-freq-2", tmp, optimizer);
    snprintf(other, sizeof other, "%s/%s-update-freq-1", tmp, optimizer);
    snprintf(resumed, sizeof resumed, "%s/%s-2ranks-then-1", tmp, optimizer);

    luna_test_result r = train(2, optimizer, "1", UPDATES, mpi);
    expect_success(&r, "mpiexec -n 2 luna-train");
    char expected[64];
    snprintf(expected, sizeof expected, "2 rank(s) (%s communicator)", communicator);
    ck_assert_msg(strstr(r.out, expected), "not 2 ranks with %s:\n%s", communicator, r.out);
    /* Only rank 0 prints: one configuration, one end message. */
    ck_assert_uint_eq(count_of(r.out, "num. model params"), 1);
    ck_assert_uint_eq(count_of(r.out, "| done training"), 1);
    size_t validations = count_of(r.out, "valid on 'valid' subset");
    size_t saves = count_of(r.out, "| saved ");

    r = train(0, optimizer, "2", UPDATES, single);
    expect_success(&r, "luna-train --update-freq 2");
    /* The same schedule: validations (interval, epoch end, last update) and checkpoints. */
    ck_assert_uint_eq(count_of(r.out, "valid on 'valid' subset"), validations);
    ck_assert_uint_eq(count_of(r.out, "| saved "), saves);
    ck_assert_uint_ge(validations, 3);
    expect_match(mpi, single, "2 ranks x --update-freq 1 vs 1 process x --update-freq 2");

    /* The comparison can tell runs apart: other batches per update give another model (shown
     * once, on the CPU). */
    if (!on_cuda) {
        r = train(0, optimizer, "1", UPDATES, other);
        expect_success(&r, "luna-train --update-freq 1");
        double param_diff, state_diff;
        char worst[512];
        compare(mpi, other, false, &param_diff, &state_diff, worst, sizeof worst);
        printf("2 ranks x --update-freq 1 vs 1 process x --update-freq 1 (other batches): "
               "parameters differ by %.3g\n",
               param_diff);
        ck_assert_msg(param_diff > 100 * PARAM_TOLERANCE,
                      "2 ranks and one process with --update-freq 1 should differ, but only by %.3g",
                      param_diff);
    }

    /* A checkpoint of 2 ranks resumes in one process with --update-freq 2 at the same batch. */
    r = train(2, optimizer, "1", HALF_UPDATES, resumed);
    expect_success(&r, "mpiexec -n 2 luna-train (first half)");
    r = train(0, optimizer, "2", UPDATES, resumed);
    expect_success(&r, "luna-train --update-freq 2 (resumed)");
    char resumed_at[64];
    snprintf(resumed_at, sizeof resumed_at, "@ %s updates", HALF_UPDATES);
    ck_assert_msg(strstr(r.out, resumed_at), "did not resume:\n%s", r.out);
    expect_match(resumed, single, "2 ranks, resumed by 1 process vs 1 process");
}

START_TEST(test_two_ranks_apollo) { check_two_ranks("apollo"); }
END_TEST

START_TEST(test_two_ranks_adam) { check_two_ranks("adam"); }
END_TEST

/* --save-dir is checked (and checkpoints written) on rank 0 only: when it fails there, rank 1
 * must stop too rather than wait in the first all-reduce (the test would time out). */
START_TEST(test_failure_on_one_rank_stops_all) {
    char file[1100], save_dir[1200];
    snprintf(file, sizeof file, "%s/a-file", tmp);
    luna_test_write_file(file, "not a directory\n");
    snprintf(save_dir, sizeof save_dir, "%s/sub", file);
    luna_test_result r = train(2, "adam", "1", "5", save_dir);
    ck_assert_msg(r.status != 0, "expected a failure:\n%s", r.out);
    ck_assert_msg(strstr(r.err, "--save-dir") && strstr(r.err, "a-file/sub"), "stderr: %s", r.err);
    /* rank 1 stops with rank 0's message */
    ck_assert_msg(strstr(r.err, "rank 0: --save-dir") &&
                      strstr(r.err, "(setup failed on 1 rank(s); rank 1 stops too)"),
                  "stderr: %s", r.err);
}
END_TEST

/* W ranks with --update-freq 1 = one process with --update-freq W, for W = 4 too (the sums
 * then have 4 terms in MPI's order). */
START_TEST(test_four_ranks) {
    char mpi[1100], single[1100];
    snprintf(mpi, sizeof mpi, "%s/4ranks", tmp);
    snprintf(single, sizeof single, "%s/update-freq-4", tmp);
    luna_test_result r = train(4, "apollo", "1", FOUR_RANK_UPDATES, mpi);
    expect_success(&r, "mpiexec -n 4 luna-train");
    ck_assert_msg(strstr(r.out, "world: 4 rank(s) on 1 node(s), 4 per node"), "%s", r.out);
    r = train(0, "apollo", "4", FOUR_RANK_UPDATES, single);
    expect_success(&r, "luna-train --update-freq 4");
    expect_match(mpi, single, "4 ranks x --update-freq 1 vs 1 process x --update-freq 4");
}
END_TEST

static bool same_bytes(const char *dir_a, const char *dir_b, char *diff, size_t size) {
    char pa[1200], pb[1200];
    snprintf(pa, sizeof pa, "%s/checkpoint_last.safetensors", dir_a);
    snprintf(pb, sizeof pb, "%s/checkpoint_last.safetensors", dir_b);
    luna_safetensors *a, *b;
    ck_assert_msg(luna_checkpoint_open(&a, pa) == LUNA_OK, "%s", luna_error_message());
    ck_assert_msg(luna_checkpoint_open(&b, pb) == LUNA_OK, "%s", luna_error_message());
    bool same = luna_safetensors_count(a) == luna_safetensors_count(b);
    for (int i = 0; same && i < luna_safetensors_count(a); i++) {
        const luna_st_tensor *ta = luna_safetensors_at(a, i);
        const luna_st_tensor *tb = luna_safetensors_find(b, ta->name);
        same = tb && ta->nbytes == tb->nbytes && memcmp(ta->data, tb->data, ta->nbytes) == 0;
        if (!same) snprintf(diff, size, "%s", ta->name);
    }
    luna_safetensors_close(a);
    luna_safetensors_close(b);
    return same;
}

/* The bucketed all-reduce, started during the backward pass, gives the bits of one all-reduce
 * after it (2 ranks: every sum has two terms, exact in any order), with --update-freq 2 (only the
 * last micro-batch's backward starts buckets). And buckets really start early. */
START_TEST(test_buckets_same_result) {
    char one[1100], many[1100], other[1100];
    snprintf(one, sizeof one, "%s/bucket-0", tmp);
    snprintf(many, sizeof many, "%s/bucket-small", tmp);
    snprintf(other, sizeof other, "%s/bucket-small-seed", tmp);
    const char *off[] = {"--bucket-size-mb", "0", NULL};
    const char *small[] = {"--bucket-size-mb", "0.02", NULL};
    luna_test_result r = train_with(2, "adam", "2", BUCKET_UPDATES, one, off);
    expect_success(&r, "--bucket-size-mb 0");
    ck_assert_msg(strstr(r.out, "gradient all-reduce: 1 bucket(s), 0 started before"), "%s", r.out);
    r = train_with(2, "adam", "2", BUCKET_UPDATES, many, small);
    expect_success(&r, "--bucket-size-mb 0.02");
    const char *line = strstr(r.out, "gradient all-reduce: ");
    ck_assert_ptr_nonnull(line);
    int buckets = 0, early = 0;
    ck_assert_int_eq(sscanf(line, "gradient all-reduce: %d bucket(s), %d started", &buckets, &early),
                     2);
    printf("--bucket-size-mb 0.02: %d buckets, %d started before the backward pass ended\n",
           buckets, early);
    ck_assert_int_ge(buckets, 8);
    ck_assert_int_ge(early, buckets / 2);
    char diff[512] = "";
    ck_assert_msg(same_bytes(one, many, diff, sizeof diff),
                  "bucketed and unbucketed all-reduce differ in %s", diff);
    /* the comparison is bitwise: another seed differs */
    const char *seed[] = {"--bucket-size-mb", "0.02", "--seed", "6", NULL};
    r = train_with(2, "adam", "2", BUCKET_UPDATES, other, seed);
    expect_success(&r, "--seed 6");
    ck_assert(!same_bytes(one, other, diff, sizeof diff));
}
END_TEST

/* A failure in the middle of training on one rank (here rank 0 cannot write its checkpoint of
 * update 5: a directory is in the way) stops both, each with rank 0's message. */
START_TEST(test_failure_mid_training_stops_all) {
    char save_dir[1100], blocker[1200];
    snprintf(save_dir, sizeof save_dir, "%s/blocked", tmp);
    snprintf(blocker, sizeof blocker, "%s/checkpoint_1_5.safetensors", save_dir);
    ck_assert_int_eq(mkdir(save_dir, 0755), 0);
    ck_assert_int_eq(mkdir(blocker, 0755), 0);
    strcat(blocker, "/x");
    luna_test_write_file(blocker, "in the way\n");
    const char *extra[] = {"--save-interval-updates", "5", NULL};
    luna_test_result r = train_with(2, "adam", "1", "50", save_dir, extra);
    ck_assert_msg(r.status != 0, "expected a failure:\n%s", r.out);
    ck_assert_msg(strstr(r.err, "checkpoint_1_5.safetensors"), "stderr: %s", r.err);
    ck_assert_msg(strstr(r.err, "rank 0: ") &&
                      strstr(r.err, "(saving a checkpoint failed on 1 rank(s); rank 1 stops too)"),
                  "stderr: %s", r.err);
    ck_assert_msg(!strstr(r.out, "update 8 | "), "training went on: %s", r.out);
}
END_TEST

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A rank that hangs (stopped by SIGSTOP) leaves rank 0 waiting in a collective: after
 * --comm-timeout the watchdog aborts the job, instead of waiting forever. */
START_TEST(test_hung_rank_aborts_all) {
    char save_dir[1100], out_path[1200], err_path[1200];
    snprintf(save_dir, sizeof save_dir, "%s/hang", tmp);
    snprintf(out_path, sizeof out_path, "%s/hang.out", tmp);
    snprintf(err_path, sizeof err_path, "%s/hang.err", tmp);
    const char *extra[] = {"--comm-timeout", "3", "--no-save", NULL};
    const char *args[80];
    train_args(args + 1, 2, "adam", "1", "1000000", save_dir, extra);
    luna_test_exec_options o = {.stdout_path = out_path, .stderr_path = err_path};
    luna_test_process p;
    luna_test_start(&p, mpiexec, args + 1, &o);
    /* rank 1's pid from the table rank 0 prints, once training has started */
    long pid = 0;
    for (int tries = 0; tries < 600 && pid == 0; tries++) {
        FILE *f = fopen(out_path, "r");
        char line[512];
        bool started = false;
        long candidate = 0;
        while (f && fgets(line, sizeof line, f)) {
            const char *q = strstr(line, "rank 1: ");
            if (q && strstr(q, ", pid ")) candidate = atol(strstr(q, ", pid ") + 6);
            if (strstr(line, "update 4 | ")) started = true;
        }
        if (f) fclose(f);
        if (started) pid = candidate;
        if (!pid) usleep(100 * 1000);
    }
    ck_assert_msg(pid > 0, "no rank table / training did not start");
    double t0 = seconds_now();
    ck_assert_int_eq(kill((pid_t)pid, SIGSTOP), 0);
    luna_test_result r = luna_test_finish(&p);
    double stop_time = seconds_now() - t0;
    kill((pid_t)pid, SIGKILL); /* in case the launcher left it behind */
    printf("a hung rank (SIGSTOP), --comm-timeout 3: every rank gone after %.1f s (exit %d)\n",
           stop_time, r.status);
    ck_assert_msg(r.status != 0, "expected a failure");
    ck_assert_msg(strstr(r.err, "rank 0: ") && strstr(r.err, "did not complete within 3 s"),
                  "stderr: %s", r.err);
    ck_assert_msg(stop_time < 60, "took %.1f s", stop_time);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("trainer_mpi");
    /* On the CUDA harness (minutes per run) the optimizer-independent cases run once: Apollo's
     * equivalence and resume, 4 ranks, buckets, the failures in training. */
    const char *device = getenv("LUNA_TEST_DEVICE");
    bool cuda = device && strcmp(device, "cuda") == 0;
    TCase *tc = tcase_create("mpi");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_two_ranks_apollo);
    if (!cuda) tcase_add_test(tc, test_two_ranks_adam);
    if (!cuda) tcase_add_test(tc, test_failure_on_one_rank_stops_all);
    tcase_add_test(tc, test_four_ranks);
    tcase_add_test(tc, test_buckets_same_result);
    suite_add_tcase(s, tc);
    TCase *failures = tcase_create("failures");
    tcase_add_checked_fixture(failures, setup, teardown);
    tcase_set_timeout(failures, 240);
    tcase_add_test(failures, test_failure_mid_training_stops_all);
    tcase_add_test(failures, test_hung_rank_aborts_all);
    suite_add_tcase(s, failures);
    return s;
}

/* LUNA_TEST_MIN_GPUS=N (the gpu-labelled run on real GPUs): fewer GPUs than N is a visible skip
 * (exit 77, CTest's SKIP_RETURN_CODE), not a failure. */
static int gpus_here(void) {
    FILE *p = popen("nvidia-smi -L 2>/dev/null", "r");
    if (!p) return 0;
    int n = 0;
    char line[512];
    while (fgets(line, sizeof line, p))
        n += strncmp(line, "GPU ", 4) == 0;
    pclose(p);
    return n;
}

int main(void) {
    const char *min = getenv("LUNA_TEST_MIN_GPUS");
    if (min && *min) {
        int need = atoi(min), have = gpus_here();
        if (have < need) {
            printf("skipped: the multi-GPU suite needs %d GPUs, this machine has %d\n", need, have);
            return 77;
        }
    }
    return luna_test_run(suite());
}
