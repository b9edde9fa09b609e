#!/usr/bin/env python3
"""Table (and plot) of tools/bench/long.sh's measurements beside the Luna paper's Table 2.

  long_report.py LONG_TSV [--plot OUT.png] [--caption TEXT]

LONG_TSV has the columns setting, type, length, steps_per_s, peak_bytes (one bench-model run per
row). Prints, per setting, the absolute numbers and the ratios to softmax attention at the same
length (speed = steps/s ÷ softmax steps/s, memory = peak ÷ softmax peak), with the paper's ratios
(Ma et al. 2021, Table 2: byte-level text classification, GPU) in brackets where it has them.
--plot draws memory and time per step against length for every attention type (needs
matplotlib). Only the standard library otherwise.
"""
import argparse
import csv
import sys

# Luna paper, Table 2: (speed, memory) relative to the softmax Transformer at 1K/2K/3K/4K.
PAPER = {
    "luna16": ([1.2, 1.8, 3.7, 5.5], [0.44, 0.23, 0.17, 0.10]),
    "luna128": ([1.1, 1.7, 3.4, 5.1], [0.49, 0.28, 0.21, 0.14]),
    "luna256": ([1.1, 1.7, 3.3, 4.9], [0.60, 0.33, 0.23, 0.16]),
    "linformer": ([1.2, 1.9, 3.7, 5.5], [0.44, 0.21, 0.18, 0.10]),
}
PAPER_LENGTHS = [1024, 2048, 3072, 4096]


def read(path):
    rows = {}
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        sys.exit(f"long_report.py: {path}: {e.strerror}")
    with f:
        for i, r in enumerate(csv.DictReader(f, delimiter="\t"), start=2):
            try:
                key = (r["setting"], r["type"], int(r["length"]))
                rows[key] = (float(r["steps_per_s"]), int(r["peak_bytes"]))
            except (KeyError, ValueError, TypeError):
                sys.exit(f"long_report.py: {path}:{i}: expected setting, type, length, "
                         "steps_per_s, peak_bytes")
    if not rows:
        sys.exit(f"long_report.py: {path}: no measurements")
    return rows


def ordered(values, first):
    return sorted(values, key=lambda t: (t != first, len(t), t))


def table(rows, setting):
    types = ordered({t for s, t, _ in rows if s == setting}, "softmax")
    lengths = sorted({n for s, _, n in rows if s == setting})
    head = "| attention | " + " | ".join(f"{n // 1024}K" if n % 1024 == 0 else str(n)
                                        for n in lengths) + " |"
    sep = "|---" * (len(lengths) + 1) + "|"
    out = [f"### {setting}: steps/s and peak activation MiB", "", head, sep]
    for t in types:
        cells = []
        for n in lengths:
            v = rows.get((setting, t, n))
            cells.append(f"{v[0]:.3g} / {v[1] / 1048576:.1f}" if v else "-")
        out.append(f"| {t} | " + " | ".join(cells) + " |")
    out += ["", f"### {setting}: speed ×, memory × relative to softmax (paper, Table 2)", "",
            head, sep]
    for t in types:
        if t == "softmax":
            continue
        cells = []
        for n in lengths:
            v, base = rows.get((setting, t, n)), rows.get((setting, "softmax", n))
            if not v or not base:
                cells.append("-")
                continue
            cell = f"{v[0] / base[0]:.1f}× / {v[1] / base[1]:.3f}×"
            if setting == "encoder" and t in PAPER and n in PAPER_LENGTHS:
                k = PAPER_LENGTHS.index(n)
                cell += f" ({PAPER[t][0][k]}× / {PAPER[t][1][k]}×)"
            cells.append(cell)
        out.append(f"| {t} | " + " | ".join(cells) + " |")
    return out


def plot(rows, path, caption):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({s for s, _, _ in rows}, key=lambda s: s != "encoder")
    fig, axes = plt.subplots(len(settings), 2, figsize=(11, 4 * len(settings)), squeeze=False)
    for r, setting in enumerate(settings):
        for t in ordered({t for s, t, _ in rows if s == setting}, "softmax"):
            pts = sorted((n, v) for (s, tt, n), v in rows.items() if s == setting and tt == t)
            xs = [n for n, _ in pts]
            axes[r][0].plot(xs, [v[1] / 1048576 for _, v in pts], marker="o", label=t)
            axes[r][1].plot(xs, [1.0 / v[0] for _, v in pts], marker="o", label=t)
        for c, what in enumerate(["peak activation memory (MiB)", "seconds per training step"]):
            ax = axes[r][c]
            ax.set_xlabel(f"{'source' if setting == 'encoder' else 'target'} length (tokens)")
            ax.set_ylabel(what)
            ax.set_title(f"{setting}: {what}")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.suptitle(f"luna long-sequence benchmark ({caption})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tsv")
    ap.add_argument("--plot", help="write memory/time vs length to this PNG")
    ap.add_argument("--caption", default="", help="the setting, printed under the tables")
    a = ap.parse_args()
    rows = read(a.tsv)
    lines = []
    for setting in sorted({s for s, _, _ in rows}, key=lambda s: s != "encoder"):
        lines += table(rows, setting) + [""]
    if a.caption:
        lines.append(f"Setting: {a.caption}.")
    print("\n".join(lines))
    if a.plot:
        plot(rows, a.plot, a.caption)
        print(f"long_report.py: plot written to {a.plot}")


if __name__ == "__main__":
    main()
