/* libFuzzer target: the safetensors reader (core/safetensors.c) with its metadata, as a
 * checkpoint is read: the header, every tensor's bounds and values, the __metadata__ strings,
 * the luna checkpoint checks, the configuration and the two dictionaries stored there. */
#include <stdint.h>
#include <string.h>

#include "core/safetensors.h"
#include "data/checkpoint_vocab.h"
#include "data/dictionary.h"
#include "model/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("x.safetensors", data, size);
    luna_safetensors *st = NULL;
    if (luna_safetensors_open(&st, path) != LUNA_OK) return 0;
    volatile uint8_t sink = 0;
    for (int i = 0; i < luna_safetensors_count(st); i++) {
        const luna_st_tensor *t = luna_safetensors_at(st, i);
        if (luna_safetensors_find(st, t->name) == NULL) __builtin_trap();
        if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        (void)luna_safetensors_check_finite(st, t);
        if (t->dtype >= 0)
            (void)luna_safetensors_expect(st, t->name, (luna_dtype)t->dtype, t->ndim, t->shape, NULL);
    }
    const char *keys[] = {"format", "config", "src_dict", "tgt_dict", "spm_model", "training_state"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *v = luna_safetensors_metadata(st, keys[k]);
        if (v) sink ^= (uint8_t)strlen(v);
    }
    (void)sink;
    luna_safetensors_close(st);
    if (luna_checkpoint_open(&st, path) != LUNA_OK) return 0;
    luna_checkpoint_meta m;
    if (luna_checkpoint_read_meta(st, &m) == LUNA_OK) {
        luna_dictionary *sd = NULL, *td = NULL;
        if (luna_checkpoint_read_dicts(st, m.config.vocab_size, &sd, &td) == LUNA_OK) {
            luna_dictionary_free(sd);
            luna_dictionary_free(td);
        }
        luna_checkpoint_meta_release(&m);
    }
    luna_safetensors_close(st);
    return 0;
}
