// C interface over SentencePiece: see data/sentencepiece.h.
//
// Rules for this file: no exception may cross the extern "C" boundary (each entry point has a
// catch-all), and every util::Status that is not OK becomes a luna_error message.

#include "data/sentencepiece.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

extern "C" {
#include "core/file_util.h"
}

struct luna_spm {
    sentencepiece::SentencePieceProcessor processor;
    std::string serialized; // the exact bytes of the model file (checkpoints embed them)
    std::string name;
};

namespace {

luna_status from_spm(const sentencepiece::util::Status &s, const char *what, const char *name) {
    return luna_error(LUNA_ERR_INVALID_ARGUMENT, "%s: SentencePiece %s failed: %s", name, what,
                      s.ToString().c_str());
}

luna_status from_exception(const char *what, const char *name) {
    try {
        throw;
    } catch (const std::bad_alloc &) {
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory during SentencePiece %s", name,
                          what);
    } catch (const std::exception &e) {
        return luna_error(LUNA_ERR_INTERNAL, "%s: SentencePiece %s raised: %s", name, what,
                          e.what());
    } catch (...) {
        return luna_error(LUNA_ERR_INTERNAL, "%s: SentencePiece %s raised an unknown exception",
                          name, what);
    }
}

// Feeds the trainer from mapped files (so file names may contain commas, which SentencePiece's
// comma-separated --input cannot express) or from the caller's callback.
class LineIterator : public sentencepiece::SentenceIterator {
  public:
    explicit LineIterator(const luna_spm_train_options *opts) : opts_(opts) { Next(); }
    ~LineIterator() override { luna_mapped_file_close(&map_); }

    bool done() const override { return done_; }
    const std::string &value() const override { return value_; }
    sentencepiece::util::Status status() const override { return status_; }

    void Next() override {
        if (done_) return;
        if (!opts_->input_files) {
            const char *line = nullptr;
            size_t len = 0;
            int rc = opts_->next(opts_->next_ctx, &line, &len);
            if (rc > 0) {
                value_.assign(line, len);
            } else {
                done_ = true;
                if (rc < 0) fail(luna_error_message());
            }
            return;
        }
        while (pos_ >= map_.size) {
            if (!open_next_file()) return;
        }
        const char *base = reinterpret_cast<const char *>(map_.data);
        const char *start = base + pos_;
        const void *nl = memchr(start, '\n', map_.size - pos_);
        size_t len =
            nl ? static_cast<size_t>(static_cast<const char *>(nl) - start) : map_.size - pos_;
        value_.assign(start, len);
        pos_ += len + 1;
    }

  private:
    bool open_next_file() {
        luna_mapped_file_close(&map_);
        pos_ = 0;
        if (file_ >= opts_->n_input_files) {
            done_ = true;
            return false;
        }
        if (luna_mapped_file_open(&map_, opts_->input_files[file_++]) != LUNA_OK) {
            done_ = true;
            fail(luna_error_message());
            return false;
        }
        return true;
    }
    void fail(const char *message) {
        status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound, message);
    }

    const luna_spm_train_options *opts_;
    luna_mapped_file map_ = {nullptr, 0};
    size_t file_ = 0, pos_ = 0;
    bool done_ = false;
    std::string value_;
    sentencepiece::util::Status status_;
};

luna_status write_vocab(const sentencepiece::SentencePieceProcessor &p, const char *path) {
    std::string text;
    char score[64];
    for (int i = 0; i < p.GetPieceSize(); i++) {
        // SentencePiece writes `os << piece << "\t" << score`; iostream's default float format is
        // %g with 6 significant digits, which snprintf reproduces.
        snprintf(score, sizeof score, "%g", static_cast<double>(p.GetScore(i)));
        text += p.IdToPiece(i);
        text += '\t';
        text += score;
        text += '\n';
    }
    return luna_write_file_atomic(path, text.data(), text.size());
}

} // namespace

extern "C" {

void luna_spm_train_options_init(luna_spm_train_options *opts) {
    memset(opts, 0, sizeof *opts);
    opts->vocab_size = 32000;
    opts->character_coverage = 1.0;
    opts->num_threads = 1;
    opts->model_type = "bpe";
}

luna_status luna_spm_train(const luna_spm_train_options *opts) {
    const char *prefix = opts->model_prefix ? opts->model_prefix : "(no model prefix)";
    if (!opts->model_prefix || (!opts->input_files && !opts->next) || opts->vocab_size <= 0 ||
        opts->num_threads <= 0 ||
        !(opts->character_coverage > 0.0 && opts->character_coverage <= 1.0))
        return luna_error(
            LUNA_ERR_INVALID_ARGUMENT,
            "%s: invalid SentencePiece training options (need a model prefix, inputs, "
            "vocab_size > 0, threads > 0, 0 < character_coverage <= 1)",
            prefix);
    try {
        std::unordered_map<std::string, std::string> kw;
        kw["model_type"] = opts->model_type ? opts->model_type : "bpe";
        kw["vocab_size"] = std::to_string(opts->vocab_size);
        char cov[64];
        snprintf(cov, sizeof cov, "%.17g", opts->character_coverage);
        kw["character_coverage"] = cov;
        kw["num_threads"] = std::to_string(opts->num_threads);
        kw["input_sentence_size"] = std::to_string(opts->input_sentence_size);
        kw["shuffle_input_sentence"] = "true";
        kw["max_sentence_length"] =
            std::to_string(opts->max_sentence_length ? opts->max_sentence_length : 4192);
        kw["minloglevel"] = "2"; // errors only: training otherwise prints pages of progress
        LineIterator lines(opts);
        std::string model;
        // With an output string (and no model_prefix, which the trainer requires to be exclusive)
        // the trainer returns the model instead of writing files, so they are written atomically
        // here.
        auto s = sentencepiece::SentencePieceTrainer::Train(kw, &lines, &model);
        if (!lines.status().ok()) return luna_error(LUNA_ERR_IO, "%s", lines.status().message());
        if (!s.ok()) {
            return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                              "%s.model: SentencePiece training failed: %s (check --bpe-vocab-size "
                              "against the amount of training text)",
                              opts->model_prefix, s.ToString().c_str());
        }
        sentencepiece::SentencePieceProcessor p;
        s = p.LoadFromSerializedProto(model);
        if (!s.ok()) return from_spm(s, "loading the trained model", prefix);
        std::string model_path = std::string(opts->model_prefix) + ".model";
        std::string vocab_path = std::string(opts->model_prefix) + ".vocab";
        LUNA_TRY(luna_write_file_atomic(model_path.c_str(), model.data(), model.size()));
        return write_vocab(p, vocab_path.c_str());
    } catch (...) {
        return from_exception("training", prefix);
    }
}

luna_status luna_spm_load_from_memory(luna_spm **out, const void *data, size_t size,
                                      const char *name) {
    *out = nullptr;
    if (!name) name = "(SentencePiece model)";
    try {
        auto spm = std::make_unique<luna_spm>();
        spm->serialized.assign(static_cast<const char *>(data), size);
        spm->name = name;
        auto s = spm->processor.LoadFromSerializedProto(spm->serialized);
        if (!s.ok())
            return luna_error(LUNA_ERR_FORMAT,
                              "%s: not a valid SentencePiece model: %s (give the "
                              "spm.model written by luna-preprocess or spm_train)",
                              name, s.ToString().c_str());
        *out = spm.release();
        return LUNA_OK;
    } catch (...) {
        return from_exception("loading", name);
    }
}

luna_status luna_spm_load(luna_spm **out, const char *model_path) {
    *out = nullptr;
    char *data;
    size_t size;
    LUNA_TRY(luna_read_file(model_path, &data, &size));
    luna_status st = luna_spm_load_from_memory(out, data, size, model_path);
    free(data);
    return st;
}

void luna_spm_free(luna_spm *spm) { delete spm; }

luna_status luna_spm_serialized(const luna_spm *spm, const void **data, size_t *size) {
    *data = spm->serialized.data();
    *size = spm->serialized.size();
    return LUNA_OK;
}

int32_t luna_spm_vocab_size(const luna_spm *spm) { return spm->processor.GetPieceSize(); }

int32_t luna_spm_unk_id(const luna_spm *spm) { return spm->processor.unk_id(); }

int32_t luna_spm_piece_to_id(const luna_spm *spm, const char *piece, size_t len) {
    try {
        return spm->processor.PieceToId(absl::string_view(piece, len));
    } catch (...) {
        return spm->processor.unk_id();
    }
}

const char *luna_spm_id_to_piece(const luna_spm *spm, int32_t id) {
    if (id < 0 || id >= spm->processor.GetPieceSize()) return nullptr;
    return spm->processor.IdToPiece(id).c_str();
}

void luna_spm_pieces_init(luna_spm_pieces *p) { memset(p, 0, sizeof *p); }

void luna_spm_pieces_release(luna_spm_pieces *p) {
    free(p->pieces);
    free(p->ids);
    free(p->storage_);
    memset(p, 0, sizeof *p);
}

luna_status luna_spm_encode_pieces(const luna_spm *spm, const char *text, size_t len,
                                   luna_spm_pieces *out) {
    out->count = 0;
    try {
        auto spt = spm->processor.EncodeAsImmutableProto(absl::string_view(text, len));
        size_t n = spt.pieces_size(), bytes = 0;
        for (size_t i = 0; i < n; i++)
            bytes += spt.pieces(static_cast<int>(i)).piece().size() + 1;
        if (n > out->capacity_) {
            char **pieces = static_cast<char **>(realloc(out->pieces, n * sizeof(char *)));
            if (pieces) out->pieces = pieces;
            int32_t *ids = static_cast<int32_t *>(realloc(out->ids, n * sizeof(int32_t)));
            if (ids) out->ids = ids;
            if (!pieces || !ids)
                return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory encoding",
                                  spm->name.c_str());
            out->capacity_ = n;
        }
        if (bytes > out->storage_capacity_) {
            char *storage = static_cast<char *>(realloc(out->storage_, bytes));
            if (!storage)
                return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory encoding",
                                  spm->name.c_str());
            out->storage_ = storage;
            out->storage_capacity_ = bytes;
        }
        char *w = out->storage_;
        for (size_t i = 0; i < n; i++) {
            auto sp = spt.pieces(static_cast<int>(i));
            // For unknown text the piece is the (normalized) text itself with the unknown id,
            // exactly what spm_encode --output_format=piece prints.
            const std::string &piece = sp.piece();
            memcpy(w, piece.data(), piece.size());
            w[piece.size()] = '\0';
            out->pieces[i] = w;
            out->ids[i] = static_cast<int32_t>(sp.id());
            w += piece.size() + 1;
        }
        out->count = n;
        return LUNA_OK;
    } catch (...) {
        return from_exception("encoding", spm->name.c_str());
    }
}

luna_status luna_spm_encode_ids(const luna_spm *spm, const char *text, size_t len, int32_t **ids,
                                size_t *n) {
    *ids = nullptr;
    *n = 0;
    try {
        std::vector<int> v;
        auto s = spm->processor.Encode(absl::string_view(text, len), &v);
        if (!s.ok()) return from_spm(s, "encoding", spm->name.c_str());
        int32_t *a = static_cast<int32_t *>(malloc((v.size() ? v.size() : 1) * sizeof(int32_t)));
        if (!a)
            return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory encoding",
                              spm->name.c_str());
        for (size_t i = 0; i < v.size(); i++)
            a[i] = v[i];
        *ids = a;
        *n = v.size();
        return LUNA_OK;
    } catch (...) {
        return from_exception("encoding", spm->name.c_str());
    }
}

static luna_status copy_out(const std::string &s, char **text, const luna_spm *spm) {
    char *t = static_cast<char *>(malloc(s.size() + 1));
    if (!t)
        return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory decoding", spm->name.c_str());
    memcpy(t, s.data(), s.size());
    t[s.size()] = '\0';
    *text = t;
    return LUNA_OK;
}

luna_status luna_spm_decode_pieces(const luna_spm *spm, const char *const *pieces, size_t n,
                                   char **text) {
    *text = nullptr;
    try {
        std::vector<absl::string_view> v;
        v.reserve(n);
        for (size_t i = 0; i < n; i++)
            v.emplace_back(pieces[i], strlen(pieces[i]));
        std::string out;
        auto s = spm->processor.Decode(v, &out);
        if (!s.ok()) return from_spm(s, "decoding", spm->name.c_str());
        return copy_out(out, text, spm);
    } catch (...) {
        return from_exception("decoding", spm->name.c_str());
    }
}

luna_status luna_spm_decode_ids(const luna_spm *spm, const int32_t *ids, size_t n, char **text) {
    *text = nullptr;
    try {
        int size = spm->processor.GetPieceSize();
        std::vector<int> v(ids, ids + n);
        for (size_t i = 0; i < n; i++)
            if (v[i] < 0 || v[i] >= size)
                return luna_error(LUNA_ERR_INVALID_ARGUMENT,
                                  "%s: id %d at position %zu is outside the "
                                  "vocabulary [0, %d)",
                                  spm->name.c_str(), v[i], i, size);
        std::string out;
        auto s = spm->processor.Decode(v, &out);
        if (!s.ok()) return from_spm(s, "decoding", spm->name.c_str());
        return copy_out(out, text, spm);
    } catch (...) {
        return from_exception("decoding", spm->name.c_str());
    }
}

luna_status luna_spm_save_vocab(const luna_spm *spm, const char *path) {
    try {
        return write_vocab(spm->processor, path);
    } catch (...) {
        return from_exception("writing the vocabulary", path);
    }
}

} // extern "C"
