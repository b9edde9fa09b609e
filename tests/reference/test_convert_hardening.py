#!/usr/bin/env python3
"""tools/scripts/convert-checkpoint.py on hostile and malformed inputs, as a user converting a
checkpoint downloaded from the internet would meet them.

  test_convert_hardening.py LUNA_TRANSLATE                  (ctest: convert_checkpoint_hardening)

- Hostile pickles never run: a __reduce__ payload in a zip .pt, a legacy .pt, a raw pickle, a real
  checkpoint's args, and gadgets through builtins/getattr; each is refused in one line naming the
  class, its marker file is not created and nothing is written.
- Malformed checkpoints are refused before anything is written, one line naming the tensor or the
  entry, exit 1, no traceback: a transposed fc1, a missing fc2, an extra tensor, an integer
  tensor, a NaN, a tensor reading past its storage, 'model' a list, 'args' not a Namespace, an
  args dimension that is not a number, a truncated file.
- LayerNorm weights that look like gamma - 1 with nothing stating it are refused (naming
  --source-revision); a stated convention that the weights contradict is refused unless --force.
- A write that fails (file size limit: EFBIG) in either direction leaves no temporary file and
  no output.
- luna-translate on a checkpoint whose config's vocab_size disagrees with its dictionary says so.
Exit 77 (ctest: skipped, shown as such) when PyTorch is not importable by any python3 here.
"""
import argparse
import collections
import json
import os
import pickle
import resource
import signal
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

import official_style  # noqa: E402
from safetensors_io import load_file, save_file  # noqa: E402

V = 29
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def official_args(**extra):
    return official_style.official_args(**extra)


def state_dict(revision="2021", seed=1):
    m = official_style.OfficialStyleModel(official_args(), V, revision, "softplus")
    m.randomize(torch.Generator().manual_seed(seed))
    return collections.OrderedDict((k, v.clone()) for k, v in m.state_dict().items())


def convert(tmp, pt, *extra, limit=None):
    out = os.path.join(tmp, "out.safetensors")
    if os.path.exists(out):
        os.unlink(out)
    cmd = [sys.executable, CONVERTER, pt, out, "--src-dict", os.path.join(tmp, "dict.txt"),
           "--tgt-dict", os.path.join(tmp, "dict.txt"), "--causal-activation", "softplus", *extra]
    return run(cmd, limit), out


def run(cmd, limit=None):
    def fsize():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run(cmd, capture_output=True, text=True, preexec_fn=fsize if limit else None)


def one_line_error(r, *needles):
    err = r.stderr.strip()
    return (r.returncode == 1 and err.count("\n") == 0 and "Traceback" not in r.stderr
            and all(n in err for n in needles)), err


def leftovers(tmp):
    return [f for f in os.listdir(tmp) if ".tmp" in f or f.startswith("out.")]


class Payload:
    """Unpickling this runs `fn(*args)`: the attack the converter must not let through."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def hostile_cases(tmp):
    sd = state_dict()
    cases = []
    for i, (what, fn_name) in enumerate([("zip .pt, payload in args", "posix.system"),
                                         ("legacy .pt, payload in args", "posix.system"),
                                         ("raw pickle", "posix.system"),
                                         ("real checkpoint, payload hidden in args", "posix.system"),
                                         ("builtins.exec gadget", "builtins.exec"),
                                         ("builtins.getattr gadget", "builtins.getattr")]):
        marker = os.path.join(tmp, f"PWNED{i}")
        pt = os.path.join(tmp, f"hostile{i}.pt")
        if fn_name == "posix.system":
            payload = Payload(os.system, f"touch {marker}")
        elif fn_name == "builtins.exec":
            payload = Payload(exec, f"open({marker!r}, 'w').close()")
        else:  # getattr(__import__('os'), 'system'): the first name the pickle holds is getattr
            payload = Payload(getattr, Payload(__import__, "os"), "system")
        if i == 0:
            torch.save({"args": argparse.Namespace(arch=payload), "model": {}}, pt)
        elif i == 1:
            torch.save({"args": argparse.Namespace(arch=payload), "model": {}}, pt,
                       _use_new_zipfile_serialization=False)
        elif i == 2:
            with open(pt, "wb") as f:
                pickle.dump(payload, f)
        else:
            torch.save({"args": official_args(note=payload), "model": sd}, pt)
        cases.append((what, pt, marker, fn_name))
    return cases


def main():
    translate = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "dict.txt"), "w") as f:
            f.writelines(f"w{i} {100 - i}\n" for i in range(V - 4))

        # the valid file converts (the cases below differ from it in one thing each)
        good = os.path.join(tmp, "good.pt")
        torch.save({"args": official_args(), "model": state_dict()}, good)
        r, out = convert(tmp, good)
        check(r.returncode == 0 and os.path.exists(out), f"the valid checkpoint converts ({r.stderr.strip()[:80]})")
        os.unlink(out)
        # everything a fairseq training checkpoint holds besides the model converts too: the
        # optimizer's state, meters with numpy scalars, parameters saved as nn.Parameter, and
        # the newer 'cfg' dict in place of args (legacy and zip containers)
        sd = state_dict()
        sd["encoder.embed_tokens.weight"] = torch.nn.Parameter(sd["encoder.embed_tokens.weight"])
        full = {"model": sd, "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                                    "optimizer_name": "Adam", "lr_scheduler_state": {"best": np.float64(3.5)},
                                                    "num_updates": 7}],
                "extra_state": {"metrics": collections.OrderedDict(train={"loss": {"val": np.float32(2.5), "count": 3}}),
                                "train_iterator": {"epoch": 2, "iterations_in_epoch": 5}, "val_loss": np.float64(3.25),
                                "previous_training_time": 12.5, "ids": {1, 2}},
                "last_optimizer_state": {"state": {0: {"step": 7, "exp_avg": torch.randn(3, 2).half()}},
                                         "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.98), "params": [0]}]}}
        for what, ck, zipf in (("args", {"args": official_args(), **full}, True),
                               ("cfg", {"args": None, "cfg": {"model": vars(official_args())}, **full}, False)):
            pt = os.path.join(tmp, "full.pt")
            torch.save(ck, pt, _use_new_zipfile_serialization=zipf)
            r, out = convert(tmp, pt)
            check(r.returncode == 0 and os.path.exists(out),
                  f"a full fairseq training checkpoint ({what}, {'zip' if zipf else 'legacy'}) converts ({r.stderr.strip()[-60:]})")

        for what, pt, marker, fn_name in hostile_cases(tmp):
            r, out = convert(tmp, pt)
            ok, err = one_line_error(r, pt, "refused", f"'{fn_name}'")
            check(ok and not os.path.exists(marker) and not leftovers(tmp),
                  f"hostile pickle refused, payload not run: {what} ({err[len(pt) + 20:][:90]}...)")

        def malformed(what, ckpt, *needles, extra=(), raw=None):
            pt = os.path.join(tmp, "bad.pt")
            if raw is not None:
                with open(pt, "wb") as f:
                    f.write(raw)
            else:
                torch.save(ckpt, pt)
            r, out = convert(tmp, pt, *extra)
            ok, err = one_line_error(r, pt, *needles)
            check(ok and not leftovers(tmp), f"refused: {what} ({err[len(pt) + 20:][:100]}...)")

        sd = state_dict()
        sd["encoder.layers.0.fc1.weight"] = sd["encoder.layers.0.fc1.weight"].t().contiguous()
        malformed("transposed fc1", {"args": official_args(), "model": sd}, "'encoder.layers.0.fc1.weight'",
                  "[16, 24]", "expected [24, 16]", "transposed")
        sd = state_dict()
        del sd["decoder.layers.0.fc2.weight"]
        malformed("missing fc2", {"args": official_args(), "model": sd}, "'decoder.layers.0.fc2.weight'", "missing")
        sd = state_dict()
        sd["decoder.layers.0.extra.weight"] = torch.zeros(3)
        malformed("extra tensor", {"args": official_args(), "model": sd}, "'decoder.layers.0.extra.weight'",
                  "not a parameter")
        sd = state_dict()
        sd["encoder.layers.1.fc2.bias"] = torch.arange(16)
        malformed("integer tensor", {"args": official_args(), "model": sd}, "'encoder.layers.1.fc2.bias'", "int64")
        sd = state_dict()
        sd["decoder.layers.1.fc1.weight"][3, 2] = float("nan")
        malformed("NaN", {"args": official_args(), "model": sd}, "'decoder.layers.1.fc1.weight'", "non-finite")

        class PastStorage:  # a tensor of 1000 elements over a storage of 4
            def __reduce_ex__(self, proto):
                return (torch._utils._rebuild_tensor_v2,
                        (torch.ones(4).storage(), 0, (1000,), (1,), False, collections.OrderedDict()))
        sd = state_dict()
        sd["encoder.layers.0.fc1.bias"] = PastStorage()
        malformed("tensor past its storage", {"args": official_args(), "model": sd}, "reads past its storage")
        malformed("'model' is a list", {"args": official_args(), "model": [1, 2]}, "'model' is a list")
        malformed("'args' is a dict", {"args": {"arch": "luna"}, "model": state_dict()}, "'args' is a dict")
        malformed("args dimension not a number", {"args": official_args(encoder_layers="two"), "model": state_dict()},
                  "args.encoder_layers", "not an integer")
        with open(good, "rb") as f:
            whole = f.read()
        malformed("truncated file", None, "not a readable PyTorch checkpoint", raw=whole[: len(whole) // 2])
        malformed("not a checkpoint at all", None, "not a PyTorch checkpoint", raw=b"hello world\n" * 10)

        # LayerNorm convention: gamma - 1 without a statement, and statements the weights contradict
        gm1 = os.path.join(tmp, "gm1.pt")
        torch.save({"args": official_args(), "model": state_dict("2023")}, gm1)
        r, out = convert(tmp, gm1)
        ok, err = one_line_error(r, "gamma - 1", "--source-revision 2023")
        check(ok and not os.path.exists(out), f"gamma - 1 without a statement refused ({err[len(gm1) + 20:][:90]}...)")
        r, out = convert(tmp, gm1, "--source-revision", "2023")
        check(r.returncode == 0 and os.path.exists(out), "gamma - 1 with --source-revision 2023 converts")
        r, out = convert(tmp, good, "--source-revision", "2023")
        ok, err = one_line_error(r, "--force", "2023")
        check(ok and not os.path.exists(out), f"gamma with --source-revision 2023 refused ({err[len(good) + 20:][:90]}...)")
        r, out = convert(tmp, good, "--source-revision", "2023", "--force")
        check(r.returncode == 0 and os.path.exists(out), "... and converts with --force")
        lie = os.path.join(tmp, "lie.pt")
        torch.save({"args": official_args(layernorm_revision="2021"), "model": state_dict("2023")}, lie)
        r, out = convert(tmp, lie)
        ok, err = one_line_error(r, "args.layernorm_revision = 2021", "--force")
        check(ok and not os.path.exists(out), f"a stated convention the weights contradict refused ({err[len(lie) + 20:][:80]}...)")

        # write errors: no temporary file, no output, one line (both directions)
        r, out = convert(tmp, good, limit=4096)
        ok, err = one_line_error(r, "cannot write")
        check(ok and not leftovers(tmp), f".pt -> luna with writes failing (EFBIG): {err[-60:]}")
        r, out = convert(tmp, good)
        back = os.path.join(tmp, "out.pt")
        r = run([sys.executable, CONVERTER, out, back], limit=4096)
        ok, err = one_line_error(r, "cannot write")
        check(ok and not [f for f in os.listdir(tmp) if f.startswith("out.pt")],
              f"luna -> .pt with writes failing (EFBIG): {err[-60:]}")

        # a configuration whose vocabulary size disagrees with the dictionary, said as such
        tensors, meta = load_file(out)
        cfg = json.loads(meta["config"])
        cfg["vocab_size"] = V + 1
        meta["config"] = json.dumps(cfg)
        save_file({k: np.array(v) for k, v in tensors.items()}, os.path.join(tmp, "vocab.safetensors"), meta)
        with open(os.path.join(tmp, "in.txt"), "w") as f:
            f.write("w1 w2\n")
        r = subprocess.run([translate, os.path.join(tmp, "vocab.safetensors"), "--input", os.path.join(tmp, "in.txt")],
                           capture_output=True, text=True)
        ok, err = one_line_error(r, f"vocab_size {V + 1}", "disagrees with the dictionary")
        check(ok, f"luna-translate: config vocab_size vs dictionary ({err[-90:]})")
    if failures:
        print(f"{len(failures)} FAILED")
        return 1
    print("ALL OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
