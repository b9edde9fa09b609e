/* Kernel launches and host waits per training update on the CUDA backend, counted by the
 * harness (luna_emu_launch_count, luna_emu_host_wait_count: stream and device synchronisations,
 * synchronous copies and copies from or to pageable host memory). An update that waits for the
 * device cannot run ahead of it or be captured in a CUDA graph; the aim is one wait per update
 * (its summary read), and this test keeps the count from growing back while the waits are removed.
 *
 * luna-train's own update (the trainer, luna_tiny, a synthetic data-bin, Apollo, clipping) runs
 * for U1 and for U2 updates; the difference of the counts over U2 − U1 is the per-update figure
 * (setup, data loading and the end of the run cancel out).
 *
 * Decoding likewise: a beam search in flight (luna_generate, luna_tiny and transformer_tiny)
 * waits for the device only when it reads its selection back (every sync_interval steps) and,
 * at such a readback, once more for the finished sentences' records. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "decoding/beam_search.h"
#include "model/seq2seq.h"
#include "model/kernels/cuda/cuda_kernels.h"
#include "model/kernels/registry.h"

#include "tests/cuda_emu/luna_cuda_emu_api.h"
#include "tests/test_util.h"
#include "trainer/communicator.h"
#include "trainer/options.h"
#include "trainer/synthetic.h"
#include "trainer/trainer.h"

/* Host waits per update now (luna_tiny, one or three micro-batches): one, the optimizer step's
 * summary — the clipping summary with the update's loss sums, which the micro-batches added up
 * on the device; the update itself checks the finite flag there. The token ids are uploaded with
 * ids_from_host, so the embedding and loss ops skip their device checks (a wait each). Before
 * pinned staging an update waited 27 times, before the id ranges 8, before the loss sums on the
 * device 2 (a readback per micro-batch and the clip summary). */
enum { MAX_WAITS_PER_UPDATE = 1 };

/* Under AddressSanitizer (tools/test.sh --sanitize) the harness runs ~20 times slower: this suite
 * then checks the one-micro-batch update and Luna's decoding only. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

typedef struct {
    uint64_t launches, waits, counted; /* counted: the backend's own count of its kernels */
} counts;

/* validate: also validate after every update (else no validation) */
static counts train(char *bin, char *save, int updates, int update_freq, bool validate) {
    char max_update[16], freq[16];
    snprintf(max_update, sizeof max_update, "%d", updates);
    snprintf(freq, sizeof freq, "%d", update_freq);
    char *argv[] = {"luna-train",
                    bin,
                    "--device",
                    "cuda",
                    "--arch",
                    "luna_tiny",
                    "--optimizer",
                    "apollo",
                    "--lr",
                    "0.01",
                    "--clip-norm",
                    "1",
                    "--max-tokens",
                    "64",
                    "--max-update",
                    max_update,
                    "--save-dir",
                    save,
                    "--no-save",
                    "--validate-interval-updates",
                    "1",
                    "--threads",
                    "1",
                    "--no-progress-bar",
                    "--log-interval",
                    "1000",
                    "--update-freq",
                    freq,
                    NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    luna_train_options o;
    ck_assert_msg(luna_train_options_parse(&o, argc, argv) == LUNA_OK, "%s", luna_error_message());
    o.disable_validation = !validate; /* --disable-validation */
    luna_communicator *comm;
    ck_assert_int_eq(luna_communicator_create_single(&comm), LUNA_OK);
    luna_trainer *t;
    counts before = {luna_emu_launch_count(), luna_emu_host_wait_count(),
                     luna_cuda_kernel_launches()};
    ck_assert_msg(luna_trainer_create(&t, &o, comm, stdout) == LUNA_OK, "%s", luna_error_message());
    ck_assert_msg(luna_trainer_run(t, NULL) == LUNA_OK, "%s", luna_error_message());
    luna_trainer_free(t);
    counts after = {luna_emu_launch_count(), luna_emu_host_wait_count(),
                    luna_cuda_kernel_launches()};
    luna_communicator_free(comm);
    return (counts){after.launches - before.launches, after.waits - before.waits,
                    after.counted - before.counted};
}

/* Ids uploaded with ids_from_host: an op checking them against V needs no wait when their range
 * fits [0, V), still rejects them (with the CPU's message) when it does not, and checks with a
 * wait again once a to_host has passed (the memory may have been reused since). */
START_TEST(uploaded_id_ranges_skip_the_device_check) {
    luna_backend *be;
    luna_backend_options opt = luna_backend_options_default();
    ck_assert_int_eq(luna_backend_create(&be, "cuda", &opt), LUNA_OK);
    const int V = 10, d = 4;
    int32_t good[6] = {0, 3, 9, 2, 2, 1}, bad[6] = {0, 3, 10, 2, 2, 1};
    int32_t *ids = luna_mem_alloc(be, sizeof good);
    float *table = luna_mem_alloc(be, sizeof(float) * V * d), host[6 * 4];
    luna_act *out = luna_mem_alloc(be, luna_act_bytes(be, 6 * d));
    ck_assert_int_eq(luna_mem_zero(be, table, sizeof(float) * V * d), LUNA_OK);
    ck_assert_int_eq(luna_mem_ids_from_host(be, ids, good, 6), LUNA_OK);
    uint64_t w0 = luna_emu_host_wait_count();
    ck_assert_int_eq(be->ops->embedding_forward(be, out, table, ids, 6, V, d, 1.0f, 1), LUNA_OK);
    ck_assert_int_eq(be->ops->embedding_forward(be, out, table, ids + 2, 3, V, d, 1.0f, 1),
                     LUNA_OK);
    ck_assert_uint_eq(luna_emu_host_wait_count() - w0, 0); /* inside the uploaded range */
    ck_assert_int_eq(be->ops->embedding_forward(be, out, table, ids, 6, 9, d, 1.0f, 1),
                     LUNA_ERR_INVALID_ARGUMENT); /* a smaller vocabulary: checked, and caught */
    ck_assert_int_eq(luna_mem_ids_from_host(be, ids, bad, 6), LUNA_OK);
    ck_assert_int_eq(be->ops->embedding_forward(be, out, table, ids, 6, V, d, 1.0f, 1),
                     LUNA_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(luna_error_message(), "token id 10 at position 2"));
    ck_assert_int_eq(luna_mem_ids_from_host(be, ids, good, 6), LUNA_OK);
    ck_assert_int_eq(luna_mem_to_host(be, host, out, sizeof(float)), LUNA_OK);
    w0 = luna_emu_host_wait_count();
    ck_assert_int_eq(be->ops->embedding_forward(be, out, table, ids, 6, V, d, 1.0f, 1), LUNA_OK);
    ck_assert_uint_gt(luna_emu_host_wait_count() - w0, 0); /* after a to_host: the device check */
    /* ids an op produced, stated in range by the caller: no check, no wait */
    luna_mem_ids_in_range(be, ids, 6, 0, V - 1);
    w0 = luna_emu_host_wait_count();
    ck_assert_int_eq(be->ops->embedding_forward(be, out, table, ids, 6, V, d, 1.0f, 1), LUNA_OK);
    ck_assert_uint_eq(luna_emu_host_wait_count() - w0, 0);
    luna_mem_release(be, ids, sizeof good), luna_mem_release(be, table, sizeof(float) * V * d);
    luna_mem_release(be, out, luna_act_bytes(be, 6 * d));
    luna_backend_free(be);
}
END_TEST

START_TEST(launches_and_host_waits_per_update) {
    char *tmp = luna_test_make_temp_dir();
    char bin[1024], save[1024];
    snprintf(bin, sizeof bin, "%s/bin", tmp);
    snprintf(save, sizeof save, "%s/ckpt", tmp);
    luna_synthetic_options so;
    luna_synthetic_options_init(&so);
    so.num_train = 200, so.num_valid = 40; /* a few batches: the harness is slow under ASan */
    ck_assert_int_eq(luna_synthetic_data_bin(bin, &so), LUNA_OK);
    enum { U1 = 2, U2 = 4 };
    counts plain[2]; /* --update-freq 1 without validation, U1 and U2 updates */
    for (int freq = 1; freq <= (UNDER_ASAN ? 1 : 3); freq += 2) {
        counts a = train(bin, save, U1, freq, false), b = train(bin, save, U2, freq, false);
        if (freq == 1) plain[0] = a, plain[1] = b;
        const double launches = (double)(b.launches - a.launches) / (U2 - U1);
        const double waits = (double)(b.waits - a.waits) / (U2 - U1);
        printf("luna_tiny training update on the CUDA backend (harness), --update-freq %d: %.1f "
               "kernel "
               "launches, %.1f host waits per update\n",
               freq, launches, waits);
        ck_assert_msg(launches > 0, "no launches counted: the update did not run on the device");
        /* the backend's count (bench-model's launches per step on a GPU) misses none of them */
        ck_assert_msg(b.counted - a.counted == b.launches - a.launches,
                      "the backend counted %llu kernel launches, the harness ran %llu",
                      (unsigned long long)(b.counted - a.counted),
                      (unsigned long long)(b.launches - a.launches));
        ck_assert_msg(waits <= MAX_WAITS_PER_UPDATE,
                      "%.1f host waits per update, at most %d expected", waits,
                      MAX_WAITS_PER_UPDATE);
    }
    if (UNDER_ASAN) { /* the counts do not depend on ASan: the plain build checks them */
        printf("under AddressSanitizer: the --update-freq 3 and validation counts are left to the "
               "plain build (each run of the harness takes ~20 times as long here)\n");
        luna_test_remove_tree(tmp);
        free(tmp);
        return;
    }
    /* validation after every update: its batches' losses add up on the device and come back in
     * one read (a read per batch before) */
    counts va = train(bin, save, U1, 1, true), vb = train(bin, save, U2, 1, true);
    const double per_validation =
        ((double)(vb.waits - va.waits) - (double)(plain[1].waits - plain[0].waits)) / (U2 - U1);
    printf("luna_tiny validation on the CUDA backend (harness): %.1f host waits per validation\n",
           per_validation);
    ck_assert_msg(per_validation <= 1.0, "%.1f host waits per validation, at most 1 expected",
                  per_validation);
    luna_test_remove_tree(tmp);
    free(tmp);
}
END_TEST

/* Host waits of a beam search in flight on the CUDA backend: N sentences of exactly STEPS steps
 * (min_len = max_len), all in one pool, with the selection read back every step and every 8. */
static double decode_waits(luna_seq2seq *m, int sync_interval, int *steps) {
    enum { N = 6, LEN = 12 };
    int32_t toks[N][5];
    luna_token_seq src[N];
    for (int s = 0; s < N; s++) {
        for (int t = 0; t < 4; t++)
            toks[s][t] = 4 + (s * 5 + t * 3) % 19;
        toks[s][4] = 2;
        src[s] = (luna_token_seq){toks[s], 5};
    }
    luna_beam_options o;
    luna_beam_options_init(&o);
    o.beam = 4, o.max_len_a = 0, o.max_len_b = LEN, o.min_len = LEN;
    o.sync_interval = sync_interval;
    luna_incremental *inc;
    ck_assert_int_eq(luna_incremental_create(&inc, m), LUNA_OK);
    luna_nbest out[N];
    const uint64_t w0 = luna_emu_host_wait_count();
    ck_assert_msg(luna_generate(inc, &o, src, N, 0, 0, out, NULL, NULL) == LUNA_OK, "%s",
                  luna_error_message());
    const uint64_t waits = luna_emu_host_wait_count() - w0;
    *steps = luna_incremental_steps(inc);
    for (int s = 0; s < N; s++) {
        ck_assert_int_eq(out[s].count, 1);
        ck_assert_int_eq(out[s].hyps[0].len, LEN + 1);
        luna_nbest_release(&out[s]);
    }
    luna_incremental_free(inc);
    return (double)waits;
}

START_TEST(host_waits_per_decoder_step) {
    luna_backend *be;
    luna_backend_options opt = luna_backend_options_default();
    ck_assert_int_eq(luna_backend_create(&be, "cuda", &opt), LUNA_OK);
    const char *presets[2] = {"luna_tiny", "transformer_tiny"};
    for (int p = 0; p < (UNDER_ASAN ? 1 : 2); p++) { /* ASan: Luna's only (the harness's time) */
        luna_config c;
        ck_assert_int_eq(luna_config_preset(&c, presets[p]), LUNA_OK);
        c.vocab_size = 24;
        luna_seq2seq *m;
        ck_assert_int_eq(luna_seq2seq_create(&m, be, &c), LUNA_OK);
        ck_assert_int_eq(luna_seq2seq_init(m, 3), LUNA_OK);
        int steps1, steps8;
        const double every = decode_waits(m, 1, &steps1), eighth = decode_waits(m, 8, &steps8);
        printf("%s beam search on the CUDA backend (harness), %d steps: %.0f host waits reading "
               "the selection every step, %.0f every 8 steps\n",
               presets[p], steps1, every, eighth);
        ck_assert_int_eq(steps1, steps8);
        /* every step: a readback each; every 8: one per 8 steps and one at the length limit;
         * besides, one for the finished sentences' records (all 6 finish at that step: gathered
         * on the device, read in one copy) and one for encoding the sources */
        ck_assert_msg(every >= steps1 && every <= steps1 + 2, "%s: %.0f waits in %d steps",
                      presets[p], every, steps1);
        ck_assert_msg(eighth <= (steps8 + 7) / 8 + 2,
                      "%s: %.0f waits in %d steps reading back every 8 (every step: %.0f)",
                      presets[p], eighth, steps8, every);
        luna_seq2seq_free(m);
    }
    luna_backend_free(be);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cuda_update_waits");
    TCase *tc = tcase_create("update");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, launches_and_host_waits_per_update);
    tcase_add_test(tc, uploaded_id_ranges_skip_the_device_check);
    tcase_add_test(tc, host_waits_per_decoder_step);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return luna_test_run(suite()); }
