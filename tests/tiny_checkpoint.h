/* Tiny translation checkpoints for the API and Python tests: a character SentencePiece model
 * trained on a few English sentences, and luna_tiny with random weights (so translations are
 * arbitrary but deterministic), saved with their vocabulary as luna-train would. */
#ifndef LUNA_TESTS_TINY_CHECKPOINT_H
#define LUNA_TESTS_TINY_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

/* Train <dir>/spm.model (once per directory: later calls reuse it) and write <dir>/<name>:
 * luna_tiny initialised with `seed`; document: the dictionary also has <sep>; with_vocab false:
 * the parameters only, without dictionaries (a checkpoint luna cannot translate with).
 * Error paths leak: for tests only. */
luna_status luna_test_tiny_checkpoint(const char *dir, const char *name, uint64_t seed,
                                      bool document, bool with_vocab);

#endif
