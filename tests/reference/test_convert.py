#!/usr/bin/env python3
"""tools/scripts/convert-checkpoint.py in both directions, against the official Luna code's state_dict
conventions as reproduced by tests/reference/official_style.py (the official code itself cannot
be installed here: see that file for what is and is not reproduced).

  test_convert.py TEST_MODEL_INTERCHANGE LUNA_TRANSLATE      (ctest: convert_checkpoint)

.pt -> luna, for official-style models (Luna with tied/untied kv and all three embedding sharings,
and a fairseq transformer; random weights, LayerNorm gains in U(0.6, 1.4)):
  the converter's luna checkpoint, run by luna's C forward (test_model_interchange --logits, the
  loader the programs use), gives the module's float64 log-probs within 1e-5; luna-translate
  --score-reference opens it and gives the same sentence scores (its 4 printed decimals).
luna -> .pt: a luna checkpoint converted with --target-revision 2021 and 2023 loads into the
  official-style module with strict=True (after the official upgrade step) and its forward
  gives luna's C log-probs within 1e-5.
Failures that must be detected: a 2023 file read as 2021 (logits off), a .pt whose args say the
embeddings are shared but whose tables differ (converter error), a pre-norm model, a missing
--causal-activation, a state_dict without encoder.version (strict load fails).
Exit 77 (ctest: skipped, shown as such) when PyTorch is not importable by any python3 here.
"""
import argparse
import contextlib
import io
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONVERTER = os.path.join(ROOT, "tools", "scripts", "convert-checkpoint.py")

sys.path.insert(0, HERE)
import torch_or_skip  # noqa: E402

torch_or_skip.require(__file__)
import numpy as np  # noqa: E402
import torch  # noqa: E402

import luna_reference as ref  # noqa: E402
import official_style  # noqa: E402
from safetensors_io import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "scripts"))
import safe_pt  # noqa: E402

TOL = 1e-5
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def _converter():
    import importlib.util
    spec = importlib.util.spec_from_file_location("convert_checkpoint", CONVERTER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CONVERT = _converter()


def run(cmd, expect_ok=True):
    """Run a program; the converter (cmd[1] == CONVERTER) in this process, to import torch once
    (its first run in the test is a real subprocess, so the command line is exercised too)."""
    if cmd[0] == sys.executable and cmd[1] == CONVERTER and run.converter_runs > 0:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = CONVERT.main(cmd[2:])
        r = subprocess.CompletedProcess(cmd, rc, "", err.getvalue())
    else:
        if cmd[0] == sys.executable and cmd[1] == CONVERTER:
            run.converter_runs += 1
        r = subprocess.run(cmd, capture_output=True, text=True)
    if expect_ok and r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {r.returncode}")
    return r


run.converter_runs = 0


official_args = official_style.official_args


V = 29
# batch: right-padded sources ending in </s>, prev = </s> + target, pads 1
SRC = torch.tensor([[5, 9, 7, 12, 6, 2], [8, 6, 2, 1, 1, 1], [4, 11, 17, 2, 1, 1]])
SRC_LEN = torch.tensor([6, 3, 4])
TGT = torch.tensor([[10, 11, 4, 20, 2], [13, 2, 1, 1, 1], [7, 9, 2, 1, 1]])
PREV = torch.tensor([[2, 10, 11, 4, 20], [2, 13, 1, 1, 1], [2, 7, 9, 1, 1]])


def write_inputs(path):
    save_file({"input.src_tokens": SRC.to(torch.int32), "input.src_lengths": SRC_LEN.to(torch.int32),
               "input.prev_output_tokens": PREV.to(torch.int32), "input.target": TGT.to(torch.int32)}, path)


def write_dict(path, n):
    with open(path, "w") as f:
        for i in range(n - 4):
            f.write(f"w{i} {100 - i}\n")


def c_logprobs(tool, ckpt, tmp):
    inputs, out = os.path.join(tmp, "inputs.safetensors"), os.path.join(tmp, "c_logits.safetensors")
    write_inputs(inputs)
    r = run([tool, "--logits", ckpt, inputs, out])
    tensors, _ = load_file(out)
    return torch.log_softmax(torch.from_numpy(np.array(tensors["output.logits"])).double(), -1), r.stderr


def nonpad(x):
    return x[PREV.ne(1)]


def max_err(a, b):
    return float((nonpad(a) - nonpad(b)).abs().max())


def case_pt_to_luna(tool, translate, tmp, name, args, revision, act, score=True):
    g = torch.Generator().manual_seed(hash(name) % 1000)
    m = official_style.OfficialStyleModel(args, V, revision, act)
    m.randomize(g)
    pt = os.path.join(tmp, f"{name}.pt")
    torch.save({"args": args, "model": m.state_dict()}, pt)
    write_dict(os.path.join(tmp, "dict.en.txt"), V)
    write_dict(os.path.join(tmp, "dict.de.txt"), V)
    out = os.path.join(tmp, f"{name}.safetensors")
    # a 2023 (gamma - 1) .pt says nothing of its convention: the option states it
    stated = ["--source-revision", "2023"] if revision == "2023" else []
    r = run([sys.executable, CONVERTER, pt, out, "--src-dict", os.path.join(tmp, "dict.en.txt"),
             "--tgt-dict", os.path.join(tmp, "dict.de.txt"), "--causal-activation", act] + stated)
    check(f"({revision} convention" in r.stderr, f"{name}: LayerNorm convention {revision} applied")
    want = torch.log_softmax(m(SRC, SRC_LEN, PREV), -1)
    got, warn = c_logprobs(tool, out, tmp)
    e = max_err(got, want)
    check(e <= TOL and not warn, f"{name}: official-style .pt -> luna: C log-probs vs module {e:.2e} (<= {TOL})")
    if not score:
        return pt, out, m
    # luna-translate opens it and scores the references as the module does (4 printed decimals, base 2)
    words = {i: f"w{i - 4}" for i in range(4, V)}
    ref_txt = "\n".join(" ".join(words[int(t)] for t in row if int(t) > 3) for row in TGT) + "\n"
    src_txt = "\n".join(" ".join(words[int(t)] for t in row if int(t) > 3) for row in SRC) + "\n"
    for fn, txt in (("src.txt", src_txt), ("ref.txt", ref_txt)):
        with open(os.path.join(tmp, fn), "w") as f:
            f.write(txt)
    r = run([translate, out, "--input", os.path.join(tmp, "src.txt"), "--score-reference", "--reference",
             os.path.join(tmp, "ref.txt"), "--output-format", "fairseq", "--threads", "1"])
    lines = {ln.split("\t")[0]: ln.split("\t") for ln in r.stdout.splitlines()}
    worst = 0.0
    for b in range(SRC.shape[0]):
        pos = [float(x) for x in lines[f"P-{b}"][1].split()]
        tgt = TGT[b][TGT[b].ne(1)]
        lp = want[b, torch.arange(len(tgt)), tgt] / np.log(2)
        worst = max(worst, max(abs(p - float(q)) for p, q in zip(pos, lp)))
    check(worst <= 6e-5, f"{name}: luna-translate --score-reference per-token scores vs module {worst:.1e} (4 decimals)")
    return pt, out, m


def main():
    tool, translate = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        # .pt -> luna: the official default (luna_base: embeddings not shared), the 2023 convention
        cases = [
            ("tied_kv_shared_all_2021_softplus", official_args(share_all=True), "2021", "softplus"),
            ("untied_kv_shared_dec_2023_elu", official_args(arch="luna_base_untied", untie=True, share_all=False,
                                                             share_dec=True), "2023", "elu"),
            ("tied_kv_no_sharing_2023_softplus", official_args(share_all=False, share_dec=False), "2023", "softplus"),
            ("transformer_shared_all_2023", official_args(arch="transformer", share_all=True), "2023", "softplus"),
        ]
        made = {}
        for name, args, rev, act in cases:
            made[name] = case_pt_to_luna(tool, translate, tmp, name, args, rev, act, score=name != cases[0][0])

        # a wrong convention is refused, and forced through it is visible: the 2023 file read as 2021
        pt, _, m = made["untied_kv_shared_dec_2023_elu"]
        wrong = os.path.join(tmp, "wrong.safetensors")
        conv = [sys.executable, CONVERTER, pt, wrong, "--src-dict", os.path.join(tmp, "dict.en.txt"),
                "--tgt-dict", os.path.join(tmp, "dict.de.txt"), "--causal-activation", "elu"]
        r = run(conv + ["--source-revision", "2021"], expect_ok=False)
        check(r.returncode == 1 and "--force" in r.stderr and not os.path.exists(wrong),
              f"2023 file with --source-revision 2021: refused ({r.stderr.strip()[:100]}...)")
        r = run(conv + ["--source-revision", "2021", "--force"])
        got, _ = c_logprobs(tool, wrong, tmp)
        e = max_err(got, torch.log_softmax(m(SRC, SRC_LEN, PREV), -1))
        check(e > 0.01, f"2023 file forced to 2021: log-probs off by {e:.2f} (the comparison sees it)")

        # luna -> .pt, both revisions: strict load into the official-style module, same log-probs;
        # a checkpoint written by luna itself (luna_checkpoint_save, luna_tiny: d 32, l 8,
        # softplus) and the converted ones above
        written = os.path.join(tmp, "luna_written.safetensors")
        run([tool, "--write-checkpoint", written, str(V)])
        made["luna_written_tiny"] = (None, written, argparse.Namespace(causal_activation="softplus"))
        for name in ("luna_written_tiny", "tied_kv_shared_all_2021_softplus", "tied_kv_no_sharing_2023_softplus",
                     "transformer_shared_all_2023"):
            luna_ckpt = made[name][1]
            want, _ = c_logprobs(tool, luna_ckpt, tmp)
            for rev in ("2021", "2023"):
                pt = os.path.join(tmp, f"back_{name}_{rev}.pt")
                run([sys.executable, CONVERTER, luna_ckpt, pt, "--target-revision", rev,
                     "--dict-dir", os.path.join(tmp, "dicts")])
                ck = safe_pt.load(pt)  # never torch.load(weights_only=False): see safe_pt.py
                ck["model"] = {k: torch.from_numpy(v) for k, v in ck["model"].items()}
                a = ck["args"]
                mod = official_style.OfficialStyleModel(a, V, rev, made[name][2].causal_activation)
                have, want_keys = set(ck["model"]), set(mod.state_dict())
                check(have == want_keys, f"{name} -> .pt ({rev}): exactly the official state_dict keys "
                                         f"(missing {sorted(want_keys - have)}, extra {sorted(have - want_keys)})")
                try:
                    official_style.load_official(mod, ck["model"])
                    ok = True
                except RuntimeError as ex:
                    ok = False
                    print(str(ex).splitlines()[0])
                check(ok, f"{name} -> .pt ({rev}): strict load into the official-style module")
                if ok:
                    e = max_err(torch.log_softmax(mod(SRC, SRC_LEN, PREV), -1), want)
                    check(e <= TOL, f"{name} -> .pt ({rev}): module log-probs vs luna's C {e:.2e} (<= {TOL})")
            check(os.path.exists(os.path.join(tmp, "dicts", "dict.en.txt")), "--dict-dir writes dict.en.txt")
            # the .pt states its convention (args.layernorm_revision): converting it back needs no option
            again = os.path.join(tmp, f"again_{name}.safetensors")
            r = run([sys.executable, CONVERTER, os.path.join(tmp, f"back_{name}_2023.pt"), again, "--causal-activation",
                     made[name][2].causal_activation, "--src-dict", os.path.join(tmp, "dicts", f"dict.{a.source_lang}.txt"),
                     "--tgt-dict", os.path.join(tmp, "dicts", f"dict.{a.target_lang}.txt")], expect_ok=False)
            e = max_err(c_logprobs(tool, again, tmp)[0], want) if r.returncode == 0 else float("inf")
            check(e <= TOL and "from args.layernorm_revision = 2023" in r.stderr,
                  f"{name} -> .pt (2023) -> luna with --source-revision auto: {e:.2e} ({r.stderr.strip()[:80]})")

        # strictness of the test module itself: without encoder.version the strict load fails
        sd = dict(ck["model"])
        del sd["encoder.version"]
        mod = official_style.OfficialStyleModel(a, V, rev, "elu")
        try:
            mod.load_state_dict(sd, strict=True)
            check(False, "a state_dict without encoder.version is refused by the strict load")
        except RuntimeError:
            check(True, "a state_dict without encoder.version is refused by the strict load")

        # the programs' loader on files that were not converted properly (one line each)
        src_txt = os.path.join(tmp, "src.txt")
        tensors, meta = load_file(made["tied_kv_no_sharing_2023_softplus"][1])
        meta.pop("layernorm_weight")
        gm1 = {k: (np.array(v) - 1.0).astype(np.float32) if k.endswith("layer_norm.weight") else v
               for k, v in tensors.items()}
        save_file(gm1, os.path.join(tmp, "gm1.safetensors"), meta)
        r = run([translate, os.path.join(tmp, "gm1.safetensors"), "--input", src_txt, "--quiet"], expect_ok=False)
        err = r.stderr.strip()
        check(r.returncode != 0 and "\n" not in err and "gamma - 1" in err and "gm1.safetensors" in err
              and "layernorm_weight" in err and not r.stdout,
              f"luna-translate on undeclared gamma-1 weights: refused in one line ({err[:90]}...)")
        tensors, meta = load_file(made["tied_kv_shared_all_2021_softplus"][1])
        tensors["decoder.embed_tokens.weight"] = np.array(tensors["encoder.embed_tokens.weight"]) * 0.5
        save_file(tensors, os.path.join(tmp, "alias.safetensors"), meta)
        r = run([translate, os.path.join(tmp, "alias.safetensors"), "--input", src_txt], expect_ok=False)
        err = r.stderr.strip()
        check(r.returncode != 0 and "\n" not in err and "differs from 'encoder.embed_tokens.weight'" in err,
              f"luna-translate on a differing alias: one-line error ({err[:90]}...)")

        # converter errors: one line, naming the file, exit 1
        dicts = ["--src-dict", os.path.join(tmp, "dict.en.txt"), "--tgt-dict", os.path.join(tmp, "dict.de.txt")]
        bad = official_style.OfficialStyleModel(official_args(share_all=False, share_dec=False), V, "2021")
        bad.randomize(torch.Generator().manual_seed(3))
        lie = os.path.join(tmp, "lie.pt")
        torch.save({"args": official_args(share_all=True), "model": bad.state_dict()}, lie)
        prenorm = os.path.join(tmp, "prenorm.pt")
        torch.save({"args": official_args(encoder_normalize_before=True), "model": made[cases[0][0]][2].state_dict()},
                   prenorm)
        write_dict(os.path.join(tmp, "short.txt"), V - 1)
        for what, cmd, needle, named in [
            ("shared in args, different tables", [lie, "x.safetensors", "--causal-activation", "elu"] + dicts,
             "'decoder.embed_tokens.weight' differs from 'encoder.embed_tokens.weight'", lie),
            ("pre-norm", [prenorm, "x.safetensors", "--causal-activation", "elu"] + dicts,
             "args.encoder_normalize_before = True", prenorm),
            ("no --causal-activation", [made[cases[0][0]][0], "x.safetensors"] + dicts, "--causal-activation",
             made[cases[0][0]][0]),
            ("dictionary size", [made[cases[0][0]][0], "x.safetensors", "--causal-activation", "elu",
                                 "--src-dict", os.path.join(tmp, "short.txt"), "--tgt-dict", os.path.join(tmp, "short.txt")],
             f"{V - 5} symbols + 4 specials = {V - 1}, but the model's embedding tables have {V} rows",
             os.path.join(tmp, "short.txt")),
            ("malformed dictionary", [made[cases[0][0]][0], "x.safetensors", "--causal-activation", "elu",
                                       "--src-dict", CONVERTER, "--tgt-dict", CONVERTER], "convert-checkpoint.py: line", CONVERTER),
        ]:
            r = run([sys.executable, CONVERTER] + [os.path.join(tmp, c) if c == "x.safetensors" else c for c in cmd],
                    expect_ok=False)
            err = r.stderr.strip()
            check(r.returncode == 1 and needle in err and "\n" not in err and named in err
                  and not os.path.exists(os.path.join(tmp, "x.safetensors")),
                  f"converter refuses: {what} ({err[:110]}...)")
    if failures:
        print(f"{len(failures)} FAILED")
        return 1
    print("ALL OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
