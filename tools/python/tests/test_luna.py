"""The luna package against luna-translate on tiny checkpoints (conftest.py): the same
translations, n-best scores, piece output and --score-reference scores; a translator shared by
Python threads, with the GIL released while it works; bad paths and arguments raise."""
import math
import threading
import time

import pytest

import luna

SENTENCES = ["the cat", "", "over the dog", "a dog ran in the park again and again"]


def fairseq_lines(out, tag):
    """{i: [fields after the tag, one list per line]} of luna-translate's fairseq output."""
    got = {}
    for line in out.splitlines():
        key, _, rest = line.partition("\t")
        if key.startswith(tag + "-"):
            got.setdefault(int(key[len(tag) + 1:]), []).append(rest.split("\t"))
    return got


@pytest.fixture(scope="module")
def translator(checkpoints):
    return luna.Translator(str(checkpoints / "tiny.safetensors"), device="cpu", threads=2)


def test_translations_and_scores_are_luna_translates(translator, checkpoints, tmp_path, run_translate):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n")
    ck = checkpoints / "tiny.safetensors"
    results = translator.translate_batch(SENTENCES, beam_size=4, length_penalty=0.6,
                                         max_length=12, num_hypotheses=2, return_scores=True)
    assert len(results) == len(SENTENCES)
    plain = run_translate(ck, "--input", src, "--max-len-b", 12)
    assert [r.hypotheses[0] for r in results] == plain.split("\n")[:-1]
    fs = run_translate(ck, "--input", src, "--max-len-b", 12, "--nbest", 2,
                              "--output-format", "fairseq")
    d_lines, p_lines = fairseq_lines(fs, "D"), fairseq_lines(fs, "P")
    for i, r in enumerate(results):
        assert [d[1] for d in d_lines[i]] == r.hypotheses
        assert [float(d[0]) for d in d_lines[i]] == r.scores
        for p, tokens in zip(p_lines[i], r.token_scores):
            assert [float(x) for x in p[0].split()] == pytest.approx(tokens, abs=5.1e-5)
    assert results[1].hypotheses == [""] and math.isinf(results[1].scores[0])
    assert len(results[0].hypotheses) == 2
    # without return_scores: the same hypotheses, no scores
    bare = translator.translate_batch(SENTENCES, max_length=12)
    assert [b.hypotheses[0] for b in bare] == plain.split("\n")[:-1] and bare[0].scores == []


def test_pieces_in_pieces_out(translator, checkpoints, tmp_path, run_translate):
    src = tmp_path / "in.txt"
    src.write_text(SENTENCES[3] + "\n")
    fs = run_translate(checkpoints / "tiny.safetensors", "--input", src, "--max-len-b", 12,
                              "--output-format", "fairseq")
    pieces = fairseq_lines(fs, "S")[0][0][0].split(" ")
    expected = fairseq_lines(fs, "H")[0][0][1].split(" ")
    [r] = translator.translate_batch([pieces], max_length=12)
    assert r.hypotheses[0] == expected


def test_document_sentences_are_lines(checkpoints, tmp_path, run_translate):
    line = "the cat <sep> over the dog <sep> a dog ran"
    src = tmp_path / "doc.txt"
    src.write_text(line + "\n")
    plain = run_translate(checkpoints / "doc.safetensors", "--input", src,
                                 "--max-len-b", 12)
    t = luna.Translator(checkpoints / "doc.safetensors", threads=1)
    assert t.translate_batch([line], max_length=12)[0].hypotheses[0] + "\n" == plain


def test_scores_are_score_references(translator, checkpoints, tmp_path, run_translate):
    targets = ["a dog", "the cat", "", "the park"]
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(targets) + "\n")
    out = run_translate(checkpoints / "tiny.safetensors", "--input", tmp_path / "in.txt",
                               "--score-reference", "--reference", tmp_path / "ref.txt")
    scores = translator.score_batch(SENTENCES, targets)
    assert [s.score for s in scores] == [float(x) for x in out.split()]
    assert scores[1].token_scores == [] and scores[2].token_scores == []
    assert sum(scores[3].token_scores) / len(scores[3].token_scores) == \
        pytest.approx(scores[3].score, abs=1e-5)


def test_threads_share_a_translator(translator):
    alone = [r.hypotheses[0] for r in translator.translate_batch(SENTENCES, max_length=12)]
    got, errors = [], []

    def work():
        try:
            for _ in range(3):
                got.append([r.hypotheses[0]
                            for r in translator.translate_batch(SENTENCES, max_length=12)])
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert got == [alone] * 12


def test_clones_translate_alike_at_once(translator, checkpoints):
    alone = [r.hypotheses[0] for r in translator.translate_batch(SENTENCES, max_length=12)]
    clones = [translator.clone() for _ in range(2)]
    clones.append(clones[0].clone())
    assert repr(clones[2]) == repr(translator)
    got, errors = {}, []

    def work(i, t):
        try:
            got[i] = [r.hypotheses[0] for r in t.translate_batch(SENTENCES, max_length=12)]
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i, t))
               for i, t in enumerate([translator] + clones)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [got[i] for i in range(4)] == [alone] * 4


def test_workers_give_the_same_translations(translator, checkpoints):
    alone = [r.hypotheses[0] for r in translator.translate_batch(SENTENCES, max_length=12)]
    t = luna.Translator(str(checkpoints / "tiny.safetensors"), threads=1, workers=3)
    assert "workers=3" in repr(t)
    assert [r.hypotheses[0] for r in t.translate_batch(SENTENCES, max_length=12)] == alone
    with pytest.raises(luna.InvalidArgumentError, match="workers must be in"):
        luna.Translator(str(checkpoints / "tiny.safetensors"), workers=0)


def _longest_pause(translator, batch):
    """The main thread's longest pause while another thread translates `batch`, and the call's
    time."""
    inside, done = threading.Event(), threading.Event()
    times = []

    def work():
        times.append(time.monotonic())
        inside.set()
        translator.translate_batch(batch, beam_size=8, max_length=60)
        times.append(time.monotonic())
        done.set()

    worker = threading.Thread(target=work)
    worker.start()
    inside.wait()
    last, longest = times[0], 0.0
    while not done.is_set():
        now = time.monotonic()
        longest, last = max(longest, now - last), now
    worker.join()
    return max(longest, times[1] - last), times[1] - times[0]


def test_gil_is_released_while_translating(translator):
    """The main thread keeps running Python while another thread is inside translate_batch: its
    longest pause is a small part of the call (with the GIL held it would stop for all of the
    call's time in libluna). The batch grows until the call lasts long enough to tell (a faster
    machine or decoder needs more sentences)."""
    for n in (32, 128, 512, 2048):
        longest, call = _longest_pause(translator, [SENTENCES[3]] * n)
        print(f"longest pause of the main thread: {longest:.3f} s during a {call:.2f} s call")
        if call > 0.1:
            break
    assert call > 0.1
    assert longest < 0.5 * call


def test_bad_paths_raise(checkpoints, tmp_path):
    with pytest.raises(OSError, match="missing.safetensors"):
        luna.Translator(tmp_path / "missing.safetensors")
    with pytest.raises(luna.FormatError, match="lacks its vocabulary"):
        luna.Translator(checkpoints / "novocab.safetensors")
    (tmp_path / "text.safetensors").write_text("not a checkpoint\n")
    with pytest.raises(luna.LunaError, match="text.safetensors"):
        luna.Translator(tmp_path / "text.safetensors")


def test_bad_arguments_raise(translator, checkpoints):
    ck = checkpoints / "tiny.safetensors"
    with pytest.raises(ValueError, match="threads must be in 1..1024"):
        luna.Translator(ck, threads=0)
    with pytest.raises(luna.LunaError, match="tpu"):
        luna.Translator(ck, device="tpu")
    with pytest.raises(TypeError):
        luna.Translator(ck, threads="two")
    with pytest.raises(ValueError, match="beam must be in 1..1024"):
        translator.translate_batch(["the cat"], beam_size=0)
    with pytest.raises(ValueError, match="nbest must be between 1 and beam"):
        translator.translate_batch(["the cat"], beam_size=2, num_hypotheses=3)
    with pytest.raises(ValueError, match="temperature"):
        translator.translate_batch(["the cat"], temperature=0)
    with pytest.raises(ValueError, match="seed"):
        translator.translate_batch(["the cat"], seed=-1)
    with pytest.raises(TypeError):
        translator.translate_batch(["the cat"], beam_size="4")
    with pytest.raises(OverflowError):
        translator.translate_batch(["the cat"], beam_size=2**40)
    with pytest.raises(TypeError, match="not a string"):
        translator.translate_batch("the cat")
    with pytest.raises(TypeError, match=r"source\[1\]"):
        translator.translate_batch(["the cat", 3])
    with pytest.raises(luna.FormatError, match="sentence:2: NUL byte"):
        translator.translate_batch(["the cat", "a\0b"])
    with pytest.raises(UnicodeEncodeError):
        translator.translate_batch(["\ud800"])
    with pytest.raises(ValueError, match="1 targets for 2 sources"):
        translator.score_batch(["the cat", "a dog"], ["die Katze"])
    # still works afterwards
    assert translator.translate_batch([], max_length=12) == []
    assert translator.translate_batch(["the cat"], max_length=12)[0].hypotheses[0] != ""
