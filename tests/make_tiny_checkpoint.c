/* make_tiny_checkpoint DIR: write DIR/tiny.safetensors and DIR/doc.safetensors (a dictionary with
 * <sep>) and DIR/novocab.safetensors (no dictionaries) for tests outside C (tests/python/):
 * tests/tiny_checkpoint.h. */
#include <stdio.h>

#include "tests/tiny_checkpoint.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_tiny_checkpoint DIR\n");
        return 2;
    }
    if (luna_test_tiny_checkpoint(argv[1], "tiny.safetensors", 5, false, true) != LUNA_OK ||
        luna_test_tiny_checkpoint(argv[1], "doc.safetensors", 5, true, true) != LUNA_OK ||
        luna_test_tiny_checkpoint(argv[1], "novocab.safetensors", 5, false, false) != LUNA_OK) {
        fprintf(stderr, "make_tiny_checkpoint: %s\n", luna_error_message());
        return 1;
    }
    return 0;
}
