"""Why do AIConfigurator's H100 bf16 linear times run about 0.9x ours on the same configs? Time each config of a list
(``m,n,k`` CSV: ``F.linear(x[m, k], W[n, k])``, bf16, no bias) on this GPU three ways:

- ``ours``: the collector's method (``pipeline.timing.measure``, default settings: 100 ms warm-up, reps queued
  behind a busy-wait kernel);
- ``graph_cold``: AIConfigurator's method as its collector describes it: six copies of the layer, each with its own
  weights, run in turn inside one CUDA graph; a few warm-up replays, then the replays are timed; time / 6;
- ``graph_warm``: the same graph after 100 ms of back-to-back replays (the GPU at its sustained clock).

If ``graph_cold`` runs about 0.9x ``ours``, the gap is the method (clock or L2 state); if all three agree, the
published times come from a faster host or software stack. Writes ``<out>/graph_method_check.csv`` and prints the
median ratios per time band, also as ``<out>/graph_method_check.md``. Needs a CUDA GPU.

``--pick`` (no GPU) writes the config list first: every AIConfigurator config of ``--gpu`` that our own sweep of that
GPU also measured (bf16 forward, no bias), with both times, plus ``--random`` more AIConfigurator configs of 0.02-5 ms.

    python benchmarks/graph_method_check.py --pick configs.csv --gpu h100-sxm
    python benchmarks/graph_method_check.py --configs configs.csv --out checks/
    python benchmarks/graph_method_check.py --summarize checks/graph_method_check.csv --out reports/gpu_checks/
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.atomic import atomic_write  # noqa: E402
from pipeline.markdown import markdown_table  # noqa: E402
from pipeline.timing import TimingSettings, measure  # noqa: E402

COPIES = 6
SHAPE = ["batch", "in_features", "out_features"]   # m, k, n of F.linear


def pick(root: Path, gpu: str, random_configs: int, seed: int = 0) -> pd.DataFrame:
    """AIConfigurator's configs that our sweep of ``gpu`` shares (``own_sweep_ms`` set), then random ones (0.02-5 ms,
    the six weight copies under 20 GB)."""
    from pipeline.schema import read_dataset

    published = read_dataset(root / "external" / f"gpu={gpu}")
    published = published[(published["source"] == "aiconfigurator") & (published["status"] == "ok")]
    own = read_dataset(root / f"gpu={gpu}")
    own = own[(own["op"] == "linear") & (own["precision"] == "bf16") & (own["phase"] == "forward")
              & (own["status"] == "ok") & (own["bias"] == False)]  # noqa: E712 (nullable column)
    shared = published.merge(own[SHAPE + ["time_ms"]], on=SHAPE, suffixes=("", "_own")).drop_duplicates(SHAPE)
    m, k, n = (published[c] for c in SHAPE)
    gigabytes = 2 * (m * k + COPIES * k * n + m * n) / 1e9
    rest = published[published["time_ms"].between(0.02, 5) & (gigabytes < 20)]
    rest = rest.merge(shared[SHAPE], on=SHAPE, how="left", indicator=True)
    rest = rest[rest["_merge"] == "left_only"]
    rest = rest.sample(min(random_configs, len(rest)), random_state=seed)
    frames = [pd.DataFrame({"m": f["batch"], "n": f["out_features"], "k": f["in_features"],
                            "published_ms": f["time_ms"], "own_sweep_ms": f.get("time_ms_own", np.nan)})
              for f in (shared, rest)]
    return pd.concat(frames, ignore_index=True).astype({"m": int, "n": int, "k": int})


def summary(result: pd.DataFrame, edges=(0, 0.05, 0.2, 1, 5, np.inf)) -> pd.DataFrame:
    """Median ratio of each method (and the published time) to ours, per band of our time in ms."""
    band = pd.cut(result["ours_ms"], list(edges))
    ratios = {"graph_cold/ours": result["graph_cold_ms"] / result["ours_ms"],
              "graph_warm/ours": result["graph_warm_ms"] / result["ours_ms"]}
    for col in ("published_ms", "own_sweep_ms"):
        if col in result:
            ratios[f"{col.removesuffix('_ms')}/ours"] = result[col] / result["ours_ms"]
    table = pd.DataFrame(ratios).groupby(band, observed=True).median().round(3)
    table.insert(0, "configs", result.groupby(band, observed=True).size())
    return table


def graph_ms(layers, x, warm_ms: float, replays: int = 20) -> float:
    import torch
    import torch.nn.functional as F

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for w in layers:   # warm cuBLAS's workspace and heuristics outside the capture
            F.linear(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in layers:
            F.linear(x, w)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    if warm_ms > 0:
        end = time.perf_counter() + warm_ms / 1000
        while time.perf_counter() < end:
            graph.replay()
            torch.cuda.synchronize()
    begin, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        graph.replay()
    stop.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(stop) / replays / COPIES


def check(configs: pd.DataFrame) -> pd.DataFrame:
    import torch
    import torch.nn.functional as F

    rows = []
    for m, n, k in configs[["m", "n", "k"]].itertuples(index=False):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        layers = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(COPIES)]
        ours = measure(functools.partial(F.linear, x, layers[0]), "cuda", TimingSettings()).median_ms
        cold = graph_ms(layers, x, 0.0)
        warm = graph_ms(layers, x, 100.0)
        rows.append({"m": m, "n": n, "k": k, "ours_ms": ours, "graph_cold_ms": cold, "graph_warm_ms": warm})
        del x, layers
    return pd.DataFrame(rows)


def report(result: pd.DataFrame, device: str) -> str:
    """The check as markdown: the median ratios per band, and over all configs."""
    bands = summary(result)
    overall = summary(result, (0, np.inf)).rename(index=lambda _: "all")
    table = pd.concat([bands, overall]).reset_index(names="ours_ms band")
    table["configs"] = table["configs"].astype(int)
    return "\n".join([
        f"# bf16 linear: our timing against AIConfigurator's, on {device}", "",
        "`python benchmarks/graph_method_check.py --configs configs.csv` (configs from `--pick`). Median ratios of",
        "each time to ours (`pipeline.timing.measure`): `graph_cold`/`graph_warm` are AIConfigurator's method (a",
        "CUDA graph of six weight copies; a few warm-up replays, or 100 ms of them), `published` its published time",
        "for the config, `own_sweep` our sweep's earlier time.", "",
        markdown_table(table.astype({"ours_ms band": str}), 3), ""])


def write_report(result: pd.DataFrame, device: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "graph_method_check.md", report(result, device))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", help="CSV with columns m, n, k (and optionally published_ms, own_sweep_ms)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--pick", metavar="CSV", help="write the config list here (no GPU needed) and exit")
    ap.add_argument("--gpu", default="h100-sxm", help="with --pick: the registry label whose data to pair")
    ap.add_argument("--root", default="datasets", help="with --pick: the datasets folder (after make import)")
    ap.add_argument("--random", type=int, default=90, help="with --pick: random AIConfigurator configs to add")
    ap.add_argument("--summarize", metavar="CSV", help="write the markdown of an earlier run's CSV (no GPU) and exit")
    ap.add_argument("--device", help="with --summarize: the GPU the CSV was measured on (default: its device column)")
    args = ap.parse_args(argv)
    if args.summarize:
        result = pd.read_csv(args.summarize)
        device = args.device or (result["device"].iloc[0] if "device" in result else None)
        if not device:
            raise SystemExit("--summarize: the CSV has no device column; name the GPU with --device")
        write_report(result, device, Path(args.out))
        return
    if args.pick:
        configs = pick(Path(args.root), args.gpu, args.random)
        if configs.empty:
            raise SystemExit(f"--pick: no AIConfigurator rows for gpu={args.gpu} under {args.root}/external")
        Path(args.pick).parent.mkdir(parents=True, exist_ok=True)
        configs.to_csv(args.pick, index=False)
        print(f"{len(configs)} configs ({configs['own_sweep_ms'].notna().sum()} shared with our sweep) -> {args.pick}")
        return
    if not args.configs:
        raise SystemExit("give --configs CSV (or --pick CSV to write one)")
    configs = pd.read_csv(args.configs)
    missing = {"m", "n", "k"} - set(configs.columns)
    if missing:
        raise SystemExit(f"--configs: missing columns {sorted(missing)}")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("graph_method_check needs a CUDA GPU")
    result = check(configs)
    for col in configs.columns.difference(["m", "n", "k"]):
        result[col] = configs[col].to_numpy()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result["device"] = torch.cuda.get_device_name()
    result.to_csv(out / "graph_method_check.csv", index=False)
    write_report(result, result["device"].iloc[0], out)
    print(f"{result['device'].iloc[0]}: median ratios by our time (ms)")
    print(summary(result).to_string())


if __name__ == "__main__":
    main()
