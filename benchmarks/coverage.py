"""Does the dataset reach the regime real training runs in? Per dataset label, op, precision and phase: the
distribution of measured time over decades (5 us to 50 ms), and of the achieved fraction of the device's
measured matmul peak (FLOPs / time / peak; the peak is the 8192^3 matmul rate each sweep measures and stores in
its files' metadata; imported sources, which publish none, use the registry's datasheet rate).

    python benchmarks/coverage.py [--root datasets] [--out reports]   # writes coverage.md and coverage.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import physics, schema  # noqa: E402
from pipeline.gpus import gpu_spec  # noqa: E402
from pipeline.markdown import markdown_table  # noqa: E402

DECADES_MS = [0, 0.005, 0.05, 0.5, 5, 50, np.inf]
DECADE_NAMES = ["<5us", "5-50us", "50-500us", "0.5-5ms", "5-50ms", ">50ms"]
HALF = 0.5


def _peak_tflops(path: Path, precision: str, gpu: str) -> tuple[float, str]:
    measured = schema.file_metadata(path).get("characterisation", {}).get(f"matmul_{precision}_tflops")
    if measured:
        return float(measured), "measured"
    return physics.peak_tflops(gpu_spec(gpu), precision), "datasheet"


def achieved(root: str | Path) -> pd.DataFrame:
    """ok rows of every file under ``root`` with their achieved TFLOP/s and fraction of the peak."""
    frames = []
    for path in schema.dataset_files(root):
        rows = schema.read_file(path)
        rows = rows[rows["status"] == "ok"]
        if rows.empty:
            continue
        op = rows["op"].iloc[0]
        configs = schema.op_frame(rows, op)
        cols = {c: configs[c].to_numpy(dtype=float) for c in schema.OP_CONFIG_COLUMNS[op]}
        flops = physics.flops(op, cols, configs["phase"].to_numpy())
        for precision, part in configs.assign(flops=flops).groupby("precision"):
            peak, kind = _peak_tflops(path, precision, part["gpu"].iloc[0])
            tflops = part["flops"] / (part["time_ms"] * 1e-3) / 1e12
            frames.append(part.assign(tflops=tflops, fraction=tflops / peak, peak_kind=kind))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def tables(rows: pd.DataFrame) -> str:
    keys = ["gpu", "source", "op", "precision", "phase"]
    decade = pd.cut(rows["time_ms"], DECADES_MS, labels=DECADE_NAMES, right=False)
    counts = rows.assign(decade=decade).pivot_table(index=keys, columns="decade", values="config_id",
                                                    aggfunc="count", fill_value=0, observed=False)
    frac = rows.groupby(keys).agg(rows=("fraction", "size"), median_fraction=("fraction", "median"),
                                  p90_fraction=("fraction", lambda f: f.quantile(0.9)),
                                  above_half=("fraction", lambda f: (f > HALF).mean()),
                                  peak=("peak_kind", "first"))
    lines = ["## Rows per decade of measured time", "", markdown_table(counts.reset_index()), "",
             "## Achieved fraction of the matmul peak", "",
             f"`above_half`: share of rows above {HALF:.0%} of the peak (`peak`: measured by the sweep, or the "
             "registry's datasheet rate for imported sources).", "", markdown_table(frac.reset_index(), 2)]
    gemm = rows[rows["op"].isin(["linear", "bmm"]) & rows["precision"].isin(["bf16", "fp16"])]
    if not gemm.empty:
        share = gemm.groupby(["gpu", "source"])["fraction"].apply(lambda f: (f > HALF).mean())
        lines += ["", "## bf16/fp16 GEMMs (linear, bmm): share of rows above half of the peak", "",
                  markdown_table((100 * share).rename("above_half_%").reset_index())]
    return "\n".join(lines)


def plot(rows: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own = rows[rows["source"] == "own"]
    gemm = own[own["gpu"].eq("h200") & own["op"].isin(["linear", "bmm"])]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    bins = np.linspace(0, 1.1, 23)
    for (op, precision), sub in gemm.groupby(["op", "precision"]):  # sorted by (op, precision)
        if len(sub) >= 20:
            axes[0].hist(sub["fraction"].clip(upper=1.09), bins=bins, histtype="step", label=f"{op} {precision}")
    axes[0].axvline(HALF, color="grey", ls=":")
    axes[0].set(xlabel="achieved fraction of the measured matmul peak", ylabel="rows (h200)",
                title="How close to peak the H200 rows run")
    axes[0].legend(fontsize=7)
    for gpu, sub in own.groupby("gpu"):
        axes[1].hist(np.log10(sub["time_ms"] * 1e3), bins=np.linspace(0, 5, 26), histtype="step", label=gpu)
    axes[1].set(xlabel="log10 measured time (us)", ylabel="rows", title="Where the measured times lie")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="datasets")
    parser.add_argument("--out", default="reports")
    args = parser.parse_args(argv)
    rows = achieved(args.root)
    if rows.empty:
        print(f"--root: no ok rows under {args.root}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = tables(rows)
    (out / "coverage.md").write_text(f"# Dataset coverage\n\nGenerated by `python benchmarks/coverage.py --root "
                                     f"{args.root}`.\n\n![coverage](coverage.png)\n\n{text}\n")
    plot(rows, out / "coverage.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
