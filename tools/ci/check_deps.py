#!/usr/bin/env python3
"""Check the layering of luna's libraries from their #include lines.

    tools/ci/check_deps.py [ROOT]      exit 0 if every rule holds, 1 (listing each violation) if not

The layers (CMakeLists.txt builds one library per layer):
  core/           foundation (status, files, JSON, safetensors, allocator, backend, RNG, options)
  model/kernels/  backends: CPU and CUDA kernels, the backend registry
  model/profile/  the op-cost layer and GPU roofline constants (only benches and tests use it)
  model/          the network: parameter table, weights, layers, seq2seq, incremental steps
  data/           dictionaries, SentencePiece, datasets, batching
  optim/          optimizers, schedules, clipping
  decoding/       decoder state and beam search
  trainer/        the training loop
Rules: kernels never include model layers; model never includes trainer, decoding or
data; data never includes model; optim includes only core (it works on tensor tables: what to
update is data its caller passes, never model/); no library directory includes tools/; decoding
never includes trainer; core includes only core; only tools/ and tests/ include model/profile/.
Only quoted includes ("dir/file.h") are project includes; <...> are system headers.
"""
import pathlib
import re
import sys

LIBRARY_DIRS = ["core", "model/kernels", "model/profile", "model", "data", "optim", "decoding",
                "trainer"]
SOURCE_SUFFIXES = {".c", ".h", ".cc", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# What each layer may include, as path prefixes (own directory always allowed).
ALLOWED = {
    "core": ["core/"],
    "model/kernels": ["core/", "model/kernels/"],
    "model/profile": ["core/", "model/profile/"],
    "model": ["core/", "model/"],
    "data": ["core/", "data/"],
    # tensor tables and the backend: the caller says what to update, optim never sees model/
    "optim": ["core/", "optim/"],
    "decoding": ["core/", "model/", "data/", "decoding/"],
    "trainer": ["core/", "model/", "data/", "optim/", "decoding/", "trainer/"],
}


def layer_of(rel):
    """The library layer a repository-relative path belongs to (longest prefix), or None."""
    for d in sorted(LIBRARY_DIRS, key=len, reverse=True):
        if rel.startswith(d + "/"):
            return d
    return None


def violations(root):
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if rel.startswith("build") or "/build" in rel:
            continue
        layer = layer_of(rel)
        if layer is None:
            continue  # tools/, tests/: may include anything
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            if "/" not in target:
                continue  # a sibling header ("cpu_ops.h"): same directory
            # a model/ file including model/kernels/... is a model file seeing a kernel header:
            # allowed for the registry header only (creating a backend), not kernel internals.
            if layer == "model" and target.startswith("model/kernels/") and \
                    target != "model/kernels/registry.h":
                found.append(f"{rel}:{lineno}: model includes kernel internals {target}")
                continue
            # the op-cost layer wraps any backend's ops: benches and tests attach it, no library
            if target.startswith("model/profile/") and layer != "model/profile":
                found.append(f"{rel}:{lineno}: {layer}/ may not include the op profile {target}")
                continue
            if not any(target == a or (a.endswith("/") and target.startswith(a))
                       for a in ALLOWED[layer]):
                found.append(f"{rel}:{lineno}: {layer}/ may not include {target}")
    return found


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parents[2])
    found = violations(root)
    for v in found:
        print(f"check_deps: {v}", file=sys.stderr)
    if found:
        print(f"check_deps: {len(found)} forbidden include(s)", file=sys.stderr)
        return 1
    print("check_deps: layering ok (core < kernels < model; data; optim; decoding; trainer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
