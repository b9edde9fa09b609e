/* The checkpoint policy of the trainer: --save-dir checks, the training state JSON, saving under
 * several names, retention, and resuming (see trainer.h). */
#include "trainer/trainer_internal.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file_util.h"
#include "core/json.h"
#include "data/checkpoint_vocab.h"
#include "model/checkpoint.h"
#include "model/quantize.h"

/* ---- --save-dir ------------------------------------------------------------------------------ */

luna_status luna_trainer_check_save_dir(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return luna_error(LUNA_ERR_INVALID_ARGUMENT, "--save-dir %s: path too long", dir);
    for (char *p = path + 1;; p++) { /* mkdir -p */
        bool last = *p == '\0';
        if (*p == '/' || last) {
            *p = '\0';
            if (mkdir(path, 0777) != 0 && errno != EEXIST)
                return luna_error(LUNA_ERR_IO, "--save-dir %s: cannot create %s: %s", dir, path,
                                  strerror(errno));
            if (!last) *p = '/';
        }
        if (last) break;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return luna_error(LUNA_ERR_IO, "--save-dir %s: not a directory", dir);
    snprintf(path, sizeof path, "%s/.luna-write-test-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, "ok", 2) != 2) {
        int err = errno;
        if (fd >= 0) close(fd), unlink(path);
        return luna_error(LUNA_ERR_IO,
                          "--save-dir %s: cannot write there: %s (choose a writable "
                          "directory)",
                          dir, strerror(err));
    }
    close(fd);
    unlink(path);
    return LUNA_OK;
}

char *luna_trainer_restore_path(const luna_trainer *t, bool *explicit_) {
    int count;
    const luna_option_spec *specs = luna_train_option_specs(&count);
    *explicit_ = false;
    for (int i = 0; i < count; i++)
        if (strcmp(specs[i].name, "--restore-file") == 0) *explicit_ = t->o->set[i];
    if (*explicit_) return strdup(t->o->restore_file);
    return luna_path_join(t->o->save_dir, t->o->restore_file);
}

/* ---- training state JSON --------------------------------------------------------------------- */

static void write_value(luna_json_writer *w, const luna_json *v) {
    switch (v->type) {
    case LUNA_JSON_NULL: luna_json_null(w); break;
    case LUNA_JSON_BOOL: luna_json_bool(w, v->boolean); break;
    case LUNA_JSON_STRING: luna_json_string(w, v->string); break;
    case LUNA_JSON_NUMBER:
        if (v->is_int && v->is_negative)
            luna_json_int(w, v->int_value);
        else if (v->is_int)
            luna_json_uint(w, v->uint_value);
        else
            luna_json_double(w, v->number);
        break;
    case LUNA_JSON_ARRAY:
        luna_json_begin_array(w);
        for (size_t i = 0; i < v->length; i++)
            write_value(w, &v->items[i]);
        luna_json_end_array(w);
        break;
    case LUNA_JSON_OBJECT:
        luna_json_begin_object(w);
        for (size_t i = 0; i < v->length; i++) {
            luna_json_key(w, v->keys[i]);
            write_value(w, &v->items[i]);
        }
        luna_json_end_object(w);
        break;
    }
}

/* Append the JSON text `text` as a value. */
static luna_status write_raw(luna_json_writer *w, const char *text) {
    luna_json *v;
    LUNA_TRY(luna_json_parse(&v, text, strlen(text), NULL));
    write_value(w, v);
    luna_json_free(v);
    return LUNA_OK;
}

static luna_status training_state_json(const luna_trainer *t, char **out) {
    const luna_train_options *o = t->o;
    const luna_lr_scheduler_config *l = &o->lr_config;
    char *opt_json = NULL, *args_json = NULL;
    LUNA_TRY(luna_optimizer_state_to_json(t->opt, &opt_json));
    luna_status s = luna_train_options_to_json(o, &args_json);
    luna_json_writer w;
    luna_json_writer_init(&w);
    luna_json_begin_object(&w);
    luna_json_key(&w, "num_updates");
    luna_json_int(&w, t->num_updates);
    luna_json_key(&w, "epoch");
    luna_json_uint(&w, t->epoch);
    luna_json_key(&w, "iterator_offset");
    luna_json_uint(&w, t->offset);
    luna_json_key(&w, "best_loss");
    if (isfinite(t->best_loss))
        luna_json_double(&w, t->best_loss);
    else
        luna_json_null(&w);
    luna_json_key(&w, "patience_counter");
    luna_json_int(&w, t->patience_counter);
    luna_json_key(&w, "skipped_updates");
    luna_json_int(&w, t->skipped_updates);
    luna_json_key(&w, "train_wall");
    luna_json_double(&w, t->train_wall);
    luna_json_key(&w, "seed");
    luna_json_int(&w, o->seed);
    luna_json_key(&w, "update_freq");
    luna_json_int(&w, o->update_freq);
    luna_json_key(&w, "world_size");
    luna_json_int(&w, t->comm->world_size);
    luna_json_key(&w, "lr");
    luna_json_double(&w, luna_lr_at(l, t->num_updates));
    luna_json_key(&w, "lr_scheduler");
    luna_json_begin_object(&w);
    luna_json_key(&w, "kind");
    luna_json_string(&w, luna_lr_scheduler_kind_name(l->kind));
    luna_json_key(&w, "lr");
    luna_json_double(&w, l->lr);
    luna_json_key(&w, "warmup_updates");
    luna_json_int(&w, l->warmup_updates);
    luna_json_key(&w, "warmup_init_lr");
    luna_json_double(&w, l->warmup_init_lr);
    luna_json_key(&w, "milestones");
    luna_json_begin_array(&w);
    for (int i = 0; i < l->num_milestones; i++)
        luna_json_int(&w, l->milestones[i]);
    luna_json_end_array(&w);
    luna_json_key(&w, "decay_rate");
    luna_json_double(&w, l->decay_rate);
    luna_json_end_object(&w);
    luna_json_key(&w, "optimizer");
    if (s == LUNA_OK) s = write_raw(&w, opt_json);
    luna_json_key(&w, "args");
    if (s == LUNA_OK) s = write_raw(&w, args_json);
    luna_json_key(&w, "luna_version");
    luna_json_string(&w, LUNA_VERSION);
    luna_json_end_object(&w);
    free(opt_json);
    free(args_json);
    if (s != LUNA_OK) {
        luna_json_writer_free(&w);
        return s;
    }
    return luna_json_writer_finish(&w, out, NULL);
}

/* ---- saving ---------------------------------------------------------------------------------- */

/* dst becomes another name of src (hard link, atomically replacing dst), else false. The link is
 * made under a unique temporary name (luna_temp_name): never one another writer could share. */
static bool link_into_place(const char *src, const char *dst) {
    char tmp[4200];
    int rc = -1;
    for (int attempt = 0; attempt < 100 && rc != 0; attempt++) {
        luna_temp_name(tmp, sizeof tmp, dst);
        rc = link(src, tmp);
        if (rc != 0 && errno != EEXIST) return false;
    }
    if (rc != 0) return false;
    if (rename(tmp, dst) != 0) {
        unlink(tmp);
        return false;
    }
    return true;
}

typedef struct {
    int64_t key;
    char name[256];
} numbered_file;

static int by_key_desc(const void *a, const void *b) {
    int64_t x = ((const numbered_file *)a)->key, y = ((const numbered_file *)b)->key;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Remove all but the `keep` newest checkpoint<E> (epochs) or checkpoint_<E>_<U> (updates). */
static void apply_retention(luna_trainer *t, bool epochs, int64_t keep) {
    if (keep < 0) return;
    DIR *d = opendir(t->o->save_dir);
    if (!d) return;
    numbered_file *files = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        unsigned long long ep = 0;
        long long up = 0;
        int end = -1;
        if (epochs)
            sscanf(e->d_name, "checkpoint%llu.safetensors%n", &ep, &end);
        else
            sscanf(e->d_name, "checkpoint_%llu_%lld.safetensors%n", &ep, &up, &end);
        if (end < 0 || e->d_name[end] != '\0' || strlen(e->d_name) >= sizeof files->name) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            numbered_file *f = realloc(files, cap * sizeof *f);
            if (!f) break;
            files = f;
        }
        files[n].key = epochs ? (int64_t)ep : (int64_t)up;
        snprintf(files[n].name, sizeof files[n].name, "%s", e->d_name);
        n++;
    }
    closedir(d);
    if (n > 1) qsort(files, n, sizeof *files, by_key_desc);
    for (size_t i = (size_t)keep; i < n; i++) {
        char *path = luna_path_join(t->o->save_dir, files[i].name);
        if (path && unlink(path) == 0) luna_log_message(t, "removed old checkpoint %s", path);
        free(path);
    }
    free(files);
}

luna_status luna_trainer_save(luna_trainer *t, const char *const *names, int count) {
    if (t->comm->rank != 0 || count == 0) {
        t->last_saved_update = t->num_updates;
        return LUNA_OK;
    }
    double t0 = luna_trainer_now();
    int ns = luna_optimizer_num_state_tensors(t->opt);
    luna_st_tensor *extra = calloc((size_t)(ns ? ns : 1), sizeof *extra);
    float **host = calloc((size_t)(ns ? ns : 1), sizeof *host);
    char *state = NULL, *first = NULL, *src_text = NULL, *tgt_text = NULL;
    size_t text_len;
    luna_status s = extra && host ? LUNA_OK : luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == LUNA_OK)
        s = luna_dictionary_to_text(luna_pair_dataset_src_dict(t->train), &src_text, &text_len);
    if (s == LUNA_OK)
        s = luna_dictionary_to_text(luna_pair_dataset_tgt_dict(t->train), &tgt_text, &text_len);
    for (int i = 0; i < ns && s == LUNA_OK; i++) {
        const char *name;
        luna_tensor view;
        s = luna_optimizer_state_tensor(t->opt, i, &name, &view);
        if (s != LUNA_OK) break;
        size_t bytes = luna_tensor_bytes(&view);
        host[i] = malloc(bytes ? bytes : 1);
        if (!host[i]) {
            s = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of host memory saving '%s'", name);
            break;
        }
        s = luna_mem_to_host(t->be, host[i], view.data, bytes);
        if (s != LUNA_OK) break;
        extra[i] = (luna_st_tensor){
            .name = name, .dtype = LUNA_F32, .ndim = view.ndim, .data = host[i], .nbytes = bytes};
        memcpy(extra[i].shape, view.shape, sizeof view.shape);
    }
    if (s == LUNA_OK) s = training_state_json(t, &state);
    /* Whether an earlier checkpoint stands under one of the names: the failure message says what
     * is left, and a first save that fails leaves nothing. */
    bool earlier = false;
    for (int i = 0; i < count && s == LUNA_OK && !earlier; i++) {
        char *path = luna_path_join(t->o->save_dir, names[i]);
        earlier = path && access(path, F_OK) == 0;
        free(path);
    }
    if (s == LUNA_OK) {
        first = luna_path_join(t->o->save_dir, names[0]);
        if (!first) s = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    luna_checkpoint_contents c = {.source_lang = t->src_lang,
                                  .target_lang = t->tgt_lang,
                                  .src_dict_text = src_text,
                                  .tgt_dict_text = tgt_text,
                                  .spm_model = t->spm_bytes,
                                  .spm_model_size = t->spm_size,
                                  .training_state = state,
                                  .extra_tensors = extra,
                                  .num_extra_tensors = ns};
    if (s == LUNA_OK) s = luna_checkpoint_save(first, t->model->params, &c);
    for (int i = 1; i < count && s == LUNA_OK; i++) {
        char *path = luna_path_join(t->o->save_dir, names[i]);
        if (!path)
            s = luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory");
        else if (!link_into_place(first, path))
            s = luna_checkpoint_save(path, t->model->params, &c);
        free(path);
    }
    if (s == LUNA_OK) s = luna_fsync_dir(t->o->save_dir);
    if (s == LUNA_OK) {
        t->last_saved_update = t->num_updates;
        char list[1024];
        size_t n = 0;
        for (int i = 0; i < count && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", names[i]);
        /* Right after an epoch end the iterator is at (next epoch, 0). */
        uint64_t epoch = t->offset == 0 && t->epoch > 1 ? t->epoch - 1 : t->epoch;
        luna_log_message(t, "saved %s in %s (epoch %llu @ %lld updates, best_loss %.3f; %.1f s)",
                         list, t->o->save_dir, (unsigned long long)epoch, (long long)t->num_updates,
                         t->best_loss, luna_trainer_now() - t0);
        apply_retention(t, false, t->o->keep_interval_updates);
        apply_retention(t, true, t->o->keep_last_epochs);
    } else {
        luna_error_prefix(earlier ? "saving a checkpoint failed (the checkpoints saved before are "
                                    "intact)"
                                  : "saving a checkpoint failed (none had been saved in this "
                                    "--save-dir yet: there is no checkpoint to resume from)");
    }
    for (int i = 0; i < ns && host; i++)
        free(host[i]);
    free(host);
    free(extra);
    free(state);
    free(first);
    free(src_text);
    free(tgt_text);
    return s;
}

/* ---- resuming -------------------------------------------------------------------------------- */

static luna_status check_architecture(const char *path, const luna_config *ck,
                                      const luna_config *want) {
    char a[32], b[32];
    const char *field = luna_config_architecture_difference(ck, want, a, b, sizeof a);
    if (!field) return LUNA_OK;
    return luna_error(LUNA_ERR_MISMATCH,
                      "%s: checkpoint of another architecture: %s is %s there but %s in the "
                      "options (give the checkpoint's architecture options, or use another "
                      "--save-dir)",
                      path, field, a, b);
}

static luna_status get_int(const char *path, const luna_json *obj, const char *key, int64_t *out) {
    const luna_json *v = luna_json_get(obj, key);
    if (!v || v->type != LUNA_JSON_NUMBER || !v->is_int)
        return luna_error(LUNA_ERR_FORMAT, "%s: training_state.%s is missing or not an integer",
                          path, key);
    *out = v->is_negative ? v->int_value : (int64_t)v->uint_value;
    return LUNA_OK;
}

static luna_status restore_optimizer(luna_trainer *t, const luna_safetensors *st,
                                     const luna_json *state) {
    const char *path = luna_safetensors_path(st);
    const luna_json *oj = luna_json_get(state, "optimizer");
    if (!oj || oj->type != LUNA_JSON_OBJECT)
        return luna_error(LUNA_ERR_FORMAT,
                          "%s: training_state has no optimizer state (resume with "
                          "--reset-optimizer)",
                          path);
    luna_json_writer w;
    luna_json_writer_init(&w);
    write_value(&w, oj);
    char *text;
    LUNA_TRY(luna_json_writer_finish(&w, &text, NULL));
    luna_status s = luna_optimizer_state_from_json(t->opt, text);
    free(text);
    if (s != LUNA_OK) {
        luna_error_prefix("%s", path);
        return s;
    }
    for (int i = 0; i < luna_optimizer_num_state_tensors(t->opt); i++) {
        const char *name;
        luna_tensor view;
        const luna_st_tensor *found;
        LUNA_TRY(luna_optimizer_state_tensor(t->opt, i, &name, &view));
        s = luna_safetensors_expect(st, name, LUNA_F32, view.ndim, view.shape, &found);
        if (s != LUNA_OK) {
            luna_error_prefix(
                "optimizer state (resume with --reset-optimizer to start a fresh one)");
            return s;
        }
        LUNA_TRY(luna_safetensors_check_finite(st, found));
        LUNA_TRY(luna_mem_from_host(t->be, view.data, found->data, luna_tensor_bytes(&view)));
    }
    return LUNA_OK;
}

static luna_status restore_from(luna_trainer *t, const luna_safetensors *st,
                                const luna_checkpoint_meta *meta) {
    const char *path = luna_safetensors_path(st);
    if (strcmp(meta->source_lang, t->src_lang) != 0 || strcmp(meta->target_lang, t->tgt_lang) != 0)
        return luna_error(LUNA_ERR_MISMATCH,
                          "%s: checkpoint is for %s-%s but the data-bin %s is %s-%s (use the "
                          "matching data-bin or another --save-dir)",
                          path, meta->source_lang, meta->target_lang, t->o->data_bin, t->src_lang,
                          t->tgt_lang);
    luna_dictionary *sd = NULL, *td = NULL;
    LUNA_TRY(luna_checkpoint_read_dicts(st, meta->config.vocab_size, &sd, &td));
    int32_t d1 = -1, d2 = -1;
    bool same = luna_dictionary_same_symbols(sd, luna_pair_dataset_src_dict(t->train), &d1) &&
                luna_dictionary_same_symbols(td, luna_pair_dataset_tgt_dict(t->train), &d2);
    luna_dictionary_free(sd);
    luna_dictionary_free(td);
    if (!same)
        return luna_error(LUNA_ERR_MISMATCH,
                          "%s: the checkpoint's dictionary differs from the data-bin %s's (first "
                          "at id %d): it was trained on other data (use another --save-dir)",
                          path, t->o->data_bin, (int)(d1 >= 0 ? d1 : d2));
    LUNA_TRY(check_architecture(path, &meta->config, &t->o->model));
    LUNA_TRY(luna_params_load(t->model->params, st));
    if (!meta->training_state) {
        luna_log_message(t, "loaded the parameters of %s (no training state: starting at update 0)",
                         path);
        return LUNA_OK;
    }
    luna_json *state;
    if (luna_json_parse(&state, meta->training_state, strlen(meta->training_state), NULL) !=
        LUNA_OK) {
        luna_error_prefix("%s: __metadata__.training_state", path);
        return LUNA_ERR_FORMAT;
    }
    int64_t nu = 0, ep = 1, off = 0, pc = 0, sk = 0;
    luna_status s = get_int(path, state, "num_updates", &nu);
    if (s == LUNA_OK) s = get_int(path, state, "epoch", &ep);
    if (s == LUNA_OK) s = get_int(path, state, "iterator_offset", &off);
    if (s == LUNA_OK) s = get_int(path, state, "patience_counter", &pc);
    if (s == LUNA_OK) s = get_int(path, state, "skipped_updates", &sk);
    const luna_json *best = luna_json_get(state, "best_loss");
    const luna_json *wall = luna_json_get(state, "train_wall");
    int64_t ws = 1; /* world_size: absent in checkpoints not written by luna-train */
    if (s == LUNA_OK && luna_json_get(state, "world_size"))
        s = get_int(path, state, "world_size", &ws);
    if (s == LUNA_OK && (nu < 0 || ep < 1 || off < 0 || ws < 1))
        s = luna_error(LUNA_ERR_FORMAT, "%s: training_state has invalid counters", path);
    int world = t->comm->world_size;
    if (s == LUNA_OK && !t->o->reset_dataloader && ws != world && off > 0) {
        /* The offset counts this rank's batches: with W ranks, offset k means that the epoch's
         * batches 0 .. k·W - 1 are done (rank r took r, r + W, ...). Another rank count continues
         * exactly where that is a whole number of its own steps. */
        uint64_t done = (uint64_t)off * (uint64_t)ws;
        if (done % (uint64_t)world != 0)
            s = luna_error(LUNA_ERR_MISMATCH,
                           "%s: written by %lld rank(s) %llu batches into epoch %lld, a point "
                           "%d rank(s) cannot continue from exactly (resume with %lld ranks, a "
                           "number of ranks dividing %llu, or --reset-dataloader)",
                           path, (long long)ws, (unsigned long long)done, (long long)ep, world,
                           (long long)ws, (unsigned long long)done);
        else
            off = (int64_t)(done / (uint64_t)world);
    }
    if (s == LUNA_OK) s = luna_trainer_check_resume_options(t, path, state);
    if (s == LUNA_OK && !t->o->reset_optimizer) s = restore_optimizer(t, st, state);
    if (s == LUNA_OK && !t->o->reset_dataloader) {
        s = luna_batch_iterator_seek(t->it, (uint64_t)ep, (uint64_t)off);
        if (s != LUNA_OK) luna_error_prefix("%s", path);
    }
    if (s == LUNA_OK) {
        t->num_updates = nu;
        if (!t->o->reset_dataloader) {
            t->epoch = (uint64_t)ep;
            t->offset = (uint64_t)off;
        }
        t->patience_counter = pc;
        t->skipped_updates = sk;
        t->best_loss = best && best->type == LUNA_JSON_NUMBER ? best->number : INFINITY;
        t->train_wall = wall && wall->type == LUNA_JSON_NUMBER ? wall->number : 0.0;
        t->last_saved_update = nu;
        luna_log_message(t, "loaded checkpoint %s (epoch %lld @ %lld updates)%s%s", path,
                         (long long)ep, (long long)nu,
                         t->o->reset_optimizer ? ", optimizer reset" : "",
                         t->o->reset_dataloader ? ", data loader reset" : "");
    }
    luna_json_free(state);
    return s;
}

luna_status luna_trainer_restore(luna_trainer *t, const char *path) {
    luna_safetensors *st;
    LUNA_TRY(luna_checkpoint_open(&st, path));
    luna_dtype weights = LUNA_F32;
    (void)luna_checkpoint_weight_dtype(st, &weights); /* checked by luna_checkpoint_open */
    if (weights == LUNA_I8) {
        luna_safetensors_close(st);
        return luna_error(LUNA_ERR_UNSUPPORTED,
                          "%s: an int8 checkpoint (luna-quantize) is for translation only; train "
                          "from the fp32 checkpoint it was made from",
                          path);
    }
    luna_checkpoint_meta meta;
    luna_status s = luna_checkpoint_read_meta(st, &meta);
    if (s == LUNA_OK) {
        s = restore_from(t, st, &meta);
        luna_checkpoint_meta_release(&meta);
    }
    luna_safetensors_close(st);
    return s;
}
