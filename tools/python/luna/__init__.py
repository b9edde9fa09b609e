"""luna: translate with luna checkpoints from Python (bindings of libluna's C API, luna.h).

    import luna
    translator = luna.Translator("checkpoint_avg.safetensors", device="cpu", threads=2)
    results = translator.translate_batch(["A man is riding a bike."], beam_size=4,
                                         return_scores=True)
    print(results[0].hypotheses[0], results[0].scores[0])

Translations are luna-translate's for the same checkpoint, options and threads; scores are in
its units (base 2: fairseq-generate's H- and P- lines, and --score-reference averages).
A Translator may be shared by threads: its calls run one at a time (a lock per translator in
libluna) with the GIL released, so other Python threads keep running meanwhile. To translate on
several threads at once, give each thread translator.clone(): on the CPU the clones share one
copy of the model (an extra translator costs its decoder state, not another model).
"""

from dataclasses import dataclass, field
from typing import List, Sequence, Union

from . import _luna
from ._luna import FormatError, InvalidArgumentError, LunaError, LunaIOError

__all__ = ["Translator", "TranslationResult", "ScoreResult", "LunaError", "InvalidArgumentError",
           "FormatError", "LunaIOError", "blas_core", "__version__"]

__version__ = _luna.version


@dataclass
class TranslationResult:
    """One sentence's n-best list, best first: detokenized strings for text input, lists of
    SentencePiece pieces for piece input. scores (Σ log2 p / len^length_penalty) and
    token_scores (log2 p of each target token, </s> last) are filled when return_scores=True.
    A blank sentence gives one empty hypothesis (score -inf). truncated: the source was cut to
    max_input_tokens."""
    hypotheses: List[Union[str, List[str]]]
    scores: List[float] = field(default_factory=list)
    token_scores: List[List[float]] = field(default_factory=list)
    truncated: bool = False


@dataclass
class ScoreResult:
    """A given translation's score: the average log2 p per target token (</s> included;
    luna-translate --score-reference), and each token's log2 p. 0 and [] when a side is blank."""
    score: float
    token_scores: List[float]


def blas_core() -> str:
    """The OpenBLAS kernel family in use: pass it as OPENBLAS_CORETYPE to luna-translate to
    have it compute exactly the same numbers."""
    return _luna.blas_core()


def _as_input(source, what):
    """(strings, pieces): a list of strings, or a list of lists of pieces joined by spaces."""
    if isinstance(source, (str, bytes)):
        raise TypeError(f"{what} must be a list of strings or of lists of pieces, not a string")
    source = list(source)
    if not source:
        return source, False
    pieces = not isinstance(source[0], str)
    out = []
    for i, s in enumerate(source):
        if pieces:
            if isinstance(s, (str, bytes)) or not all(isinstance(p, str) for p in s):
                raise TypeError(f"{what}[{i}] must be a list of piece strings like {what}[0]")
            out.append(" ".join(s))
        else:
            if not isinstance(s, str):
                raise TypeError(f"{what}[{i}] must be a string like {what}[0], not "
                                f"{type(s).__name__}")
            out.append(s)
    return out, pieces


class Translator:
    """A luna checkpoint (written by luna-train or luna-average) loaded for translation.

    device: "cpu" or "cuda" (device_id picks the GPU); threads: CPU threads; precision: "auto"
    (fp32), "fp32" or "bf16" (cuda); workers (CPU): each translate_batch call's sentences are
    split over that many decoders of the model (one copy of it), each on a thread of its own with
    `threads` threads, as CTranslate2's inter_threads: on a multi-core CPU workers = cores and
    threads = 1 translates a large batch fastest, with the same translations. Raises LunaIOError
    (an OSError) for a missing file,
    FormatError for a malformed checkpoint, InvalidArgumentError for bad options."""

    def __init__(self, model_path, device: str = "cpu", threads: int = 2, *,
                 device_id: int = -1, precision: str = "auto", tf32: bool = False,
                 workers: int = 1):
        self._t = _luna.create(model_path, device=device, device_id=device_id, threads=threads,
                               precision=precision, tf32=tf32)
        if workers != 1:
            _luna.set_workers(self._t, workers)
        self.model_path = model_path
        self.device = device
        self.threads = threads
        self.workers = workers

    def clone(self) -> "Translator":
        """Another Translator of the same checkpoint and options (one worker), for another
        thread: calls on the clone run at the same time as calls on this one, with the same
        results. On the CPU it shares this one's weights (no second copy of the model); on a GPU
        it loads them again."""
        c = Translator.__new__(Translator)
        c._t = _luna.clone(self._t)
        c.model_path, c.device, c.threads = self.model_path, self.device, self.threads
        c.workers = 1
        return c

    @property
    def has_spm(self) -> bool:
        """Whether the checkpoint has a SentencePiece model (else text is split on spaces)."""
        return _luna.has_spm(self._t)

    def translate_batch(self, source: Sequence[Union[str, Sequence[str]]], beam_size: int = 4,
                        length_penalty: float = 0.6, max_length: int = 200,
                        num_hypotheses: int = 1, return_scores: bool = False, *,
                        max_length_a: float = 0.0, min_length: int = 1,
                        max_target_positions: int = 1024, unk_penalty: float = 0.0,
                        no_repeat_ngram_size: int = 0, temperature: float = 1.0,
                        sampling: bool = False, sampling_topk: int = -1, seed: int = 1,
                        max_input_tokens: int = 1024, max_batch_tokens: int = 6000,
                        max_batch_size: int = 128) -> List[TranslationResult]:
        """Translate sentences (strings, or lists of pieces) with luna-translate's search:
        beam_size (--beam), length_penalty (--lenpen), max_length and max_length_a (at most
        max_length_a·source length + max_length tokens, --max-len-b/-a), num_hypotheses
        (--nbest), and the rest as luna-translate's options of similar names; max_batch_tokens
        and max_batch_size are its --max-tokens and --batch-size."""
        texts, pieces = _as_input(source, "source")
        raw = _luna.translate(
            self._t, texts, pieces=pieces, beam=beam_size, lenpen=length_penalty,
            max_len_a=max_length_a, max_len_b=max_length,
            max_target_positions=max_target_positions, min_len=min_length,
            nbest=num_hypotheses, unkpen=unk_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            temperature=temperature, sampling=sampling, sampling_topk=sampling_topk, seed=seed,
            max_input_tokens=max_input_tokens, max_tokens=max_batch_tokens,
            batch_size=max_batch_size)
        results = []
        for hyps, truncated in raw:
            texts_out = [h[0].split(" ") if pieces and h[0] else ([] if pieces else h[0])
                         for h in hyps]
            r = TranslationResult(hypotheses=texts_out, truncated=truncated)
            if return_scores:
                r.scores = [h[1] for h in hyps]
                r.token_scores = [h[2] for h in hyps]
            results.append(r)
        return results

    def score_batch(self, source: Sequence[Union[str, Sequence[str]]],
                    target: Sequence[Union[str, Sequence[str]]], *,
                    max_input_tokens: int = 1024, max_batch_tokens: int = 6000,
                    max_batch_size: int = 128) -> List[ScoreResult]:
        """Score target[i] as the translation of source[i] (both strings, or both lists of
        pieces), as luna-translate --score-reference."""
        src, src_pieces = _as_input(source, "source")
        tgt, tgt_pieces = _as_input(target, "target")
        if src and tgt and src_pieces != tgt_pieces:
            raise TypeError("source and target must both be strings or both lists of pieces")
        raw = _luna.score(self._t, src, tgt, pieces=src_pieces or tgt_pieces,
                          max_input_tokens=max_input_tokens, max_tokens=max_batch_tokens,
                          batch_size=max_batch_size)
        return [ScoreResult(score=s, token_scores=t) for s, t in raw]

    def __repr__(self):
        workers = f", workers={self.workers}" if self.workers != 1 else ""
        return f"luna.Translator({self.model_path!r}, device={self.device!r}, " \
               f"threads={self.threads}{workers})"
