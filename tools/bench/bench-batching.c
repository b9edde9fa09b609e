/* Batching throughput on a real data-bin: open + validate, plan, then collate every batch of an
 * epoch into padded matrices (what the trainer does before each step).
 *
 *   bench-batching DATA-BIN [--split train] [--source-lang L --target-lang L] [--max-tokens 4096]
 *                  [--max-sentences N] [--epochs 1] [--seed 1] [--dump-batches FILE --dump-count N]
 *
 * Reports the time of each phase, batches/s and sentences/s of the epoch loop, and how much of
 * the padded batch area holds real tokens.
 *
 * --dump-batches FILE writes the first N (--dump-count, default 10) batches of epoch 1 exactly as
 * luna-train (same --max-tokens and --seed, one rank) takes them, collated, one JSON object per
 * line: {"src_tokens": [[..]], "src_lengths": [..], "prev_output_tokens": [[..]], "target": [[..]],
 * "ntokens": N} -- what tests/reference/train_reference.py trains on, so that the PyTorch oracle
 * and luna-train see the same batches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/batching.h"
#include "data/pair_dataset.h"

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void usage(void) {
    printf("usage: bench-batching DATA-BIN [--split train] [--source-lang L --target-lang L]\n"
           "                      [--max-tokens 4096] [--max-sentences N] [--epochs 1] [--seed 1]\n"
           "                      [--dump-batches FILE [--dump-count 10]]\n"
           "  iterate every batch of an epoch (collating padded token matrices) and report "
           "batches/s;\n"
           "  --dump-batches writes epoch 1's first batches (as luna-train takes them) as JSON "
           "lines\n");
}

static void write_matrix(FILE *f, const char *name, const int32_t *m, int32_t rows, int32_t cols) {
    fprintf(f, "\"%s\": [", name);
    for (int32_t r = 0; r < rows; r++) {
        fputs(r ? ", [" : "[", f);
        for (int32_t c = 0; c < cols; c++)
            fprintf(f, c ? ", %d" : "%d", m[(size_t)r * cols + c]);
        fputc(']', f);
    }
    fputc(']', f);
}

/* Epoch 1's first `count` batches, collated, as JSON lines (see the header comment). */
static luna_status dump_batches(const char *path, long count, luna_batch_iterator *it,
                                luna_data_batch *batch, const luna_pair_dataset *ds) {
    FILE *f = fopen(path, "w");
    if (!f) return luna_error(LUNA_ERR_IO, "%s: cannot open for writing", path);
    luna_status st = luna_batch_iterator_seek(it, 1, 0);
    const uint32_t *ids;
    size_t n;
    long written = 0;
    while (st == LUNA_OK && written < count && luna_batch_iterator_next(it, &ids, &n, NULL)) {
        st = luna_data_batch_fill(batch, ds, ids, n);
        if (st != LUNA_OK) break;
        const int32_t B = batch->batch_size;
        fputc('{', f);
        write_matrix(f, "src_tokens", batch->src_tokens, B, batch->src_len);
        fputs(", ", f);
        write_matrix(f, "src_lengths", batch->src_lengths, 1, B);
        fputs(", ", f);
        write_matrix(f, "prev_output_tokens", batch->prev_output_tokens, B, batch->tgt_len);
        fputs(", ", f);
        write_matrix(f, "target", batch->target, B, batch->tgt_len);
        fprintf(f, ", \"ntokens\": %lld}\n", (long long)batch->ntokens);
        written++;
    }
    if (fclose(f) != 0 && st == LUNA_OK) st = luna_error(LUNA_ERR_IO, "%s: write failed", path);
    if (st == LUNA_OK) printf("wrote %ld batches of epoch 1 to %s\n", written, path);
    return st;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *split = "train", *src = NULL, *tgt = NULL, *dump = NULL;
    long max_tokens = 4096, max_sentences = 0, epochs = 1, seed = 1, dump_count = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        }
        if (argv[i][0] != '-') {
            dir = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench-batching: %s needs a value (see --help)\n", argv[i]);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "--split"))
            split = v;
        else if (!strcmp(argv[i - 1], "--source-lang"))
            src = v;
        else if (!strcmp(argv[i - 1], "--target-lang"))
            tgt = v;
        else if (!strcmp(argv[i - 1], "--max-tokens"))
            max_tokens = atol(v);
        else if (!strcmp(argv[i - 1], "--max-sentences"))
            max_sentences = atol(v);
        else if (!strcmp(argv[i - 1], "--epochs"))
            epochs = atol(v);
        else if (!strcmp(argv[i - 1], "--seed"))
            seed = atol(v);
        else if (!strcmp(argv[i - 1], "--dump-batches"))
            dump = v;
        else if (!strcmp(argv[i - 1], "--dump-count"))
            dump_count = atol(v);
        else {
            fprintf(stderr, "bench-batching: unknown option %s (see --help)\n", argv[i - 1]);
            return 2;
        }
    }
    if (!dir || epochs < 1) {
        usage();
        return 2;
    }
    char *inferred_src = NULL, *inferred_tgt = NULL;
    luna_pair_dataset *ds = NULL;
    luna_batch_plan *plan = NULL;
    luna_batch_iterator *it = NULL;
    luna_data_batch *batch = NULL;
    luna_status st = LUNA_OK;
    if (!src || !tgt) {
        st = luna_data_infer_language_pair(dir, split, &inferred_src, &inferred_tgt);
        src = inferred_src;
        tgt = inferred_tgt;
    }
    double t0 = now_seconds();
    if (st == LUNA_OK) st = luna_pair_dataset_open(&ds, dir, split, src, tgt);
    double t1 = now_seconds();
    luna_batching_options o;
    luna_batching_options_init(&o);
    o.max_tokens = max_tokens;
    o.max_sentences = (int32_t)max_sentences;
    o.seed = (uint64_t)seed;
    if (st == LUNA_OK) st = luna_batch_plan_create(&plan, ds, &o);
    double t2 = now_seconds();
    if (st == LUNA_OK) st = luna_batch_iterator_create(&it, plan, &o);
    if (st == LUNA_OK) st = luna_data_batch_create(&batch);
    if (st != LUNA_OK) {
        fprintf(stderr, "bench-batching: %s\n", luna_error_message());
        return 1;
    }
    printf("data-bin %s, split %s, %s-%s: %zu sentence pairs\n", dir, split, src, tgt,
           luna_pair_dataset_count(ds));
    printf("open + validate: %.3f s; plan (sort, filter, %ld-token batches): %.3f s, %zu batches "
           "(%zu pairs filtered)\n",
           t1 - t0, max_tokens, t2 - t1, plan->num_batches,
           plan->num_filtered_positions + plan->num_filtered_tokens);
    if (dump) st = dump_batches(dump, dump_count, it, batch, ds);
    for (long e = 1; e <= epochs && st == LUNA_OK; e++) {
        st = luna_batch_iterator_seek(it, (uint64_t)e, 0);
        double start = now_seconds();
        size_t batches = 0, sentences = 0;
        int64_t real = 0, padded = 0, worst = 0;
        const uint32_t *ids;
        size_t n;
        while (st == LUNA_OK && luna_batch_iterator_next(it, &ids, &n, NULL)) {
            st = luna_data_batch_fill(batch, ds, ids, n);
            batches++;
            sentences += n;
            for (int32_t k = 0; k < batch->batch_size; k++)
                real += batch->src_lengths[k] + batch->tgt_lengths[k];
            int64_t area = (int64_t)batch->batch_size * (batch->src_len + batch->tgt_len);
            padded += area;
            int64_t longest = batch->src_len > batch->tgt_len ? batch->src_len : batch->tgt_len;
            if (batch->batch_size * longest > worst) worst = batch->batch_size * longest;
        }
        double secs = now_seconds() - start;
        if (st == LUNA_OK)
            printf("epoch %ld: %zu batches, %zu sentences in %.4f s: %.0f batches/s, %.0f "
                   "sentences/s; "
                   "real tokens %.1f%% of the padded area; largest batch %lld padded tokens\n",
                   e, batches, sentences, secs, (double)batches / secs, (double)sentences / secs,
                   padded ? 100.0 * (double)real / (double)padded : 0.0, (long long)worst);
    }
    if (st != LUNA_OK) fprintf(stderr, "bench-batching: %s\n", luna_error_message());
    luna_data_batch_free(batch);
    luna_batch_iterator_free(it);
    luna_batch_plan_free(plan);
    luna_pair_dataset_free(ds);
    free(inferred_src);
    free(inferred_tgt);
    return st == LUNA_OK ? 0 : 1;
}
