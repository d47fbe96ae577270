"""Two GPUs of our own measurements, config for config: how their times compare, and how well the shipped scalers
carry a time measured on one (origin) over to the other (dest).

The collector draws the same seeded configs on every GPU, so rows of two own labels pair on (config_id, precision,
phase). Per op and precision it reports the measured dest/origin ratio and the error of each way to get the dest's
time: the model alone (``predict``), the calibrated transfer (``transfer``), Habitat's ratio (``scale``), and the
origin's time unchanged. Writes a markdown table and a plot of measured against predicted ratios.

    python benchmarks/paired_gpus.py --origin h200 --dest h100-sxm --ops linear,bmm --out reports/paired_gpus

``--versions lstm=18`` uses that published version of an op's scaler instead of its champion: one trained before
the dest's rows existed tests the carry on a GPU the scaler never saw.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import load_scaler, schema  # noqa: E402
from pipeline.atomic import atomic_write, atomic_write_with  # noqa: E402
from pipeline.gpus import gpu_spec  # noqa: E402
from pipeline.markdown import markdown_table as md_table  # noqa: E402

KEYS = ["config_id", "precision", "phase"]
WAYS = ("model", "transfer", "scale", "origin")


def ok_rows(root: Path, gpu: str, op: str) -> pd.DataFrame:
    files = sorted((root / f"gpu={gpu}" / f"op={op}").glob("*.parquet"))
    if not files:
        raise ValueError(f"--origin/--dest: no rows of {op} under {root}/gpu={gpu}")
    frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    return frame[frame["status"] == "ok"].drop_duplicates(KEYS, keep="last")


def paired(root: Path, origin: str, dest: str, op: str) -> pd.DataFrame:
    cols = list(schema.OP_CONFIG_COLUMNS[op])
    a = ok_rows(root, origin, op)[KEYS + cols + ["time_ms"]].rename(columns={"time_ms": "origin_ms"})
    b = ok_rows(root, dest, op)[KEYS + ["time_ms"]].rename(columns={"time_ms": "dest_ms"})
    return a.merge(b, on=KEYS)


def parse_versions(text: str) -> dict[str, int]:
    """``"lstm=18,conv2d=30"`` -> ``{"lstm": 18, "conv2d": 30}``."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        op, sep, version = item.partition("=")
        if not sep or not version.isdigit() or op not in schema.OPS:
            raise ValueError(f"--versions: expected op=version pairs with op in {list(schema.OPS)}, got {item!r}")
        out[op] = int(version)
    return out


def carried(pairs: pd.DataFrame, op: str, origin: str, dest: str, scaler=None) -> pd.DataFrame:
    """The four ways' dest times per pair (the model runs once per precision and phase); ``scaler=None`` loads the
    op's champion."""
    scaler = load_scaler(op) if scaler is None else scaler
    weight = scaler.ratio_weight or 0.0
    cols = list(schema.OP_CONFIG_COLUMNS[op])
    out = pairs.copy()
    for (precision, phase), group in pairs.groupby(["precision", "phase"]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            [(times, _flags)] = scaler.carry(group[cols].reset_index(drop=True), group["origin_ms"].to_numpy(),
                                             origin, [dest], precision, phase, weights=[0.0, weight, 1.0])
        out.loc[group.index, "model"], out.loc[group.index, "transfer"], out.loc[group.index, "scale"] = times
    out["origin"] = out["origin_ms"]
    return out


def summary(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    rows = []
    for key, g in frame.groupby(by):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        row["pairs"] = len(g)
        row["measured dest/origin (median)"] = f"{np.median(g['dest_ms'] / g['origin_ms']):.3f}"
        for way in WAYS:
            err = (g[way] - g["dest_ms"]).abs() / g["dest_ms"]
            row[f"{way} mean %"] = f"{100 * err.mean():.1f}"
        for way in ("model", "scale"):
            row[f"{way} pred/meas (median)"] = f"{np.median(g[way] / g['dest_ms']):.3f}"
        rows.append(row)
    return pd.DataFrame(rows)


def spec_line(origin: str, dest: str) -> str:
    a, b = gpu_spec(origin), gpu_spec(dest)
    peaks = ", ".join(f"{p} {b[f'{p}_tflops'] / a[f'{p}_tflops']:.2f}" for p in ("fp32", "tf32", "bf16"))
    bandwidth = b["memory_bandwidth_gbps"] / a["memory_bandwidth_gbps"]
    return (f"Registry, {dest} / {origin}: memory bandwidth {bandwidth:.2f}, "
            f"peak rate {peaks}, SMs {b['sm_count']} / {a['sm_count']}. A ratio of 1 means the op is bound by "
            f"compute, one near the bandwidth ratio by memory.")


def plot(frames: dict[str, pd.DataFrame], origin: str, dest: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(frames), figsize=(5.5 * len(frames), 4.5), squeeze=False)
    for ax, (op, f) in zip(axes[0], frames.items()):
        for precision, g in f.groupby("precision"):
            ax.scatter(g["origin_ms"], g["dest_ms"] / g["origin_ms"], s=4, alpha=0.5, label=f"{precision} measured")
        ax.scatter(f["origin_ms"], f["transfer"] / f["origin_ms"], s=2, c="k", alpha=0.25, label="transfer (all)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axhline(1.0, c="grey", lw=0.8)
        ax.set_xlabel(f"time on {origin} (ms)")
        ax.set_ylabel(f"{dest} / {origin}")
        ax.set_title(op)
        ax.legend(fontsize=7, markerscale=3)
    fig.tight_layout()
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="datasets")
    ap.add_argument("--origin", default="h200")
    ap.add_argument("--dest", default="h100-sxm")
    ap.add_argument("--ops", default="linear,bmm")
    ap.add_argument("--min-ms", type=float, default=0.05, help="the second table keeps pairs at least this long")
    ap.add_argument("--out", default="reports/paired_gpus", help="writes <out>.md and <out>.png")
    ap.add_argument("--versions", default="", help="op=version pairs (default: each op's champion)")
    args = ap.parse_args(argv)
    root, out = Path(args.root), Path(args.out)
    versions = parse_versions(args.versions)
    scalers = {op: load_scaler(op, versions.get(op)) for op in args.ops.split(",")}
    frames = {op: carried(paired(root, args.origin, args.dest, op), op, args.origin, args.dest, scaler)
              for op, scaler in scalers.items()}
    everything = pd.concat([f.assign(op=op) for op, f in frames.items()], ignore_index=True)
    if everything.empty:
        raise ValueError(f"no config pairs between {args.origin} and {args.dest} in {args.ops}")
    long = everything[everything["dest_ms"] >= args.min_ms]
    used = ", ".join(f"{op} v{scaler.version}" for op, scaler in scalers.items())
    text = "\n".join([
        f"# {args.dest} from {args.origin}: own paired measurements",
        "",
        f"Generated by `python benchmarks/paired_gpus.py --origin {args.origin} --dest {args.dest} --ops {args.ops}"
        + (f" --versions {args.versions}" if versions else "")
        + f"` (scalers {used}). Rows `ok` on both GPUs, paired by config, precision and phase. Mean absolute "
        f"error of the {args.dest} time from: the model alone (`predict`), the calibrated transfer of the "
        f"{args.origin} time (`transfer`), Habitat's ratio (`scale`), and the {args.origin} time unchanged.",
        "",
        spec_line(args.origin, args.dest),
        "",
        "## By op and precision (both phases)",
        "",
        md_table(summary(everything, ["op", "precision"])),
        "",
        f"## Ops of {args.min_ms * 1000:g} us or more on {args.dest}",
        "",
        md_table(summary(long, ["op", "precision"])),
        "",
        "## By op and phase",
        "",
        md_table(summary(everything, ["op", "phase"])),
        "",
        f"![measured and transferred ratios]({out.name}.png)",
        "",
    ])
    plot(frames, args.origin, args.dest, out.with_suffix(".png"))
    atomic_write(out.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
