/* Translation on several workers: W text translators (decoding/text_translator.h; on the CPU
 * clones of one, sharing its model and held weights) with their own backends and decoder state
 * translate parts of one input at once, one host thread each. On a multi-core CPU this is the
 * throughput configuration (CTranslate2's inter_threads, Marian's CPU workers): each worker's
 * pool runs with no fork/join per op and no core idle while the host selects the next tokens,
 * at the cost of a decoder state per worker.
 *
 * The non-blank sentences, sorted by source length as luna_generate sorts them, are dealt round
 * robin, so each worker gets sentences of every length and all finish at about the same time.
 * A sentence's hypotheses do not depend on the other sentences of its pool, up to the last bits
 * of sums over its source padded to another length (luna_generate, as between batch sizes), and
 * its sampling draws are numbered by its place in the whole input
 * (luna_beam_options.sentence_ids): the translations are one translator's, whatever W. */
#ifndef LUNA_DECODING_TRANSLATE_WORKERS_H
#define LUNA_DECODING_TRANSLATE_WORKERS_H

#include "decoding/text_translator.h"

/* luna_text_translator_generate (same arguments and results) on workers t[0..workers): t[0] on
 * the calling thread, the others on threads of their own (a worker whose thread cannot start
 * runs on the calling thread, in turn). The translators must hold the same checkpoint and
 * settings. On failure every result is released and the error is the first failing worker's. */
luna_status luna_translate_workers_generate(luna_text_translator *const *t, int workers,
                                            const luna_beam_options *o,
                                            const luna_encoded_text *src, int max_tokens,
                                            int batch_size, luna_nbest *out, size_t *searched);

#endif
