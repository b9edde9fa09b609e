#!/usr/bin/env python3
"""Learning curve of a luna-train run: train and valid loss against updates.

  plot_curve.py TRAIN_LOG [TRAIN_LOG ...] --output curve.png [--title TEXT] [--nll]

TRAIN_LOG is what `luna-train --log-format json` printed (stdout and stderr together are fine:
lines that are not JSON objects are skipped). Training lines carry "num_updates" and "loss";
validation lines carry "valid_num_updates" and "valid_loss". Losses are luna-train's (base 2,
label-smoothed); --nll plots the nll_loss columns instead. Several logs (e.g. a run that was
resumed) are concatenated in the order given. Needs matplotlib (tools/demo.sh installs it into
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
    a = ap.parse_args()

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
    ax.set_xlabel("updates")
    ax.set_ylabel(f"{tkey} (base 2)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    if a.title:
        ax.set_title(a.title, fontsize=10)
    # the first few losses (~log2 V) dwarf the rest: start the y axis near the first valid loss
    ys = [r[tkey] for r in train[len(train) // 20:]] + [r[vkey] for r in valid]
    if ys:
        lo, hi = min(ys), max(ys)
        ax.set_ylim(max(0.0, lo - 0.1 * (hi - lo)), hi + 0.05 * (hi - lo) + 1e-6)
    fig.tight_layout()
    fig.savefig(a.output)
    last_t = f"train {tkey} {train[-1][tkey]:.3f} @ {train[-1]['num_updates']}" if train else "no train lines"
    last_v = (f"{vkey} {valid[-1][vkey]:.3f} @ {valid[-1]['valid_num_updates']} "
              f"(best {min(r[vkey] for r in valid):.3f})") if valid else "no valid lines"
    print(f"plot_curve.py: wrote {a.output} ({len(train)} train / {len(valid)} valid points; {last_t}; {last_v})")


if __name__ == "__main__":
    main()
