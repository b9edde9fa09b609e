/* libFuzzer target: luna-serve's POST /translate body (tools/serve/request.c), the part of the
 * server that reads untrusted bytes. Any input must either give a request within the limits or
 * fail with a message; an accepted request is checked member by member. */
#include <stdint.h>
#include <string.h>

#include "tools/serve/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const serve_limits limits = {
        .max_sentences = 8,
        .max_sentence_bytes = 64,
        .max_beam_size = 16,
        .max_timeout_ms = 60000,
        .default_timeout_ms = 30000,
        .defaults = {
            .beam_size = 4, .length_penalty = 0.6, .max_length = 200, .num_hypotheses = 1}};
    serve_request r;
    char message[256];
    const serve_request_verdict v =
        serve_request_parse((const char *)data, size, &limits, &r, message, sizeof message);
    if (v != SERVE_REQUEST_OK) {
        if (message[0] == '\0' || r.sentences || r.count) __builtin_trap();
        return 0;
    }
    const serve_search *s = &r.search;
    if (r.count > limits.max_sentences || s->beam_size < 1 || s->beam_size > 16 ||
        s->num_hypotheses < 1 || s->num_hypotheses > s->beam_size || s->max_length < 1 ||
        s->max_length > 1022 || !(s->length_penalty >= -10 && s->length_penalty <= 10) ||
        r.timeout_ms < 1 || r.timeout_ms > limits.max_timeout_ms)
        __builtin_trap();
    size_t total = 0;
    for (size_t i = 0; i < r.count; i++) {
        if (strlen(r.sentences[i]) != r.lengths[i] || r.lengths[i] > limits.max_sentence_bytes)
            __builtin_trap();
        for (size_t k = 0; k < r.lengths[i]; k++)
            if ((unsigned char)r.sentences[i][k] < 0x20 && r.sentences[i][k] != '\t')
                __builtin_trap();
        total += r.lengths[i];
    }
    if (total != r.total_bytes) __builtin_trap();
    serve_request_release(&r);
    return 0;
}
