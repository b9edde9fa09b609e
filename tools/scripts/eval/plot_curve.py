#!/usr/bin/env python3
"""Learning curve of a luna-train run: train and valid loss against updates, and BLEU.

  plot_curve.py TRAIN_LOG [TRAIN_LOG ...] --output curve.png [--title TEXT] [--nll]
                [--final UPDATES:LOSS] [--bleu LABEL:UPDATES:SCORE ...]

TRAIN_LOG is what `luna-train --log-format json` printed (stdout and stderr together are fine:
lines that are not JSON objects are skipped). Training lines carry "num_updates" and "loss";
validation lines carry "valid_num_updates" and "valid_loss". Losses are luna-train's (base 2,
label-smoothed); --nll plots the nll_loss columns instead. Several logs (e.g. a run that was
resumed) are concatenated in the order given. --final marks a validation of the final (e.g.
averaged) checkpoint on the loss axis (a star; give it in the plotted unit: with --nll the nll
in bits per token), --bleu draws BLEU scores (e.g. "valid:940:24.1", "test:940:26.7") on a
second y axis at the right. Needs matplotlib (tools/demo.sh installs it into
the evaluation venv); prints a one-line summary of what it plotted.
"""
import argparse
import json
import sys


def read_log(paths):
    train, valid = [], []
    for path in paths:
        try:
            f = open(path, encoding="utf-8", errors="replace")
        except OSError as e:
            sys.exit(f"plot_curve.py: {path}: {e.strerror} (give the log written by luna-train --log-format json)")
        with f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "valid_num_updates" in rec and "valid_loss" in rec:
                    valid.append(rec)
                elif "num_updates" in rec and "loss" in rec:
                    train.append(rec)
    return train, valid


def main():
    ap = argparse.ArgumentParser(description="Plot train/valid loss vs updates from luna-train --log-format json logs.")
    ap.add_argument("logs", nargs="+", metavar="TRAIN_LOG")
    ap.add_argument("--output", "-o", required=True, help="PNG (or any format matplotlib knows by extension)")
    ap.add_argument("--title", default=None)
    ap.add_argument("--nll", action="store_true", help="plot nll_loss instead of the label-smoothed loss")
    ap.add_argument("--final", metavar="UPDATES:LOSS", help="the final checkpoint's validation (a star)")
    ap.add_argument("--bleu", metavar="LABEL:UPDATES:SCORE", action="append", default=[],
                    help="a BLEU score on the right axis (repeatable)")
    a = ap.parse_args()

    def numbers(text, n, what):
        parts = text.split(":")
        try:
            if len(parts) != n:
                raise ValueError
            return parts[:n - 2] + [float(parts[-2]), float(parts[-1])]
        except ValueError:
            sys.exit(f"plot_curve.py: {what} '{text}' is not {'LABEL:' if n == 3 else ''}UPDATES:VALUE with numbers")
    final = numbers(a.final, 2, "--final") if a.final else None
    bleus = [numbers(b, 3, "--bleu") for b in a.bleu]

    train, valid = read_log(a.logs)
    if not train and not valid:
        sys.exit(f"plot_curve.py: no JSON training or validation lines in {', '.join(a.logs)} "
                 "(was luna-train run with --log-format json?)")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_curve.py: matplotlib is not installed in this Python (pip install matplotlib, "
                 "or apt-get install python3-matplotlib)")

    tkey, vkey = ("nll_loss", "valid_nll_loss") if a.nll else ("loss", "valid_loss")
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    if train:
        ax.plot([r["num_updates"] for r in train], [r[tkey] for r in train],
                label=f"train {tkey}", color="tab:blue", linewidth=1.2)
    if valid:
        ax.plot([r["valid_num_updates"] for r in valid], [r[vkey] for r in valid],
                label=f"valid {tkey}", color="tab:orange", marker="o", markersize=4, linewidth=1.5)
    if final:
        ax.plot([final[0]], [final[1]], marker="*", markersize=12, color="tab:red", linestyle="none",
                label=f"final checkpoint, valid {'nll' if a.nll else 'loss'} {final[1]:.3f}")
    ax.set_xlabel("updates")
    ax.set_ylabel(f"{tkey} (bits per target token)")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if bleus:
        ax2 = ax.twinx()
        colors = {"valid": "tab:green", "test": "tab:purple"}
        for label, u, score in bleus:
            h = ax2.plot([u], [score], marker="D", markersize=7, linestyle="none",
                         color=colors.get(label, "tab:gray"), label=f"{label} sacreBLEU {score:.1f}")
            handles += h
            labels.append(h[0].get_label())
        ax2.set_ylabel("sacreBLEU")
        top = max(score for _, _, score in bleus)
        ax2.set_ylim(0, max(10.0, top * 1.25))
    ax.legend(handles, labels, fontsize=8, loc="lower left")  # losses fall: the lower left is free
    if a.title:
        ax.set_title(a.title, fontsize=10)
    # the first few losses (~log2 V) dwarf the rest: start the y axis near the first valid loss
    ys = [r[tkey] for r in train[len(train) // 20:]] + [r[vkey] for r in valid] + ([final[1]] if final else [])
    if ys:
        lo, hi = min(ys), max(ys)
        ax.set_ylim(max(0.0, lo - 0.1 * (hi - lo)), hi + 0.05 * (hi - lo) + 1e-6)
    fig.tight_layout()
    fig.savefig(a.output)
    last_t = f"train {tkey} {train[-1][tkey]:.3f} @ {train[-1]['num_updates']}" if train else "no train lines"
    last_v = (f"{vkey} {valid[-1][vkey]:.3f} @ {valid[-1]['valid_num_updates']} "
              f"(best {min(r[vkey] for r in valid):.3f})") if valid else "no valid lines"
    extra = "".join(f"; {lab} BLEU {sc:.2f}" for lab, _, sc in bleus) + (f"; final {final[1]:.3f}" if final else "")
    print(f"plot_curve.py: wrote {a.output} ({len(train)} train / {len(valid)} valid points; {last_t}; {last_v}{extra})")


if __name__ == "__main__":
    main()
