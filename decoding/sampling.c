#include "decoding/sampling.h"

#include <math.h>
#include <stdbool.h>

#include "core/beam_select.h"
#include "core/philox.h"

/* the beam_select op's bans (core/beam_select.h): the host's search bans the same tokens */
int luna_ngram_bans(const int32_t *tok, int len, int n, int32_t *ban) {
    return luna_beam_ngram_bans(tok, 1, len, n, ban);
}

void luna_drop_banned(float *lp, int32_t *tok, int k_in, int k_out, const int32_t *ban, int nban,
                      int32_t fill) {
    int w = 0;
    for (int j = 0; j < k_in && w < k_out; j++) {
        bool banned = false;
        for (int b = 0; b < nban && !banned; b++)
            banned = tok[j] == ban[b];
        if (banned) continue;
        lp[w] = lp[j]; /* w ≤ j: reads stay ahead of writes */
        tok[w++] = tok[j];
    }
    for (; w < k_out; w++)
        lp[w] = -INFINITY, tok[w] = fill;
}

/* "SAMP": the stream of sampling draws (dropout and initialisation use tensor ids) */
#define SAMPLING_STREAM 0x53414d50u

double luna_sampling_uniform(uint64_t seed, uint64_t sentence, uint64_t index) {
    const luna_rng_key key = {.seed = seed, .step = sentence, .stream_id = SAMPLING_STREAM};
    uint32_t w[4];
    luna_rng_block(key, index, w);
    /* 27 + 26 bits, as in the usual 53-bit double construction */
    return ((double)(w[0] >> 5) * 67108864.0 + (double)(w[1] >> 6)) * (1.0 / 9007199254740992.0);
}

int luna_sample_index(const float *lp, int k, double u) {
    if (k <= 0 || lp[0] == -INFINITY) return 0;
    /* weights relative to the best (lp[0]), summed in double in candidate order */
    double total = 0;
    for (int j = 0; j < k; j++)
        total += exp((double)lp[j] - (double)lp[0]);
    const double target = u * total;
    double acc = 0;
    int last = 0;
    for (int j = 0; j < k; j++) {
        if (lp[j] == -INFINITY) continue;
        acc += exp((double)lp[j] - (double)lp[0]);
        last = j;
        if (target < acc) return j;
    }
    return last; /* rounding: u·total at the very top */
}
