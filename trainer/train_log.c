/* Meters, fairseq-like log lines (simple or JSON) and the terminal progress line. */
#include "trainer/trainer_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

void luna_meters_reset(luna_meters *m) {
    memset(m, 0, sizeof *m);
    m->start_time = luna_trainer_now();
}

void luna_meters_add(luna_meters *dst, const luna_meters *src) {
    dst->loss += src->loss;
    dst->nll += src->nll;
    dst->ntokens += src->ntokens;
    dst->nsentences += src->nsentences;
    dst->gnorm_sum += src->gnorm_sum;
    dst->updates += src->updates;
    dst->clipped += src->clipped;
    dst->train_seconds += src->train_seconds;
}

static bool is_json(const luna_trainer *t) { return strcmp(t->o->log_format, "json") == 0; }

/* Derived statistics of a span. */
typedef struct {
    double loss, nll, ppl, wps, ups, wpb, bsz, gnorm, clip;
} span_stats;

static span_stats stats_of(const luna_meters *m) {
    span_stats s;
    double elapsed = luna_trainer_now() - m->start_time;
    double upd = m->updates > 0 ? (double)m->updates : 1.0;
    s.loss = m->ntokens > 0 ? m->loss / m->ntokens / log(2.0) : NAN;
    s.nll = m->ntokens > 0 ? m->nll / m->ntokens / log(2.0) : NAN;
    s.ppl = pow(2.0, s.nll);
    s.wps = elapsed > 0 ? m->ntokens / elapsed : 0;
    s.ups = elapsed > 0 ? (double)m->updates / elapsed : 0;
    s.wpb = m->ntokens / upd;
    s.bsz = m->nsentences / upd;
    s.gnorm = m->gnorm_sum / upd;
    s.clip = 100.0 * (double)m->clipped / upd; /* % of updates clipped, as fairseq */
    return s;
}

static void emit_json(luna_trainer *t, luna_json_writer *w) {
    char *text = NULL;
    luna_json_end_object(w);
    if (luna_json_writer_finish(w, &text, NULL) == LUNA_OK) {
        luna_progress_clear(t);
        fprintf(t->log, "%s\n", text);
        fflush(t->log);
    }
    free(text);
}

static void kv(luna_json_writer *w, const char *key, double v) {
    luna_json_key(w, key);
    luna_json_double(w, v);
}

void luna_log_train(luna_trainer *t, const luna_meters *m, const char *tag) {
    if (t->comm->rank != 0 || m->updates == 0) return;
    span_stats s = stats_of(m);
    if (is_json(t)) {
        const char *p = tag ? "train_" : "";
        char key[64];
        luna_json_writer w;
        luna_json_writer_init(&w);
        luna_json_begin_object(&w);
        luna_json_key(&w, "epoch");
        luna_json_uint(&w, t->epoch);
        if (!tag) {
            size_t len = luna_batch_iterator_epoch_length(t->it);
            kv(&w, "update", (double)(t->epoch - 1) + (len ? (double)t->offset / (double)len : 0));
        }
#define KV(name, value) (snprintf(key, sizeof key, "%s" name, p), kv(&w, key, value))
        KV("loss", s.loss);
        KV("nll_loss", s.nll);
        KV("ppl", s.ppl);
        KV("wps", round(s.wps));
        KV("ups", s.ups);
        KV("wpb", round(s.wpb));
        KV("bsz", round(s.bsz));
        snprintf(key, sizeof key, "%snum_updates", p);
        luna_json_key(&w, key);
        luna_json_int(&w, t->num_updates);
        KV("lr", t->lr);
        KV("gnorm", s.gnorm);
        KV("clip", s.clip);
        KV("train_wall", round(t->train_wall));
        KV("wall", round(luna_trainer_now() - t->run_start));
#undef KV
        emit_json(t, &w);
        return;
    }
    luna_progress_clear(t);
    fprintf(t->log, "epoch %03llu | ", (unsigned long long)t->epoch);
    if (tag)
        fprintf(t->log, "%s | ", tag);
    else
        fprintf(t->log, "update %lld | ", (long long)t->num_updates);
    fprintf(t->log,
            "loss %.3f | nll_loss %.3f | ppl %.2f | wps %.0f | ups %.2f | wpb %.0f | bsz %.0f | ",
            s.loss, s.nll, s.ppl, s.wps, s.ups, s.wpb, s.bsz);
    if (tag) fprintf(t->log, "num_updates %lld | ", (long long)t->num_updates);
    fprintf(t->log, "lr %g | gnorm %.3f | clip %.0f | train_wall %.0f\n", t->lr, s.gnorm, s.clip,
            t->train_wall);
    fflush(t->log);
}

void luna_log_valid(luna_trainer *t, const luna_meters *m, double seconds) {
    if (t->comm->rank != 0) return;
    double loss = m->ntokens > 0 ? m->loss / m->ntokens / log(2.0) : NAN;
    double nll = m->ntokens > 0 ? m->nll / m->ntokens / log(2.0) : NAN;
    double wps = seconds > 0 ? m->ntokens / seconds : 0;
    if (is_json(t)) {
        luna_json_writer w;
        luna_json_writer_init(&w);
        luna_json_begin_object(&w);
        luna_json_key(&w, "epoch");
        luna_json_uint(&w, t->epoch);
        luna_json_key(&w, "valid_subset");
        luna_json_string(&w, t->o->valid_subset);
        kv(&w, "valid_loss", loss);
        kv(&w, "valid_nll_loss", nll);
        kv(&w, "valid_ppl", pow(2.0, nll));
        kv(&w, "valid_wps", round(wps));
        kv(&w, "valid_wpb", m->ntokens);
        kv(&w, "valid_bsz", m->nsentences);
        luna_json_key(&w, "valid_num_updates");
        luna_json_int(&w, t->num_updates);
        kv(&w, "valid_best_loss", t->best_loss);
        emit_json(t, &w);
        return;
    }
    luna_progress_clear(t);
    fprintf(t->log,
            "epoch %03llu | valid on '%s' subset | loss %.3f | nll_loss %.3f | ppl %.2f | wps %.0f "
            "| wpb %.0f | bsz %.0f | num_updates %lld | best_loss %.3f\n",
            (unsigned long long)t->epoch, t->o->valid_subset, loss, nll, pow(2.0, nll), wps,
            m->ntokens, m->nsentences, (long long)t->num_updates, t->best_loss);
    fflush(t->log);
}

void luna_log_message(luna_trainer *t, const char *fmt, ...) {
    if (t->comm->rank != 0) return;
    /* In JSON mode stdout carries only JSON objects; messages go to stderr. */
    FILE *f = is_json(t) ? stderr : t->log;
    luna_progress_clear(t);
    va_list ap;
    va_start(ap, fmt);
    fputs("| ", f);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    va_end(ap);
    fflush(f);
}

void luna_progress_update(luna_trainer *t) {
    if (!t->progress) return;
    double elapsed = luna_trainer_now() - t->run_start;
    int64_t done = t->num_updates - t->run_start_updates;
    double ups = elapsed > 0 ? (double)done / elapsed : 0;
    size_t len = luna_batch_iterator_epoch_length(t->it);
    double left = -1;
    const char *what = "epoch";
    if (t->o->max_update > 0 && ups > 0) {
        left = (double)(t->o->max_update - t->num_updates) / ups;
        what = "max-update";
    } else if (ups > 0 && len > 0) {
        double batches_per_update = (double)t->o->update_freq;
        left = (double)(len - t->offset) / batches_per_update / ups;
    }
    fprintf(stderr, "\r\033[Kepoch %03llu: %llu/%zu batches | update %lld | %.2f ups",
            (unsigned long long)t->epoch, (unsigned long long)t->offset, len,
            (long long)t->num_updates, ups);
    if (left >= 0) {
        long s = (long)left;
        fprintf(stderr, " | ETA (%s) %ld:%02ld:%02ld", what, s / 3600, s / 60 % 60, s % 60);
    }
    fflush(stderr);
}

void luna_progress_clear(luna_trainer *t) {
    if (!t->progress) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
}
