"""The collective model's report: ``reports/collectives.md`` and ``collectives.png`` (bus bandwidth vs size)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipeline.atomic import atomic_write, atomic_write_with
from pipeline.collectives.fit import busbw_gbps, load_rows, predict_rows
from pipeline.collectives.model import CollectiveModel
from pipeline.markdown import markdown_table

__all__ = ["write_report"]


def _params_table(model: CollectiveModel) -> pd.DataFrame:
    rows = []
    for kind, table in (("class", model.classes), ("system", model.systems)):
        for key, p in sorted(table.items()):
            rows.append({"fit": kind, "name": key, "rows": p.rows, "crowding": p.crowding,
                         "protocols (latency us, step us, efficiency)": "; ".join(
                             f"{q.latency_us:.1f}, {q.step_latency_us:.2f}, {q.efficiency:.3f}"
                             for q in p.protocols)})
    if model.network is not None:
        q = model.network.protocols[0]
        rows.append({"fit": "network", "name": "across nodes", "rows": model.network.rows, "crowding": 0.0,
                     "protocols (latency us, step us, efficiency)":
                         f"{q.latency_us:.1f}, {q.step_latency_us:.2f}, {q.efficiency:.3f}"})
    return pd.DataFrame(rows)


def _peak_table(rows: pd.DataFrame, model: CollectiveModel, networks: dict) -> pd.DataFrame:
    """All-reduce bus bandwidth at each system's largest size per GPU count: measured and modelled."""
    out = []
    ar = rows[rows["collective"] == "all_reduce"]
    for (system, n, nodes), sub in ar.groupby(["system", "n_gpus", "nodes"]):
        big = sub[sub["bytes"] == sub["bytes"].max()].iloc[[0]]
        params = model.systems.get(system)
        if params is None:
            continue
        pred = predict_rows(big, params, model.correction, big["interconnect"].iloc[0], model.network, networks)
        out.append({"system": system, "n_gpus": int(n), "nodes": int(nodes), "MB": big["bytes"].iloc[0] / 1e6,
                    "measured GB/s": float(busbw_gbps(big, big["time_ms"])[0]),
                    "model GB/s": float(busbw_gbps(big, pred)[0])})
    return pd.DataFrame(out)


def _plot(rows: pd.DataFrame, model: CollectiveModel, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ar = rows[(rows["collective"] == "all_reduce") & (rows["nodes"] == 1)]
    systems = sorted(ar["system"].unique())
    cols = min(4, len(systems))
    fig, axes = plt.subplots(-(-len(systems) // cols), cols, figsize=(4.2 * cols, 3.2 * -(-len(systems) // cols)),
                             squeeze=False)
    for ax, system in zip(axes.flat, systems):
        sub = ar[ar["system"] == system]
        sub = sub[sub["dtype"] == sub["dtype"].mode().iloc[0]]
        for n, part in sub.groupby("n_gpus"):
            part = part.sort_values("bytes")
            pred = predict_rows(part, model.systems[system], model.correction, part["interconnect"].iloc[0])
            line = ax.plot(part["bytes"], busbw_gbps(part, pred), lw=1.2, label=f"{n} GPUs")[0]
            ax.plot(part["bytes"], busbw_gbps(part, part["time_ms"]), "o", ms=3, color=line.get_color())
        ax.set_xscale("log")
        ax.set_title(f"{system} ({sub['dtype'].iloc[0]})", fontsize=9)
        ax.set_xlabel("bytes", fontsize=8)
        ax.set_ylabel("all-reduce bus GB/s", fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(systems):]:
        ax.axis("off")
    fig.suptitle("all-reduce bus bandwidth: measured (points) and the fitted model (lines)", fontsize=10)
    fig.tight_layout()
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def write_report(model: CollectiveModel, tables: dict[str, pd.DataFrame], roots, out="reports",
                 loaded: tuple[pd.DataFrame, dict[str, float]] | None = None) -> list[Path]:
    """``<out>/collectives.md`` and ``collectives.png``; ``loaded``: ``load_rows(roots)`` if already read."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, networks = load_rows(roots) if loaded is None else loaded
    data = rows.groupby(["source", "system"]).agg(
        rows=("config_id", "size"), gpu_counts=("n_gpus", lambda s: ",".join(map(str, sorted(set(s))))),
        nodes=("nodes", "max"), min_KB=("bytes", lambda s: s.min() / 1e3), max_MB=("bytes", lambda s: s.max() / 1e6)
    ).reset_index()
    ho = tables["held_out_systems"].merge(tables["held_out_systems_learned"][["system", "mean_ape"]], on="system",
                                          how="left", suffixes=("", "_with_correction"))
    corr = model.meta.get("correction", {})
    text = "\n\n".join([
        "# Collective model: latency + bytes / bus bandwidth, per interconnect class",
        f"Fitted {model.meta.get('fitted')} by `{model.meta.get('command')}` on {model.meta.get('rows')} rows "
        f"(fingerprint {model.meta.get('fingerprint')}); parameters in `conf/collectives_model.yaml`. Model: "
        "`pipeline/collectives/model.py`; fit and held-out tests: `pipeline/collectives/fit.py`.",
        "## Data\n\n" + markdown_table(data),
        "## Parameters\n\nPer protocol regime (NCCL's LL / LL128 / Simple: the model takes the fastest), the "
        "latency, the latency per ring step and the share of the link's bandwidth reached; crowding shrinks the "
        "bandwidth as `(n/2)^-crowding`.\n\n" + markdown_table(_params_table(model), 2),
        "## Held out: systems the class never saw\n\nEach system predicted by its class fitted on the other systems "
        "(as a GPU without collective data is predicted from its registry fields), mean/median/p90 absolute % "
        "error over its rows, without and with the learned correction:\n\n" + markdown_table(ho),
        f"Learned correction kept: **{corr.get('kept')}** (held-out mean absolute error "
        f"{corr.get('held_out_mean_ape_without', float('nan')):.1f} % without, "
        f"{corr.get('held_out_mean_ape_with', float('nan')):.1f} % with).",
        "## Held out: message sizes\n\nEvery third size of each system predicted by that system's fit on the "
        "others:\n\n" + markdown_table(tables["held_out_sizes"]),
        "## In sample\n\nEach system with its own fit (multi-node rows with the network fit):\n\n"
        + markdown_table(tables["in_sample"]),
        "## All-reduce bus bandwidth at the largest size\n\n" + markdown_table(_peak_table(rows, model, networks)),
        "![bus bandwidth](collectives.png)"])
    md = out / "collectives.md"
    atomic_write(md, text + "\n")
    return [md, _plot(rows, model, out / "collectives.png")]
