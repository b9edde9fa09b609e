/* libFuzzer target: the MMIDIDX index reader (data/indexed_dataset.c). The input is the .idx;
 * the .bin beside it is 4096 bytes of small token ids (the first input byte chooses how many of
 * them exist, so sizes and pointers are checked against several file sizes). Every sentence of
 * an index that opens is read, and the ids checked. */
#include <stdint.h>
#include <stdlib.h>

#include "data/indexed_dataset.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static uint8_t bin[4096];
    for (size_t i = 0; i < sizeof bin; i++)
        bin[i] = (uint8_t)(i % 7);
    size_t bin_size = size ? (size_t)data[0] * 16 : 0;
    fuzz_write("x.bin", bin, bin_size);
    fuzz_write("x.idx", data, size);
    luna_indexed_dataset *ds = NULL;
    if (luna_indexed_dataset_open(&ds, fuzz_path("x")) != LUNA_OK) return 0;
    const int32_t *sizes = luna_indexed_dataset_sizes(ds);
    int32_t *buf = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < luna_indexed_dataset_count(ds); i++) {
        size_t n = (size_t)sizes[i];
        if (n > cap) {
            cap = n;
            buf = realloc(buf, cap * sizeof *buf);
            if (!buf) abort();
        }
        luna_indexed_dataset_get(ds, i, buf);
    }
    (void)luna_indexed_dataset_check_ids(ds, 5, "fuzz");
    free(buf);
    luna_indexed_dataset_free(ds);
    return 0;
}
