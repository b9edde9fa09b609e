/* The training loop (see trainer.h). */
#include "trainer/trainer_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/kernels/registry.h"
#include "core/file_util.h"
#include "optim/clip.h"
#include "data/sentencepiece.h"
#include "optim/lr_scheduler.h"

double luna_trainer_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- setup ----------------------------------------------------------------------------------- */

static bool split_exists(const char *dir, const char *split, const char *src, const char *tgt) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s-%s.%s.idx", dir, split, src, tgt, src);
    if (luna_path_exists(path)) return true;
    snprintf(path, sizeof path, "%s/%s.%s-%s.%s.idx", dir, split, tgt, src, src);
    return luna_path_exists(path);
}

static luna_status open_data(luna_trainer *t) {
    luna_train_options *o = t->o;
    const char *dir = o->data_bin;
    if (o->source_lang && o->target_lang) {
        t->src_lang = strdup(o->source_lang);
        t->tgt_lang = strdup(o->target_lang);
        if (!t->src_lang || !t->tgt_lang)
            return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    } else {
        LUNA_TRY(luna_data_infer_language_pair(dir, o->train_subset, &t->src_lang, &t->tgt_lang));
        if (o->source_lang && strcmp(o->source_lang, t->src_lang) != 0)
            return luna_error(LUNA_ERR_MISMATCH, "%s: --source-lang %s, but the data-bin is %s-%s",
                              dir, o->source_lang, t->src_lang, t->tgt_lang);
        if (o->target_lang && strcmp(o->target_lang, t->tgt_lang) != 0)
            return luna_error(LUNA_ERR_MISMATCH, "%s: --target-lang %s, but the data-bin is %s-%s",
                              dir, o->target_lang, t->src_lang, t->tgt_lang);
    }
    o->source_lang = t->src_lang;
    o->target_lang = t->tgt_lang;
    LUNA_TRY(luna_pair_dataset_open(&t->train, dir, o->train_subset, t->src_lang, t->tgt_lang));
    const luna_dictionary *sd = luna_pair_dataset_src_dict(t->train);
    const luna_dictionary *td = luna_pair_dataset_tgt_dict(t->train);
    int32_t diff;
    if (!luna_dictionary_same_symbols(sd, td, &diff))
        return luna_error(LUNA_ERR_MISMATCH,
                          "%s: dict.%s.txt and dict.%s.txt differ (first at id %d); the models "
                          "here share one embedding table: preprocess with --joined-dictionary",
                          dir, t->src_lang, t->tgt_lang, (int)diff);
    if (!o->disable_validation && split_exists(dir, o->valid_subset, t->src_lang, t->tgt_lang))
        LUNA_TRY(luna_pair_dataset_open(&t->valid, dir, o->valid_subset, t->src_lang, t->tgt_lang));
    char *spm_path = luna_path_join(dir, "spm.model");
    if (!spm_path) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    luna_status s = LUNA_OK;
    if (luna_path_exists(spm_path)) s = luna_read_file(spm_path, &t->spm_bytes, &t->spm_size);
    if (s == LUNA_OK && t->spm_bytes) {
        /* Every checkpoint embeds it: a corrupt one must stop the run now, not at translation. */
        luna_spm *spm = NULL;
        s = luna_spm_load_from_memory(&spm, t->spm_bytes, t->spm_size, spm_path);
        luna_spm_free(spm);
    }
    free(spm_path);
    return s;
}

static luna_status make_batches(luna_trainer *t) {
    const luna_train_options *o = t->o;
    luna_batching_options b;
    luna_batching_options_init(&b);
    b.max_tokens = o->max_tokens;
    b.max_sentences = (int32_t)o->max_sentences;
    b.required_batch_size_multiple = (int32_t)o->required_batch_size_multiple;
    b.max_source_positions = (int32_t)o->max_source_positions;
    b.max_target_positions = (int32_t)o->max_target_positions;
    b.skip_invalid = true;
    b.shuffle = true;
    b.seed = (uint64_t)o->seed;
    b.num_shards = t->comm->world_size;
    b.shard_id = t->comm->rank;
    LUNA_TRY(luna_batch_plan_create(&t->train_plan, t->train, &b));
    LUNA_TRY(luna_batch_iterator_create(&t->it, t->train_plan, &b));
    if (t->train_plan->num_batches == 0)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                          "%s: no training batches: all %zu pairs are longer than "
                          "--max-source/target-positions or --max-tokens",
                          o->data_bin, luna_pair_dataset_count(t->train));
    size_t skipped = t->train_plan->num_filtered_positions + t->train_plan->num_filtered_tokens;
    if (skipped)
        luna_log_message(t,
                         "skipped %zu training pairs that do not fit --max-source/target-"
                         "positions or --max-tokens",
                         skipped);
    if (t->valid) {
        b.shuffle = false;
        LUNA_TRY(luna_batch_plan_create(&t->valid_plan, t->valid, &b));
        LUNA_TRY(luna_batch_iterator_create(&t->valid_it, t->valid_plan, &b));
    }
    return luna_data_batch_create(&t->batch);
}

/* One trainer per --save-dir (core/dir_lock.h), then the debris of dead ones removed. */
static luna_status lock_save_dir(luna_trainer *t) {
    const char *dir = t->o->save_dir;
    long stale = 0;
    LUNA_TRY(luna_dir_lock_acquire(&t->save_dir_lock, dir, "--save-dir", &stale));
    if (stale > 0 && !luna_process_alive(stale))
        luna_log_message(t,
                         "note: --save-dir %s: took over the lock of pid %ld, which ended "
                         "without releasing it",
                         dir, stale);
    size_t removed = 0;
    char example[256];
    LUNA_TRY(luna_remove_stale_temporaries(dir, &removed, example, sizeof example));
    if (removed)
        luna_log_message(t,
                         "note: --save-dir %s: removed %zu stale temporary file(s) of "
                         "processes that no longer run (e.g. %s)",
                         dir, removed, example);
    return LUNA_OK;
}

/* The GPU of this rank when --device-id is not given: one GPU per rank, by the launcher's local
 * rank (Open MPI, Slurm, MPICH/Intel MPI), else the first. */
static int default_device_id(const luna_communicator *comm) {
    if (comm->world_size <= 1) return -1;
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return -1;
}

/* The gradient buckets, and the table of ranks rank 0 prints (host, pid, device of each). */
static luna_status setup_ranks(luna_trainer *t) {
    luna_communicator *c = t->comm;
    size_t bucket = (size_t)(t->o->bucket_size_mb * 1024 * 1024);
    if (t->o->bucket_size_mb > 0 && bucket < sizeof(float)) bucket = sizeof(float);
    LUNA_TRY(luna_grad_buckets_create(&t->buckets, c, t->model, bucket));
    enum { LINE = 160 };
    char mine[LINE], host[64] = "?";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = 0;
    int device = -1;
#ifdef LUNA_WITH_CUDA
    luna_backend_cuda_stream(t->be, &device);
#endif
    char dev[32] = "cpu";
    if (device >= 0) snprintf(dev, sizeof dev, "%s:%d", t->be->name, device);
    snprintf(mine, sizeof mine, "  rank %d: %s, pid %ld, local rank %d of %d, %s", c->rank, host,
             (long)getpid(), c->local_rank, c->local_size, dev);
    char *all = calloc((size_t)c->world_size, LINE);
    t->ranks_table = calloc((size_t)c->world_size, LINE + 1);
    if (!all || !t->ranks_table) {
        free(all);
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    luna_status s = c->gather_host(c, mine, all, LINE);
    for (int r = 0; r < c->world_size && s == LUNA_OK; r++) {
        strcat(t->ranks_table, all + (size_t)r * LINE);
        strcat(t->ranks_table, "\n");
    }
    free(all);
    return s;
}

luna_status luna_trainer_create(luna_trainer **out, luna_train_options *o, luna_communicator *comm,
                                FILE *log) {
    *out = NULL;
    luna_trainer *t = calloc(1, sizeof *t);
    if (!t) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    t->o = o;
    t->comm = comm;
    t->log = log;
    t->progress = !o->no_progress_bar && isatty(STDERR_FILENO) && comm->rank == 0;
    t->epoch = 1;
    t->best_loss = INFINITY;
    t->last_valid_loss = t->last_epoch_loss = NAN;
    t->last_saved_update = -1;
    luna_status s = LUNA_OK;
    luna_backend_options backend_options = luna_backend_options_default();
    backend_options.num_threads = (int)o->threads;
    /* -1 (not given) picks the rank's GPU under a launcher; anything else is checked by the
     * backend (CPU: no device numbers; CUDA: 0..count-1). */
    backend_options.device_id = (int)o->device_id;
    if (o->device_id == -1 && strcmp(o->device, "cuda") == 0)
        backend_options.device_id = default_device_id(comm);
    /* --save-dir first: an unwritable one must fail before any expensive work. */
    if (o->max_update != 0 && !o->no_save && comm->rank == 0) {
        s = luna_trainer_check_save_dir(o->save_dir);
        if (s == LUNA_OK) s = lock_save_dir(t);
    }
    if (s == LUNA_OK)
        s = luna_backend_options_set_precision(&backend_options, o->device, o->precision, o->tf32,
                                               true);
    if (s == LUNA_OK) s = luna_backend_create(&t->be, o->device, &backend_options);
    if (s == LUNA_OK) s = open_data(t);
    if (s == LUNA_OK) s = make_batches(t);
    if (s == LUNA_OK) {
        o->model.vocab_size = luna_dictionary_size(luna_pair_dataset_tgt_dict(t->train));
        s = luna_config_validate(&o->model);
    }
    if (s == LUNA_OK) s = luna_seq2seq_create(&t->model, t->be, &o->model);
    if (s == LUNA_OK) s = luna_seq2seq_init(t->model, (uint64_t)o->seed);
    if (s == LUNA_OK) s = luna_params_trainable_table(t->model->params, &t->trainable);
    if (s == LUNA_OK)
        s = luna_optimizer_create(&t->opt, t->be, &o->optim, t->trainable, t->model->params->data,
                                  t->model->params->grad);
    if (s == LUNA_OK) {
        t->valid_sums = luna_mem_alloc(t->be, 2 * sizeof(double));
        if (!t->valid_sums) s = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of %s memory", t->be->name);
    }
    if (s == LUNA_OK && o->max_update != 0) {
        bool explicit_ = false;
        char *path = luna_trainer_restore_path(t, &explicit_);
        if (!path)
            s = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        else if (luna_path_exists(path))
            s = luna_trainer_restore(t, path);
        else if (explicit_)
            s = luna_error(LUNA_ERR_IO, "%s: --restore-file does not exist", path);
        free(path);
    }
    /* Setup can fail on one rank only (--save-dir is checked on rank 0): all ranks stop then. */
    s = luna_communicator_agree(comm, s, "setup");
    /* NCCL joins with the GPU the backend chose (after every rank has its backend). */
    if (s == LUNA_OK) s = luna_communicator_agree(comm, comm->attach_device(comm, t->be), "setup");
    if (s == LUNA_OK && comm->world_size > 1) s = setup_ranks(t);
    if (s != LUNA_OK) {
        luna_trainer_free(t);
        return s;
    }
    *out = t;
    return LUNA_OK;
}

void luna_trainer_free(luna_trainer *t) {
    if (!t) return;
    luna_grad_buckets_free(t->buckets);
    free(t->ranks_table);
    luna_optimizer_free(t->opt);
    if (t->valid_sums) luna_mem_release(t->be, t->valid_sums, 2 * sizeof(double));
    luna_tensor_table_free(t->trainable);
    luna_seq2seq_free(t->model);
    luna_data_batch_free(t->batch);
    luna_batch_iterator_free(t->it);
    luna_batch_iterator_free(t->valid_it);
    luna_batch_plan_free(t->train_plan);
    luna_batch_plan_free(t->valid_plan);
    luna_pair_dataset_free(t->train);
    luna_pair_dataset_free(t->valid);
    if (t->be) luna_backend_free(t->be);
    free(t->spm_bytes);
    free(t->src_lang);
    free(t->tgt_lang);
    luna_dir_lock_release(t->save_dir_lock);
    free(t);
}

void luna_trainer_print_summary(const luna_trainer *t) {
    if (t->comm->rank != 0) return;
    /* With --log-format json stdout carries only the JSON log objects. */
    FILE *f = strcmp(t->o->log_format, "json") == 0 ? stderr : t->log;
    fprintf(f, "luna-train %s\n", LUNA_VERSION);
    luna_train_options_print(t->o, f);
    char desc[512];
    luna_config_describe(&t->o->model, desc, sizeof desc);
    const luna_params *p = t->model->params;
    size_t trained = 0;
    for (int i = 0; i < p->num_tensors; i++)
        if (p->tensors[i].has_grad) trained += p->tensors[i].numel;
    fprintf(f, "model: %s\n", desc);
    fprintf(f, "data: %s %s-%s: train %zu pairs in %zu batches (%zu per epoch on this rank)",
            t->o->data_bin, t->src_lang, t->tgt_lang, luna_pair_dataset_count(t->train),
            t->train_plan->num_batches, luna_batch_iterator_epoch_length(t->it));
    if (t->valid)
        fprintf(f, ", %s %zu pairs", t->o->valid_subset, luna_pair_dataset_count(t->valid));
    else
        fprintf(f, ", no validation");
    fprintf(f, "%s\n", t->spm_bytes ? ", with spm.model" : "");
    fprintf(f, "training on %s with %d thread(s), %d rank(s) (%s communicator)\n", t->be->name,
            t->be->num_threads, t->comm->world_size, t->comm->name);
    if (t->buckets) {
        int nodes = t->comm->world_size / (t->comm->local_size > 0 ? t->comm->local_size : 1);
        fprintf(f,
                "world: %d rank(s) on %d node(s), %d per node; gradient all-reduce in %d "
                "bucket(s) of <= %.4g MB, timeout %g s\n%s",
                t->comm->world_size, nodes, t->comm->local_size,
                luna_grad_buckets_count(t->buckets),
                (double)luna_grad_buckets_bytes(t->buckets) / (1024.0 * 1024.0), t->o->comm_timeout,
                t->ranks_table);
    }
    fprintf(f, "num. model params: %zu (num. trained: %zu)\n", p->num_params, trained);
    fflush(f);
}

/* ---- one update ------------------------------------------------------------------------------ */

static luna_batch model_batch(const luna_data_batch *b) {
    return (luna_batch){.B = b->batch_size,
                        .src_len = b->src_len,
                        .tgt_len = b->tgt_len,
                        .src_tokens = b->src_tokens,
                        .src_lengths = b->src_lengths,
                        .prev_output_tokens = b->prev_output_tokens,
                        .target = b->target};
}

/* Sums the n statistics across ranks, with the gradients' all-reduce when `with_gradients`
 * (luna_grad_buckets_finish); the last statistic counts the ranks that failed (this rank's
 * `failed` sets it), so that every rank learns of a failure in the same collective and all stop
 * together. Returns this rank's own error, or the failing rank's message on the others. */
static luna_status reduce_stats(luna_trainer *t, double *stats, int n, luna_status failed,
                                const char *what, bool with_gradients) {
    if (t->comm->world_size <= 1) return failed;
    stats[n - 1] = failed != LUNA_OK ? 1 : 0;
    char saved[512] = "";
    if (failed != LUNA_OK) snprintf(saved, sizeof saved, "%s", luna_error_message());
    luna_status reduced = with_gradients ? luna_grad_buckets_finish(t->buckets, stats, (size_t)n)
                                         : t->comm->all_reduce_sum_host(t->comm, stats, (size_t)n);
    if (reduced != LUNA_OK && failed == LUNA_OK) return reduced;
    if (failed != LUNA_OK) luna_error(failed, "%s", saved);
    return luna_communicator_share_failure(t->comm, failed, stats[n - 1], what);
}

/* With several ranks the loss sums are needed on the host before the optimizer's step (they
 * go into the all-reduce of the statistics): read them (a wait) and zero them on the device. */
static luna_status read_loss_sums(luna_trainer *t, double *stats) {
    double *sums = luna_optimizer_loss_sums(t->opt), host[2];
    LUNA_TRY(luna_mem_to_host(t->be, host, sums, sizeof host));
    LUNA_TRY(luna_mem_zero(t->be, sums, sizeof host));
    stats[0] = host[0];
    stats[1] = host[1];
    if (!isfinite(host[0]) || !isfinite(host[1])) stats[4] = 1;
    return LUNA_OK;
}

/* Runs update_freq micro-batches (fewer at the end of an epoch). *got: micro-batches taken
 * (0: the epoch was already exhausted, nothing done); *stepped: the optimizer stepped.
 * One rank reads the device once per update: the micro-batches add their losses up on the
 * device (luna_optimizer_loss_sums) and the optimizer's step reads them back with its clip
 * summary, after the update is queued; a non-finite loss skips the update there. */
static luna_status train_update(luna_trainer *t, int *got, bool *stepped) {
    const luna_train_options *o = t->o;
    *got = 0;
    *stepped = false;
    double t0 = luna_trainer_now();
    /* loss, nll (nats), target tokens, sentences, updates with a non-finite loss, ranks that
     * failed (summed across ranks with the rest, so that all ranks stop together) */
    double stats[6] = {0, 0, 0, 0, 0, 0};
    /* zero: the optimizer's step zeroes them after reading them, and so does read_loss_sums (an
     * update that fails between the two ends training) */
    double *sums = luna_optimizer_loss_sums(t->opt);
    luna_status failed = luna_seq2seq_zero_grad(t->model);
    for (int k = 0; k < (int)o->update_freq && failed == LUNA_OK; k++) {
        const uint32_t *ids;
        size_t n;
        bool repeated;
        if (!luna_batch_iterator_next(t->it, &ids, &n, &repeated)) break;
        ++*got;
        if (repeated) continue; /* zero weight: keeps the ranks in step, adds nothing */
        /* the update's last backward: its finished gradients go to the all-reduce at once */
        if (t->buckets && k == (int)o->update_freq - 1) luna_grad_buckets_arm(t->buckets);
        failed = luna_data_batch_fill(t->batch, t->train, ids, n);
        if (failed != LUNA_OK) break;
        luna_batch mb = model_batch(t->batch);
        /* Dropout masks are keyed by the micro-batch's place in the update across all ranks
         * (rank r's k-th micro-batch is the epoch's batch (u·F + k)·W + r, see batching.h), so W
         * ranks with --update-freq F draw the masks of one process with --update-freq F·W. */
        uint64_t step = ((uint64_t)t->num_updates * (uint64_t)o->update_freq + (uint64_t)k) *
                            (uint64_t)t->comm->world_size +
                        (uint64_t)t->comm->rank;
        luna_status st = luna_seq2seq_forward_backward_sums(t->model, &mb, step, sums);
        if (st != LUNA_OK) {
            failed = st;
            break;
        }
        stats[2] += (double)t->batch->ntokens;
        stats[3] += (double)t->batch->batch_size;
    }
    luna_batch_iterator_position(t->it, &t->epoch, &t->offset);
    if (*got == 0) return LUNA_OK; /* at the same point on every rank (same epoch length) */
    const bool one_rank = t->comm->world_size <= 1;
    if (!one_rank && failed == LUNA_OK) failed = read_loss_sums(t, stats);
    char what[48];
    snprintf(what, sizeof what, "update %lld", (long long)t->num_updates + 1);
    LUNA_TRY(reduce_stats(t, stats, 6, failed, what, t->buckets != NULL));
    if (stats[2] <= 0 && stats[4] == 0) {
        t->skipped_updates++;
        luna_log_message(t, "update %lld had no target tokens: skipped",
                         (long long)t->num_updates + 1);
        return LUNA_OK;
    }
    /* Gradients per target token, clipped, then the optimizer's update: one call. */
    luna_optimizer_step_result r = {.grad_norm = NAN, .clipped = false, .finite = stats[4] == 0};
    if (r.finite) {
        luna_optimizer_step_args a = {.lr = luna_lr_at(&o->lr_config, t->num_updates),
                                      .grad_scale = 1.0 / stats[2],
                                      .clip_norm = o->clip_norm,
                                      .clip_mode = o->clip_mode};
        LUNA_TRY(luna_optimizer_step(t->opt, &a, &r));
        if (one_rank) {
            stats[0] = r.loss_sum;
            stats[1] = r.nll_sum;
        }
    }
    double gnorm = r.grad_norm;
    bool clipped = r.clipped, finite = r.finite;
    if (!finite) {
        t->skipped_updates++;
        t->consecutive_skips++;
        luna_log_message(
            t,
            "update %lld: non-finite loss or gradients (gnorm %g): update skipped, weights "
            "and optimizer state unchanged (%lld skipped so far)",
            (long long)t->num_updates + 1, gnorm, (long long)t->skipped_updates);
        if (t->consecutive_skips >= LUNA_MAX_CONSECUTIVE_SKIPS)
            return luna_error(LUNA_ERR_NUMERIC,
                              "update %lld: non-finite gradients in %d consecutive updates: "
                              "training diverged (lower --lr, raise --warmup-updates or use "
                              "--clip-norm); the last checkpoint in %s is from before",
                              (long long)t->num_updates + 1, LUNA_MAX_CONSECUTIVE_SKIPS,
                              o->save_dir);
        return LUNA_OK;
    }
    t->num_updates++;
    t->consecutive_skips = 0;
    t->lr = luna_lr_at(&o->lr_config, t->num_updates);
    *stepped = true;
    double dt = luna_trainer_now() - t0;
    t->train_wall += dt;
    luna_meters m = {.loss = stats[0],
                     .nll = stats[1],
                     .ntokens = stats[2],
                     .nsentences = stats[3],
                     .gnorm_sum = gnorm,
                     .updates = 1,
                     .clipped = clipped ? 1 : 0,
                     .train_seconds = dt};
    luna_meters_add(&t->interval, &m);
    luna_meters_add(&t->epoch_meters, &m);
    return LUNA_OK;
}

/* ---- validation ------------------------------------------------------------------------------ */

/* The batches' losses add up on the device (loss_sums) and are read once, at the end; a
 * non-finite batch makes the validation loss NaN (or infinite), as it reaches the sums. */
static luna_status validate(luna_trainer *t) {
    double t0 = luna_trainer_now();
    /* loss, nll, target tokens, sentences, ranks that failed */
    double stats[5] = {0, 0, 0, 0, 0};
    luna_status failed = luna_batch_iterator_seek(t->valid_it, 1, 0);
    if (failed == LUNA_OK) failed = luna_mem_zero(t->be, t->valid_sums, 2 * sizeof(double));
    const uint32_t *ids;
    size_t n;
    bool repeated;
    while (failed == LUNA_OK && luna_batch_iterator_next(t->valid_it, &ids, &n, &repeated)) {
        if (repeated) continue;
        failed = luna_data_batch_fill(t->batch, t->valid, ids, n);
        if (failed != LUNA_OK) break;
        luna_batch mb = model_batch(t->batch);
        failed = luna_seq2seq_forward_sums(t->model, &mb, t->valid_sums);
        if (failed != LUNA_OK) break;
        stats[2] += (double)t->batch->ntokens;
        stats[3] += (double)t->batch->batch_size;
    }
    if (failed == LUNA_OK)
        failed = luna_mem_to_host(t->be, stats, t->valid_sums, 2 * sizeof(double));
    LUNA_TRY(reduce_stats(t, stats, 5, failed, "validation", false));
    luna_meters m = {
        .loss = stats[0], .nll = stats[1], .ntokens = stats[2], .nsentences = stats[3]};
    t->last_valid_loss = stats[2] > 0 ? stats[0] / stats[2] / log(2.0) : NAN;
    bool improved = t->last_valid_loss < t->best_loss;
    if (improved) {
        t->best_loss = t->last_valid_loss;
        t->patience_counter = 0;
    } else {
        t->patience_counter++;
    }
    luna_log_valid(t, &m, luna_trainer_now() - t0);
    return LUNA_OK;
}

/* ---- the loop -------------------------------------------------------------------------------- */

typedef enum { GO_ON, STOP_SIGNAL, STOP_DONE } stop_reason;

/* After an update (or at an epoch end): log, validate and save as the options ask; decide whether
 * to stop. `stepped`: an optimizer step just happened. */
static luna_status after_update(luna_trainer *t, bool stepped, bool end_of_epoch,
                                volatile sig_atomic_t *stop, stop_reason *reason) {
    const luna_train_options *o = t->o;
    int64_t u = t->num_updates;
    uint64_t epoch = t->epoch; /* the epoch these updates belong to */
    bool signalled = stop && *stop;
    if (t->comm->world_size > 1) {
        /* A signal reaches the ranks at different moments (or only one of them): stop when any
         * rank got one, all after the same update, so that no rank waits alone in the next
         * update's all-reduce. */
        double flag = signalled ? 1 : 0;
        LUNA_TRY(t->comm->all_reduce_sum_host(t->comm, &flag, 1));
        signalled = flag > 0;
    }
    bool max_update = o->max_update > 0 && u >= o->max_update;
    bool max_epoch = end_of_epoch && o->max_epoch > 0 && epoch >= (uint64_t)o->max_epoch;
    if (stepped && u % o->log_interval == 0) {
        luna_log_train(t, &t->interval, NULL);
        luna_meters_reset(&t->interval);
    }
    if (end_of_epoch) {
        t->last_epoch_loss = t->epoch_meters.ntokens > 0
                                 ? t->epoch_meters.loss / t->epoch_meters.ntokens / log(2.0)
                                 : NAN;
        luna_log_train(t, &t->epoch_meters, "end of epoch");
        luna_meters_reset(&t->epoch_meters);
    }
    bool at_valid_interval =
        stepped && o->validate_interval_updates > 0 && u % o->validate_interval_updates == 0;
    bool at_save_interval =
        stepped && o->save_interval_updates > 0 && u % o->save_interval_updates == 0;
    bool epoch_validate = end_of_epoch && epoch % (uint64_t)o->validate_interval == 0;
    bool epoch_save = end_of_epoch && epoch % (uint64_t)o->save_interval == 0;
    double best_before = t->best_loss;
    if (t->valid && !signalled && (at_valid_interval || epoch_validate || max_update || max_epoch))
        LUNA_TRY(validate(t));
    bool improved = t->best_loss < best_before;
    bool patience_out = o->patience > 0 && t->patience_counter >= o->patience && !improved;
    if (end_of_epoch) { /* a checkpoint written now continues with the next epoch */
        t->epoch = epoch + 1;
        t->offset = 0;
        LUNA_TRY(luna_batch_iterator_seek(t->it, t->epoch, 0));
    }
    bool stopping = signalled || max_update || max_epoch || patience_out;
    const char *names[4];
    char epoch_name[64], update_name[96];
    int count = 0;
    if (epoch_save && !o->no_epoch_checkpoints) {
        snprintf(epoch_name, sizeof epoch_name, "checkpoint%llu.safetensors",
                 (unsigned long long)epoch);
        names[count++] = epoch_name;
    }
    if (at_save_interval) {
        snprintf(update_name, sizeof update_name, "checkpoint_%llu_%lld.safetensors",
                 (unsigned long long)epoch, (long long)u);
        names[count++] = update_name;
    }
    if (improved) names[count++] = "checkpoint_best.safetensors";
    if (count > 0 || epoch_save || (stopping && t->last_saved_update != u))
        names[count++] = "checkpoint_last.safetensors";
    if (count > 0 && !o->no_save) /* rank 0 writes; a failure there stops every rank */
        LUNA_TRY(luna_communicator_agree(t->comm, luna_trainer_save(t, names, count),
                                         "saving a checkpoint"));
    if (patience_out)
        luna_log_message(t,
                         "early stop: the validation loss has not improved for %lld validations "
                         "(--patience %lld)",
                         (long long)t->patience_counter, (long long)o->patience);
    *reason = signalled ? STOP_SIGNAL : stopping ? STOP_DONE : GO_ON;
    return LUNA_OK;
}

luna_status luna_trainer_run(luna_trainer *t, volatile sig_atomic_t *stop) {
    const luna_train_options *o = t->o;
    if (o->max_update == 0) return LUNA_OK;
    t->lr = luna_lr_at(&o->lr_config, t->num_updates);
    t->run_start = luna_trainer_now();
    t->run_start_updates = t->num_updates;
    luna_meters_reset(&t->interval);
    luna_meters_reset(&t->epoch_meters);
    if ((o->max_update > 0 && t->num_updates >= o->max_update) ||
        (o->max_epoch > 0 && t->epoch > (uint64_t)o->max_epoch)) {
        luna_log_message(t, "nothing to do: already at update %lld, epoch %llu",
                         (long long)t->num_updates, (unsigned long long)t->epoch);
        return LUNA_OK;
    }
    LUNA_TRY(luna_batch_iterator_seek(t->it, t->epoch, t->offset));
    size_t epoch_length = luna_batch_iterator_epoch_length(t->it);
    stop_reason reason = GO_ON;
    while (reason == GO_ON) {
        int got;
        bool stepped;
        LUNA_TRY(train_update(t, &got, &stepped));
        bool end_of_epoch = t->offset >= epoch_length;
        if (got == 0 && !end_of_epoch) return luna_error(LUNA_ERR_INTERNAL, "iterator stalled");
        luna_progress_update(t);
        LUNA_TRY(after_update(t, stepped, end_of_epoch, stop, &reason));
    }
    luna_progress_clear(t);
    if (reason == STOP_SIGNAL)
        luna_log_message(t,
                         "interrupted: checkpoint_last saved at update %lld; run the same "
                         "command again to continue",
                         (long long)t->num_updates);
    else
        luna_log_message(t, "done training at update %lld, epoch %llu (%.0f s in updates)",
                         (long long)t->num_updates, (unsigned long long)t->epoch, t->train_wall);
    if (t->buckets)
        luna_log_message(t,
                         "gradient all-reduce: %d bucket(s), %d started before the backward pass "
                         "ended (last update); rank 0 waited %.2f s for all-reduces in all",
                         luna_grad_buckets_count(t->buckets),
                         luna_grad_buckets_started_early(t->buckets), t->comm->reduce_seconds);
    if (luna_seq2seq_uses_graphs(t->model) && !t->buckets) {
        int64_t replays, captures, failed;
        luna_seq2seq_graph_counts(t->model, &replays, &captures, &failed);
        luna_log_message(t,
                         "graphs: %lld training passes replayed (%lld batch shapes captured, %lld "
                         "captures failed; LUNA_STEP_GRAPHS=0 turns them off)",
                         (long long)replays / 2, (long long)captures / 2, (long long)failed);
    }
    return LUNA_OK;
}

/* ---- accessors ------------------------------------------------------------------------------- */

const luna_params *luna_trainer_params(const luna_trainer *t) { return t->model->params; }
int64_t luna_trainer_num_updates(const luna_trainer *t) { return t->num_updates; }
double luna_trainer_last_valid_loss(const luna_trainer *t) { return t->last_valid_loss; }
double luna_trainer_best_valid_loss(const luna_trainer *t) { return t->best_loss; }
double luna_trainer_last_epoch_loss(const luna_trainer *t) { return t->last_epoch_loss; }
int64_t luna_trainer_skipped_updates(const luna_trainer *t) { return t->skipped_updates; }
