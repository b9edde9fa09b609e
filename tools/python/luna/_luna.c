/* luna._luna: the CPython binding of libluna's C API (decoding/api/luna.h). The Python classes
 * (luna/__init__.py) wrap these functions:
 *
 *   create(path, device, device_id, threads, precision, tf32) -> capsule (the translator)
 *   clone(capsule) -> capsule (luna_translator_clone: on the CPU the same copy of the model)
 *   set_workers(capsule, workers) (luna_translator_set_workers)
 *   translate(capsule, sentences, **search options) -> [(hypotheses, truncated)], hypotheses a
 *       list of (text, score, token_scores)
 *   score(capsule, sources, targets, pieces, max_input_tokens, max_tokens, batch_size)
 *       -> [(score, token_scores)]
 *
 * Every call into libluna runs with the GIL released (PyEval_SaveThread); the sentences are first
 * copied into a tuple so that other threads cannot free the strings meanwhile. Failures raise
 * LunaError (or the subclass for the status: InvalidArgumentError and FormatError are also
 * ValueErrors, LunaIOError an OSError, MemoryError for out of memory) with libluna's message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>

#include "luna.h"

static PyObject *luna_error_base, *invalid_argument_error, *format_error, *io_error;

static const char CAPSULE[] = "luna.translator";

/* Raise the exception for a failed call (the message is this thread's, so fetch it before any
 * other libluna call). */
static PyObject *raise_status(luna_api_status st) {
    PyObject *type = luna_error_base;
    switch (st) {
    case LUNA_API_ERR_INVALID_ARGUMENT: type = invalid_argument_error; break;
    case LUNA_API_ERR_FORMAT: type = format_error; break;
    case LUNA_API_ERR_IO: type = io_error; break;
    case LUNA_API_ERR_OUT_OF_MEMORY: type = PyExc_MemoryError; break;
    default: break;
    }
    PyErr_SetString(type, luna_last_error());
    return NULL;
}

static void capsule_free(PyObject *capsule) {
    luna_translator *t = PyCapsule_GetPointer(capsule, CAPSULE);
    if (t) luna_translator_free(t);
}

static luna_translator *get_translator(PyObject *capsule) {
    return PyCapsule_GetPointer(capsule, CAPSULE);
}

static PyObject *py_create(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *names[] = {"path", "device", "device_id", "threads", "precision", "tf32", NULL};
    PyObject *path_obj;
    luna_translator_options o;
    luna_translator_options_init(&o);
    int tf32 = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|siisp", names, PyUnicode_FSConverter, &path_obj,
                                     &o.device, &o.device_id, &o.threads, &o.precision, &tf32))
        return NULL;
    o.tf32 = tf32;
    const char *path = PyBytes_AS_STRING(path_obj);
    luna_translator *t = NULL;
    luna_api_status st;
    PyThreadState *save = PyEval_SaveThread();
    st = luna_translator_create(&t, path, &o);
    PyEval_RestoreThread(save);
    Py_DECREF(path_obj);
    if (st != LUNA_API_OK) return raise_status(st);
    PyObject *capsule = PyCapsule_New(t, CAPSULE, capsule_free);
    if (!capsule) luna_translator_free(t);
    return capsule;
}

/* The strings of a sequence as a tuple (owning them) plus their UTF-8 bytes and lengths. */
typedef struct {
    PyObject *tuple;
    const char **text;
    size_t *len;
    Py_ssize_t n;
} texts;

static void texts_release(texts *t) {
    Py_XDECREF(t->tuple);
    free(t->text);
    free(t->len);
}

static int texts_from(PyObject *seq, const char *what, texts *t) {
    memset(t, 0, sizeof *t);
    if (PyUnicode_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of strings, not a string", what);
        return -1;
    }
    t->tuple = PySequence_Tuple(seq);
    if (!t->tuple) return -1;
    t->n = PyTuple_GET_SIZE(t->tuple);
    t->text = malloc(sizeof *t->text * (size_t)(t->n + 1));
    t->len = malloc(sizeof *t->len * (size_t)(t->n + 1));
    if (!t->text || !t->len) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < t->n; i++) {
        PyObject *s = PyTuple_GET_ITEM(t->tuple, i);
        Py_ssize_t k;
        if (!PyUnicode_Check(s)) {
            PyErr_Format(PyExc_TypeError, "%s[%zd] must be a string, not %.100s", what, i,
                         Py_TYPE(s)->tp_name);
            return -1;
        }
        t->text[i] = PyUnicode_AsUTF8AndSize(s, &k);
        if (!t->text[i]) return -1;
        t->len[i] = (size_t)k;
    }
    return 0;
}

static PyObject *float_list(const float *x, int n) {
    PyObject *l = PyList_New(n);
    for (int i = 0; l && i < n; i++) {
        PyObject *v = PyFloat_FromDouble(x[i]);
        if (!v) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

static PyObject *translation_object(const luna_translation *r) {
    PyObject *hyps = PyList_New(r->num_hypotheses);
    for (int k = 0; hyps && k < r->num_hypotheses; k++) {
        const luna_hypothesis_result *h = &r->hypotheses[k];
        PyObject *scores = float_list(h->token_scores, h->num_tokens);
        PyObject *item = scores ? Py_BuildValue("(sdN)", h->text, h->score, scores) : NULL;
        if (!item) {
            Py_DECREF(hyps);
            return NULL;
        }
        PyList_SET_ITEM(hyps, k, item);
    }
    return hyps ? Py_BuildValue("(NO)", hyps, r->truncated ? Py_True : Py_False) : NULL;
}

static PyObject *py_translate(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *names[] = {
        "translator",       "sentences",  "pieces",        "beam",
        "lenpen",           "max_len_a",  "max_len_b",     "max_target_positions",
        "min_len",          "nbest",      "unkpen",        "no_repeat_ngram_size",
        "temperature",      "sampling",   "sampling_topk", "seed",
        "max_input_tokens", "max_tokens", "batch_size",    NULL};
    PyObject *capsule, *seq;
    luna_search_options o;
    luna_search_options_init(&o);
    int pieces = 0, sampling = 0;
    long long seed = (long long)o.seed;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "OO|$piddiiiididpiLiii", names, &capsule, &seq, &pieces, &o.beam, &o.lenpen,
            &o.max_len_a, &o.max_len_b, &o.max_target_positions, &o.min_len, &o.nbest, &o.unkpen,
            &o.no_repeat_ngram_size, &o.temperature, &sampling, &o.sampling_topk, &seed,
            &o.max_input_tokens, &o.max_tokens, &o.batch_size))
        return NULL;
    luna_translator *t = get_translator(capsule);
    if (!t) return NULL;
    if (seed < 0) {
        PyErr_Format(invalid_argument_error, "seed must not be negative (got %lld)", seed);
        return NULL;
    }
    o.pieces = pieces;
    o.sampling = sampling;
    o.seed = (unsigned long long)seed;
    texts in;
    if (texts_from(seq, "source", &in) != 0) {
        texts_release(&in);
        return NULL;
    }
    luna_translation *r = NULL;
    luna_api_status st;
    PyThreadState *save = PyEval_SaveThread();
    st = luna_translator_translate_batch(t, in.text, in.len, (size_t)in.n, &o, &r);
    PyEval_RestoreThread(save);
    PyObject *out = NULL;
    if (st != LUNA_API_OK) {
        raise_status(st);
    } else if ((out = PyList_New(in.n))) {
        for (Py_ssize_t i = 0; i < in.n; i++) {
            PyObject *item = translation_object(&r[i]);
            if (!item) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, i, item);
        }
    }
    luna_translations_free(r, (size_t)in.n);
    texts_release(&in);
    return out;
}

static PyObject *py_score(PyObject *self, PyObject *args, PyObject *kw) {
    (void)self;
    static char *names[] = {"translator",       "sources",    "targets",    "pieces",
                            "max_input_tokens", "max_tokens", "batch_size", NULL};
    PyObject *capsule, *src_seq, *tgt_seq;
    luna_search_options o;
    luna_search_options_init(&o);
    int pieces = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|$piii", names, &capsule, &src_seq, &tgt_seq,
                                     &pieces, &o.max_input_tokens, &o.max_tokens, &o.batch_size))
        return NULL;
    luna_translator *t = get_translator(capsule);
    if (!t) return NULL;
    o.pieces = pieces;
    texts src, tgt;
    memset(&tgt, 0, sizeof tgt);
    if (texts_from(src_seq, "source", &src) != 0 || texts_from(tgt_seq, "target", &tgt) != 0) {
        texts_release(&src);
        texts_release(&tgt);
        return NULL;
    }
    if (src.n != tgt.n) {
        PyErr_Format(invalid_argument_error, "%zd targets for %zd sources", tgt.n, src.n);
        texts_release(&src);
        texts_release(&tgt);
        return NULL;
    }
    luna_score_result *r = NULL;
    luna_api_status st;
    PyThreadState *save = PyEval_SaveThread();
    st =
        luna_translator_score_batch(t, src.text, src.len, tgt.text, tgt.len, (size_t)src.n, &o, &r);
    PyEval_RestoreThread(save);
    PyObject *out = NULL;
    if (st != LUNA_API_OK) {
        raise_status(st);
    } else if ((out = PyList_New(src.n))) {
        for (Py_ssize_t i = 0; i < src.n; i++) {
            PyObject *scores = float_list(r[i].token_scores, r[i].num_tokens);
            PyObject *item = scores ? Py_BuildValue("(dN)", r[i].score, scores) : NULL;
            if (!item) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, i, item);
        }
    }
    luna_score_results_free(r, (size_t)src.n);
    texts_release(&src);
    texts_release(&tgt);
    return out;
}

static PyObject *py_clone(PyObject *self, PyObject *capsule) {
    (void)self;
    luna_translator *t = get_translator(capsule);
    if (!t) return NULL;
    luna_translator *c = NULL;
    PyThreadState *save = PyEval_SaveThread(); /* waits for a call running on t */
    const luna_api_status st = luna_translator_clone(&c, t);
    PyEval_RestoreThread(save);
    if (st != LUNA_API_OK) return raise_status(st);
    PyObject *clone = PyCapsule_New(c, CAPSULE, capsule_free);
    if (!clone) luna_translator_free(c);
    return clone;
}

static PyObject *py_set_workers(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule;
    int workers;
    if (!PyArg_ParseTuple(args, "Oi", &capsule, &workers)) return NULL;
    luna_translator *t = get_translator(capsule);
    if (!t) return NULL;
    PyThreadState *save = PyEval_SaveThread();
    const luna_api_status st = luna_translator_set_workers(t, workers);
    PyEval_RestoreThread(save);
    if (st != LUNA_API_OK) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *py_has_spm(PyObject *self, PyObject *capsule) {
    (void)self;
    luna_translator *t = get_translator(capsule);
    if (!t) return NULL;
    return PyBool_FromLong(luna_translator_has_spm(t));
}

static PyObject *py_blas_core(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(luna_blas_core());
}

static PyMethodDef methods[] = {
    {"create", (PyCFunction)(void (*)(void))py_create, METH_VARARGS | METH_KEYWORDS,
     "create(path, device='cpu', device_id=-1, threads=2, precision='auto', tf32=False)"},
    {"translate", (PyCFunction)(void (*)(void))py_translate, METH_VARARGS | METH_KEYWORDS,
     "translate(translator, sentences, **luna_search_options)"},
    {"score", (PyCFunction)(void (*)(void))py_score, METH_VARARGS | METH_KEYWORDS,
     "score(translator, sources, targets, pieces=False, max_input_tokens=1024, ...)"},
    {"clone", py_clone, METH_O, "another translator of the same model (shared on the CPU)"},
    {"set_workers", py_set_workers, METH_VARARGS, "translate each call on that many workers"},
    {"has_spm", py_has_spm, METH_O, "whether the checkpoint has a SentencePiece model"},
    {"blas_core", py_blas_core, METH_NOARGS, "the OpenBLAS kernel family in use"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "luna._luna",
                                    "libluna's C API (use the luna package)", -1, methods};

PyMODINIT_FUNC PyInit__luna(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    luna_error_base = PyErr_NewExceptionWithDoc("luna.LunaError", "an error reported by libluna",
                                                PyExc_RuntimeError, NULL);
    PyObject *b1 = Py_BuildValue("(OO)", luna_error_base, PyExc_ValueError);
    PyObject *b2 = Py_BuildValue("(OO)", luna_error_base, PyExc_OSError);
    invalid_argument_error = b1 ? PyErr_NewExceptionWithDoc("luna.InvalidArgumentError",
                                                            "a bad option or argument", b1, NULL)
                                : NULL;
    format_error = b1 ? PyErr_NewExceptionWithDoc("luna.FormatError",
                                                  "malformed input (a checkpoint, text)", b1, NULL)
                      : NULL;
    io_error = b2 ? PyErr_NewExceptionWithDoc("luna.LunaIOError",
                                              "a file could not be opened or read", b2, NULL)
                  : NULL;
    Py_XDECREF(b1);
    Py_XDECREF(b2);
    if (!luna_error_base || !invalid_argument_error || !format_error || !io_error ||
        PyModule_AddObjectRef(m, "LunaError", luna_error_base) < 0 ||
        PyModule_AddObjectRef(m, "InvalidArgumentError", invalid_argument_error) < 0 ||
        PyModule_AddObjectRef(m, "FormatError", format_error) < 0 ||
        PyModule_AddObjectRef(m, "LunaIOError", io_error) < 0 ||
        PyModule_AddStringConstant(m, "version", luna_version()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
