/* luna.h: the public C API of libluna (installed as include/luna.h; link with -lluna).
 *
 * Translate with a checkpoint written by luna-train or luna-average (it carries its SentencePiece
 * model and dictionaries), as luna-translate does, from a program that keeps the model loaded:
 *
 *   luna_translator *t;
 *   if (luna_translator_create(&t, "checkpoint_avg.safetensors", NULL) != LUNA_API_OK) {
 *       fprintf(stderr, "%s\n", luna_last_error());
 *       return 1;
 *   }
 *   const char *src[] = {"A man is riding a bike.", "Two dogs play in the snow."};
 *   luna_search_options o;
 *   luna_search_options_init(&o);            // luna-translate's defaults: beam 4, lenpen 0.6
 *   luna_translation *res;
 *   if (luna_translator_translate_batch(t, src, NULL, 2, &o, &res) == LUNA_API_OK) {
 *       printf("%s\n", res[0].hypotheses[0].text);
 *       luna_translations_free(res, 2);
 *   }
 *   luna_translator_free(t);
 *
 * The results are luna-translate's for the same checkpoint, options, threads and OpenBLAS
 * kernels: the same translations, and scores in its units (base 2, fairseq-generate's H-, P-
 * lines and its --score-reference averages). luna-translate sets OPENBLAS_CORETYPE for CPUs whose
 * default OpenBLAS kernels are slow, before OpenBLAS loads; a program using libluna can only do
 * that in its environment (luna_blas_core names the kernels in use).
 *
 * Errors: every function that can fail returns a luna_api_status; on failure the one-line message
 * (file, position, problem, what to do) is luna_last_error() on the calling thread. Nothing here
 * exits the process or writes to stdout/stderr.
 *
 * Threads: a translator may be shared by any number of threads. Each handle holds a mutex:
 * translate_batch and score_batch calls on one handle run one at a time (the others wait), each
 * using the handle's `threads` CPU threads; different handles run in parallel. To serve many
 * callers, batch their sentences into one call (one call batches by length internally), or give
 * each worker thread a handle of its own: luna_translator_clone makes one that shares the
 * model's weights on the CPU (an extra handle costs its decoder state, not another copy of the
 * model). luna_translator_free must not race with calls on the handle.
 *
 * Memory: results are allocated by the call and released with the matching _free function;
 * strings passed in are only read during the call.
 */
#ifndef LUNA_H
#define LUNA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define LUNA_API __attribute__((visibility("default")))
#else
#define LUNA_API
#endif

/* The library's version, "MAJOR.MINOR.PATCH" (the shared library's SONAME carries MAJOR). */
LUNA_API const char *luna_version(void);

typedef enum {
    LUNA_API_OK = 0,
    LUNA_API_ERR_INVALID_ARGUMENT, /* a bad option or argument (the message names it) */
    LUNA_API_ERR_OUT_OF_MEMORY,
    LUNA_API_ERR_IO,          /* a file could not be opened or read */
    LUNA_API_ERR_FORMAT,      /* malformed input: a checkpoint, or text that is not UTF-8 */
    LUNA_API_ERR_MISMATCH,    /* inputs disagree (e.g. sources and targets of different counts) */
    LUNA_API_ERR_NUMERIC,     /* non-finite values */
    LUNA_API_ERR_UNSUPPORTED, /* valid, but not in this build (e.g. --device cuda without CUDA) */
    LUNA_API_ERR_INTERNAL,
} luna_api_status;

/* The message of the last call that failed on this thread ("" if none); valid until the next
 * call into libluna on this thread. */
LUNA_API const char *luna_last_error(void);

/* The OpenBLAS kernel family in use (e.g. "Haswell"), to pass as OPENBLAS_CORETYPE to another
 * process (luna-translate) that should compute exactly the same numbers. */
LUNA_API const char *luna_blas_core(void);

/* ---- the translator ------------------------------------------------------------------------ */

typedef struct luna_translator luna_translator;

typedef struct {
    const char *device;    /* "cpu" (default) or "cuda" */
    int device_id;         /* the GPU of "cuda" (-1, default: the first) */
    int threads;           /* CPU threads, 1..1024 (default 2) */
    const char *precision; /* "auto" (default: fp32), "fp32" or "bf16" (cuda only) */
    int tf32;              /* cuda, fp32: GEMMs may use TF32 tensor cores (default 0) */
} luna_translator_options;

/* luna-translate's defaults (--device cpu --threads 2 --precision auto). */
LUNA_API void luna_translator_options_init(luna_translator_options *o);

/* Load `checkpoint`; opts NULL: the defaults. On failure *out is NULL. */
LUNA_API luna_api_status luna_translator_create(luna_translator **out, const char *checkpoint,
                                                const luna_translator_options *opts);
/* A new handle on t's checkpoint with t's options, for another thread: its own decoder state and
 * `threads`, translations equal to t's. On the CPU it shares t's weights (and their copies packed
 * for decoding), vocabulary and SentencePiece model, read only; on a GPU it loads the checkpoint
 * again. t and its clones may be freed in any order. On failure *out is NULL. */
LUNA_API luna_api_status luna_translator_clone(luna_translator **out, luna_translator *t);
/* From now on translate_batch splits each call's sentences over `workers` decoders of t's model
 * (1..1024; 1, the default: t alone), each on a thread of its own with t's `threads`: CTranslate2's
 * inter_threads within one call, the throughput configuration of a multi-core CPU (workers =
 * cores, threads 1). The translations are the same as with one worker (as between batch sizes,
 * the last bits of scores may differ); the extra workers are clones (luna_translator_clone: one
 * copy of the model). CPU only (LUNA_API_ERR_UNSUPPORTED on "cuda" for more than one).
 * score_batch and clones of t use one worker. */
LUNA_API luna_api_status luna_translator_set_workers(luna_translator *t, int workers);
/* NULL is ignored. */
LUNA_API void luna_translator_free(luna_translator *t);

/* Whether the checkpoint has a SentencePiece model (else raw text is split on spaces, as
 * pieces are). */
LUNA_API int luna_translator_has_spm(const luna_translator *t);

/* ---- searching ----------------------------------------------------------------------------- */

/* luna-translate's options of the same names (luna-translate --help). */
typedef struct {
    int beam;                 /* --beam: 1..1024 (default 4; 1 = greedy) */
    double lenpen;            /* --lenpen: score / len^lenpen (default 0.6) */
    double max_len_a;         /* --max-len-a (default 0) */
    int max_len_b;            /* --max-len-b: max length = a·source length + b (default 200) */
    int max_target_positions; /* --max-target-positions (default 1024) */
    int min_len;              /* --min-len (default 1) */
    int nbest;                /* --nbest: hypotheses per sentence, 1..beam (default 1) */
    double unkpen;            /* --unkpen (default 0) */
    int no_repeat_ngram_size; /* --no-repeat-ngram-size (default 0: off) */
    double temperature;       /* --temperature, > 0 (default 1) */
    int sampling;             /* --sampling: sample instead of searching (default 0) */
    int sampling_topk;        /* --sampling-topk (default -1: the whole vocabulary) */
    unsigned long long seed;  /* --seed of --sampling (default 1) */
    int max_input_tokens;     /* --max-input-tokens: longer sources are truncated (default 1024) */
    int max_tokens;           /* --max-tokens: padded source tokens per batch (6000; 0: no limit) */
    int batch_size;           /* --batch-size: sentences per batch (128; 0: no limit) */
    int pieces;               /* 0 (default): raw text in, detokenized text out; 1: sentences are
                                 space-separated SentencePiece pieces, and so are hypotheses */
} luna_search_options;

LUNA_API void luna_search_options_init(luna_search_options *o);

typedef struct {
    char *text;          /* detokenized (pieces: space-separated pieces); a document model's
                            sentences (input "s1 <sep> s2") are joined by '\n' */
    double score;        /* Σ log2 p / len^lenpen (luna-translate's H- score); -INFINITY for an
                            empty hypothesis (blank input) */
    float *token_scores; /* [num_tokens] log2 p of each token, </s> last (the P- line) */
    int num_tokens;      /* target tokens including </s>; 0 for an empty hypothesis */
} luna_hypothesis_result;

typedef struct {
    luna_hypothesis_result *hypotheses; /* best first */
    int num_hypotheses;                 /* nbest; 1 empty hypothesis for a blank sentence */
    int truncated;                      /* the source was cut to max_input_tokens */
} luna_translation;

/* Translate sentences[0..count) (UTF-8; lengths [count] in bytes, or NULL: NUL-terminated) with
 * options `o` (NULL: the defaults). *results [count] in input order, released with
 * luna_translations_free. On failure *results is NULL. */
LUNA_API luna_api_status luna_translator_translate_batch(luna_translator *t,
                                                         const char *const *sentences,
                                                         const size_t *lengths, size_t count,
                                                         const luna_search_options *o,
                                                         luna_translation **results);
LUNA_API void luna_translations_free(luna_translation *results, size_t count);

/* ---- scoring given translations ------------------------------------------------------------ */

typedef struct {
    double score;        /* average log2 p per token, </s> included (luna-translate
                            --score-reference); 0 when the source or the target is blank */
    float *token_scores; /* [num_tokens] log2 p of each target token, </s> last */
    int num_tokens;
} luna_score_result;

/* Score targets[i] as the translation of sources[i] (teacher forcing), i < count. lengths as in
 * translate_batch (either may be NULL). Of `o` (NULL: defaults) only pieces, max_input_tokens,
 * max_tokens and batch_size apply. *results [count], released with luna_score_results_free. */
LUNA_API luna_api_status luna_translator_score_batch(luna_translator *t, const char *const *sources,
                                                     const size_t *source_lengths,
                                                     const char *const *targets,
                                                     const size_t *target_lengths, size_t count,
                                                     const luna_search_options *o,
                                                     luna_score_result **results);
LUNA_API void luna_score_results_free(luna_score_result *results, size_t count);

#ifdef __cplusplus
}
#endif

#endif
