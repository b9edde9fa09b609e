/* Synthetic data-bins for tests, smoke runs and demonstrations: a fairseq data-bin (joined
 * dictionary, MMIDIDX train/valid splits) of a toy translation task over a small vocabulary of
 * symbols "w0", "w1", ...: the target is the source copied, or reversed.
 * Sentences have uniformly random lengths in [min_len, max_len] (plus </s>). */
#ifndef LUNA_TRAINER_SYNTHETIC_H
#define LUNA_TRAINER_SYNTHETIC_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

typedef struct {
    const char *source_lang, *target_lang; /* default "src", "tgt" */
    int num_symbols;                       /* real symbols besides the four specials (8) */
    int min_len, max_len;                  /* tokens before </s> (3, 8) */
    int num_train, num_valid;              /* sentence pairs (1000, 100) */
    bool reverse;                          /* target = reversed source (else a copy) */
    uint64_t seed;                         /* (1) */
} luna_synthetic_options;

void luna_synthetic_options_init(luna_synthetic_options *o);

/* Create `dir` if needed and write dict.<src>.txt, dict.<tgt>.txt and
 * {train,valid}.<src>-<tgt>.{src,tgt}.{bin,idx}. The dictionary size is num_symbols + 4. */
luna_status luna_synthetic_data_bin(const char *dir, const luna_synthetic_options *o);

#endif
