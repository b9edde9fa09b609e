/* Document-level data: training pairs made of windows of consecutive sentences, joined
 * by a separator symbol, and the way back from a translated window to sentences.
 *
 * A window is s_1 <sep> s_2 <sep> ... s_k </s>: each sentence's own </s> except the last is
 * replaced by the separator's id, so a window of k sentences has exactly the tokens of its
 * sentences. Windows are built greedily in corpus order (documents such as Europarl sessions and
 * TED talks are stored in order): a pair joins the current window while both sides stay within
 * `max_tokens` (</s> included); a pair longer than that on its own is a window by itself. */
#ifndef LUNA_DATA_DOCUMENT_H
#define LUNA_DATA_DOCUMENT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* The separator's dictionary symbol (luna-preprocess --document-window adds it) and the text
 * that stands for it in luna-translate's input. */
#define LUNA_DOC_SEPARATOR "<sep>"

typedef struct {
    size_t sentences, windows;
    int64_t tokens[2]; /* source, target tokens written */
    int longest[2];    /* longest window per side */
} luna_window_stats;

/* Read the sentence-level pair <in_prefix[0]>, <in_prefix[1]> (.bin/.idx) and write the windows
 * to <out_prefix[0]>, <out_prefix[1]> with ids of `vocab_size` symbols (dtype chosen from it). */
luna_status luna_document_windows(const char *const in_prefix[2], const char *const out_prefix[2],
                                  int32_t sep, int max_tokens, size_t vocab_size,
                                  luna_window_stats *stats);

/* Segments of tokens t[0, n) separated by `sep`: segment j is t[start[j], start[j] + len[j]).
 * Returns the number of segments (≥ 1); start/len have room for n + 1 entries. */
int luna_document_segments(const int32_t *t, int n, int32_t sep, int *start, int *len);

#endif
