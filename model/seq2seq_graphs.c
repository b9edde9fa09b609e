/* Training passes replayed as graphs (model/seq2seq.h: luna_seq2seq_set_graphs).
 *
 * A pass's two graph segments are its layers and its backward; between them the loss runs
 * eagerly, and after them the loss sums (both sized by the batch's non-pad targets). Everything
 * else the launches depend on is the batch's shape and the buffers: the arena hands out the same
 * addresses from the same mark after prepare's uploads (the loss's row buffers are sized by the
 * shape, not by the count). The dropout step changes every pass: it is uploaded to graph_step and
 * the kernels read it there (luna_rng_key.step_at). A replay skips the layers' host code, so what
 * the loss needs from it (the decoder output, the log-sum-exp buffer, the arena mark after them)
 * is kept in the entry's data. */
#include <stdlib.h>
#include <string.h>

#include "model/seq2seq_internal.h"

/* Batch shapes seen in training: a few dozen between epochs' reshuffles, most of them often. */
#define PASS_GRAPHS 64

typedef struct {
    luna_act *dec_out;
    float *lse;
    luna_arena_mark logits_mark;
} layers_out;

luna_status luna_seq2seq_set_graphs(luna_seq2seq *m, bool on) {
    const char *env = getenv("LUNA_STEP_GRAPHS");
    if (env && !strcmp(env, "0")) on = false; /* the user's word stands */
    /* A Linformer encoder sizes its GEMMs by each source's length, read back during the pass. */
    if (!on || !luna_graphs_available(m->be) || !m->params->grad || m->config.linformer_k > 0) {
        luna_graph_cache_free(m->graphs);
        m->graphs = NULL;
        return LUNA_OK;
    }
    if (m->graphs) return LUNA_OK;
    if (!m->graph_step) {
        m->graph_step = luna_mem_alloc(m->be, sizeof *m->graph_step);
        if (!m->graph_step)
            return luna_error(LUNA_ERR_OUT_OF_MEMORY, "model: no %s memory for the dropout step",
                              m->be->name);
    }
    return luna_graph_cache_create(&m->graphs, m->be, PASS_GRAPHS, 2, sizeof(layers_out));
}

bool luna_seq2seq_uses_graphs(const luna_seq2seq *m) { return m->graphs != NULL; }

void luna_seq2seq_graph_counts(const luna_seq2seq *m, int64_t *replays, int64_t *captures,
                               int64_t *failed) {
    luna_graph_cache_counts(m->graphs, replays, captures, failed);
}

bool luna_seq2seq_pass_graphed(const luna_seq2seq *m, bool training, bool grads, bool dev_sums) {
    /* the gradient-readiness callback runs host work (an all-reduce) inside the backward */
    return m->graphs && training && grads && dev_sums && !m->grads_ready;
}

static luna_status run_layers(void *ctx) { return luna_seq2seq_pass_layers(ctx); }
static luna_status run_backward(void *ctx) { return luna_seq2seq_pass_backward(ctx); }

luna_status luna_seq2seq_pass_run_graphed(luna_seq2seq_pass *s) {
    luna_seq2seq *m = s->m;
    luna_backend *be = m->be;
    LUNA_TRY(luna_mem_from_host(be, m->graph_step, &s->ps.step, sizeof s->ps.step));
    s->ps.step_at = m->graph_step;
    luna_graph_key key;
    luna_graph_key_init(&key);
    const uint64_t shape[] = {(uint64_t)s->dims.B,
                              (uint64_t)s->dims.m,
                              (uint64_t)s->dims.n,
                              (uint64_t)s->dims.L,
                              (uint64_t)s->ps.training,
                              (uint64_t)s->grads,
                              m->seed};
    luna_graph_key_add_words(&key, shape, sizeof shape / sizeof shape[0]);
    const float p[] = {s->ps.dropout, s->ps.attention_dropout, s->ps.activation_dropout};
    luna_graph_key_add_f32s(&key, p, sizeof p / sizeof p[0]);
    const void *buffers[] = {m->params->data, m->params->grad, m->graph_step};
    luna_graph_key_add_ptrs(&key, buffers, sizeof buffers / sizeof buffers[0]);
    luna_graph_key_add_arena(&key, m->arena);
    luna_graph_key_add_backend(&key, be);

    luna_graph_call call;
    luna_graph_call_begin(&call, m->graphs, &key);
    layers_out *out = luna_graph_call_data(&call);
    LUNA_TRY(luna_graph_call_segment(&call, 0, m->arena, run_layers, s));
    if (luna_graph_call_replays(&call)) { /* the layers' host code did not run */
        s->dec_out = out->dec_out;
        s->lse = out->lse;
        s->logits_mark = out->logits_mark;
        luna_arena_release(m->arena, out->logits_mark);
    } else {
        *out = (layers_out){s->dec_out, s->lse, s->logits_mark};
    }
    LUNA_TRY(luna_seq2seq_loss(s));
    return luna_graph_call_segment(&call, 1, m->arena, run_backward, s);
}
