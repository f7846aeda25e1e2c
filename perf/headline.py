"""Draw the README's headline plot: doom_basic training FPS of fastrl and Sample Factory side
by side, against the machine's limit, per machine (perf/results/headline/speed.json, whose
figures are copied from the dated entries of perf/log/RESULTS.md).

    python perf/headline.py     # writes perf/results/headline/speed.png (needs matplotlib)
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent / "results" / "headline"


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    machines = json.loads((HERE / "speed.json").read_text())["machines"]
    fig, axes = plt.subplots(1, len(machines), figsize=(4.2 * len(machines), 3.2))
    for ax, m in zip(axes, machines, strict=True):
        names = ["Sample Factory 2.1.1", "fastrl"]
        values = [m["sample_factory"], m["fastrl"]]
        bars = ax.bar(names, values, color=["#999999", "#1f77b4"])
        ax.axhline(m["limit"], color="#d62728", linestyle="--", linewidth=1)
        ax.text(1.45, m["limit"], f"machine's limit {m['limit']:,}", color="#d62728",
                ha="right", va="bottom", fontsize=8)
        for bar, v in zip(bars, values, strict=True):
            ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:,}", ha="center", va="bottom",
                    fontsize=9)
        ax.set_ylim(0, m["limit"] * 1.12)
        ax.set_title(f"{m['name']} ({m['date']})", fontsize=10)
        ax.set_ylabel("doom_basic training FPS")
    fig.tight_layout()
    out = HERE / "speed.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
