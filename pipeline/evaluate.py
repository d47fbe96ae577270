"""The evaluation report: ``python -m pipeline.evaluate [op=bmm] [overrides]`` (``make evaluate``).

Per op, on every dataset under ``data.root`` (configuration ``conf/evaluate.yaml``):

- leave-one-GPU-out: for every training GPU a model retrained without it (``pipeline.training.runner.fit``, with
  the settings under ``logo``) predicts that GPU; absolute % error per GPU, against the plain roofline;
- Habitat-style ratio error for every origin -> destination pair: ``measured(origin) * model(dest) /
  model(origin)`` against ``measured(dest)`` on the (config, precision, phase) rows both GPUs measured, with the
  model trained without the destination GPU;
- errors by precision and phase;
- in-distribution error of the published champion on the held-out config split (the H200 especially), and on
  the never-trained-on source (real-model shapes, on GPUs partly unseen);
- the targets and NeuSight's published unseen-GPU errors next to these numbers;
- the prediction API's latency and batch throughput on this machine.

Every prediction goes through the prediction API (``pipeline.api.Scaler``), the code users run. Writes
``<report_dir>/evaluation.md``, PNG plots and ``evaluation.json`` (atomically), and logs them with the metrics to
MLflow (experiment ``pipeline-evaluate``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import math
import os
import platform
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from pipeline import api, checkpoint as ck, gpus as G
from pipeline.schema import OP_CONFIG_COLUMNS, OPS

ERROR_DEFINITION = "absolute % error |predicted / measured - 1| x 100 per row; MAPE = its mean"


# --------------------------------------------------------------------------------------------- helpers

def _atomic_write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _summ(errors) -> dict:
    e = np.asarray(errors, dtype=float)
    if e.size == 0:
        return {"n": 0}
    return {"n": int(e.size), "mape": float(e.mean()), "median_ape": float(np.median(e)),
            "p90_ape": float(np.percentile(e, 90))}


def _ape(pred, true) -> np.ndarray:
    return np.abs(np.asarray(pred, float) / np.asarray(true, float) - 1.0) * 100.0


def _num(value: float, digits: int = 1) -> str:
    """A percentage for a table: fixed point, or scientific when a blown-up prediction makes it huge."""
    if not math.isfinite(value):
        return "inf" if value > 0 else "n/a"
    return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:.1e}"


def _pct(value, digits: int = 1) -> str:
    return "n/a" if value is None else f"{_num(float(value), digits)} %"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v):
        if isinstance(v, (float, np.floating)):
            return _num(float(v))
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=Path(__file__).resolve().parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha or "unknown") + (" (with uncommitted changes)" if dirty else "")


def _supported(gpu: str, precision: str) -> bool:
    try:
        return G.supports_precision(G.gpu_spec(gpu), precision)
    except ValueError:
        return False


# ------------------------------------------------------------------------------- predictions via the API

def scaler_from_fit(op: str, res, table) -> api.Scaler:
    """An in-memory (unpublished) API Scaler of a ``runner.fit`` result; ranges from its training rows."""
    from pipeline.training.publish import ranges

    card = {**res.card_core, "ranges": ranges(table.X[res.masks["train"]], list(res.card_core["features"]["names"])),
            "op": op, "version": 0}
    return api.Scaler(op, 0, card, res.weights)


def supported_rows(table, idx: np.ndarray) -> np.ndarray:
    """The subset of row indices whose precision the row's GPU can run (the API refuses the others)."""
    sub = table.frame.iloc[idx]
    ok = np.ones(len(idx), dtype=bool)
    for (gpu, prec), pos in sub.groupby(["gpu", "precision"], sort=False).indices.items():
        if not _supported(gpu, prec):
            ok[pos] = False
    return idx[ok]


def api_predict(scaler: api.Scaler, table, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(predicted ms, out-of-range flags) of table rows ``idx`` through ``Scaler.predict``."""
    cols = list(OP_CONFIG_COLUMNS[table.op])
    sub = table.frame.iloc[idx]
    pred = np.empty(len(idx))
    flags = np.zeros(len(idx), dtype=bool)
    for (gpu, prec, phase), pos in sub.groupby(["gpu", "precision", "phase"], sort=False).indices.items():
        pred[pos], flags[pos] = scaler.predict(sub.iloc[pos][cols], G.gpu_spec(gpu), prec, phase, return_flags=True)
    return pred, flags


def roofline_ms(table, idx: np.ndarray) -> np.ndarray:
    from pipeline import features as F

    sub = table.frame.iloc[idx]
    out = np.empty(len(idx))
    for (gpu, prec, phase), pos in sub.groupby(["gpu", "precision", "phase"], sort=False).indices.items():
        out[pos] = F.roofline_ms(table.op, sub.iloc[pos], G.gpu_spec(gpu), prec, phase)
    return out


# ------------------------------------------------------------------------------------ leave-one-GPU-out

def balanced_subsample(table, holdout: str, max_rows: int | None, seed: int):
    """A copy of ``table`` whose training-domain rows outside ``holdout`` are cut to ``max_rows`` in total, each
    GPU keeping min(its rows, a common cap) (so GPUs with few rows keep all of them); other rows stay."""
    from pipeline.training.data import OpTable

    if not max_rows:
        return table
    dom = (table.frame["domain"].to_numpy() == "train") & (table.frame["gpu"].to_numpy() != holdout)
    if dom.sum() <= max_rows:
        return table
    rng = np.random.default_rng(seed)
    keep = ~dom
    groups = table.frame[dom].groupby("gpu").indices
    index = np.flatnonzero(dom)
    counts = sorted(len(v) for v in groups.values())
    cap, left, remaining = 0, max_rows, len(counts)
    for c in counts:  # water-filling: the largest cap with sum(min(n_g, cap)) <= max_rows
        if c * remaining <= left:
            left -= c
            remaining -= 1
            cap = c
        else:
            cap = left // remaining
            break
    else:
        cap = counts[-1]
    for pos in groups.values():
        rows = index[pos]
        keep[rng.choice(rows, cap, replace=False) if len(rows) > cap else rows] = True
    return OpTable(op=table.op, frame=table.frame[keep].reset_index(drop=True), X=table.X[keep], y=table.y[keep],
                   target_kind=table.target_kind, dropped=dict(table.dropped), split_cfg=dict(table.split_cfg))


def logo_gpus(cfg, table) -> list[str]:
    dom = table.frame[table.frame["domain"] == "train"]
    counts = dom["gpu"].value_counts()
    gpus = sorted(g for g, n in counts.items() if n >= int(cfg.logo.min_rows))
    spec = cfg.logo.gpus
    if isinstance(spec, str) and spec != "all":
        spec = [spec]
    if not isinstance(spec, str):
        gpus = [g for g in gpus if g in list(spec)]
    return gpus if len(table.training_gpus()) >= 2 else []


def run_logo(cfg, op: str, table) -> dict:
    """One retrain per held-out GPU; its errors on that GPU, and the ratio errors with it as destination."""
    from pipeline.training.runner import fit

    out: dict[str, Any] = {"gpus": {}, "rows": [], "ratio_rows": [], "skipped_precision_rows": 0,
                           "api_vs_training_numpy_max_rel_diff": 0.0}
    from pipeline import features as F
    from pipeline.training.evaluate import predict_rows

    t_start = time.perf_counter()
    keys = ["config_id", "precision", "phase"]
    dom_all = table.frame["domain"].to_numpy() == "train"
    by_gpu = {}  # gpu -> (median time per (config, precision, phase), the first table row of each)
    for gpu_label, part in table.frame[dom_all].groupby("gpu", sort=True):
        first = part.reset_index().drop_duplicates(keys).set_index(keys)["index"]
        by_gpu[gpu_label] = (part.groupby(keys, sort=False)["time_ms"].median(), first)
    for gpu in logo_gpus(cfg, table):
        sub = balanced_subsample(table, gpu, cfg.logo.max_train_rows, int(cfg.seed))
        t0 = time.perf_counter()
        res = fit(cfg, op, sub, holdout=[gpu], kind="evaluate-leave-gpu-out", max_epochs=int(cfg.logo.max_epochs))
        seconds = time.perf_counter() - t0
        scaler = scaler_from_fit(op, res, sub)
        # --- direct: predict the held-out GPU (all its rows in the full table)
        idx_all = np.flatnonzero(dom_all & (table.frame["gpu"].to_numpy() == gpu))
        idx = supported_rows(table, idx_all)
        out["skipped_precision_rows"] += int(len(idx_all) - len(idx))
        pred, flags = api_predict(scaler, table, idx)
        true = table.frame["time_ms"].to_numpy(float)[idx]
        roof = roofline_ms(table, idx)
        # consistency: the API against the training code's numpy twin on the same rows
        twin = predict_rows(table, idx, scaler.card, res.weights)
        diff = float(np.max(np.abs(pred / twin - 1.0))) if len(idx) else 0.0
        out["api_vs_training_numpy_max_rel_diff"] = max(out["api_vs_training_numpy_max_rel_diff"], diff)
        frame = table.frame.iloc[idx][["config_id", "source", "gpu", "precision", "phase", "split", "time_ms"]].copy()
        frame["pred_ms"], frame["ape"], frame["roof_ape"], frame["flag"] = pred, _ape(pred, true), _ape(roof, true), \
            flags
        out["rows"].append(frame)
        trained_on = sorted(set(sub.frame.loc[res.masks["train"], "gpu"]))
        out["gpus"][gpu] = {**_summ(frame["ape"]), "roofline_mape": _summ(frame["roof_ape"]).get("mape"),
                            "out_of_range_fraction": float(flags.mean()) if len(flags) else 0.0,
                            "train_rows": int(res.masks["train"].sum()), "trained_on": trained_on,
                            "epochs": int(res.epochs), "best_epoch": int(res.best_epoch),
                            "seconds": round(seconds, 1), "mlflow_run_id": res.run_id}
        g = out["gpus"][gpu]
        print(f"{op} leave-{gpu}-out: n={g['n']} MAPE {_pct(g.get('mape'))} (roofline alone "
              f"{_pct(g['roofline_mape'])}); {g['train_rows']} training rows, {g['epochs']} epochs, "
              f"{seconds:.0f} s", flush=True)
        # --- ratio: every origin -> this destination, with the model that never saw the destination
        dest_med, _ = by_gpu[gpu]
        for origin in sorted(set(by_gpu) - {gpu}):
            src_med, src_first = by_gpu[origin]
            common = src_med.index.intersection(dest_med.index)
            if len(common) == 0:
                continue
            both = pd.DataFrame({"time_ms": src_med.loc[common].to_numpy(), "dest_ms": dest_med.loc[common].to_numpy(),
                                 "first": src_first.loc[common].to_numpy()})
            both["precision"] = common.get_level_values("precision")
            both["phase"] = common.get_level_values("phase")
            ok = np.array([_supported(origin, p) and _supported(gpu, p) for p in both["precision"]], dtype=bool)
            out["skipped_precision_rows"] += int((~ok).sum())
            both = both[ok].reset_index(drop=True)
            if both.empty:
                continue
            configs = table.frame.loc[both["first"].to_numpy(), list(OP_CONFIG_COLUMNS[op])].reset_index(drop=True)
            scaled = np.empty(len(both))
            roof_scaled = np.empty(len(both))
            o_spec, d_spec = G.gpu_spec(origin), G.gpu_spec(gpu)
            for (prec, phase), pos in both.groupby(["precision", "phase"], sort=False).indices.items():
                cfgs = configs.iloc[pos]
                measured = both["time_ms"].to_numpy()[pos]
                scaled[pos] = scaler.scale(cfgs, measured, o_spec, d_spec, prec, phase, return_flags=True)[0]
                roof_scaled[pos] = measured * (F.roofline_ms(op, cfgs, d_spec, prec, phase)
                                               / F.roofline_ms(op, cfgs, o_spec, prec, phase))
            out["ratio_rows"].append(pd.DataFrame({
                "origin": origin, "dest": gpu, "precision": both["precision"], "phase": both["phase"],
                "ape": _ape(scaled, both["dest_ms"]), "roof_ape": _ape(roof_scaled, both["dest_ms"])}))
    out["computed"] = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    out["errors"] = pd.concat(out.pop("rows"), ignore_index=True) if out["rows"] else pd.DataFrame()
    out["ratio"] = pd.concat(out.pop("ratio_rows"), ignore_index=True) if out["ratio_rows"] else pd.DataFrame()
    return out


def ratio_matrix(ratio: pd.DataFrame, min_rows: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(MAPE matrix origin x dest, row counts); pairs with fewer than ``min_rows`` rows are NaN."""
    if ratio.empty:
        return pd.DataFrame(), pd.DataFrame()
    grouped = ratio.groupby(["origin", "dest"])["ape"]
    mape = grouped.mean().unstack("dest")
    n = grouped.size().unstack("dest").fillna(0).astype(int)
    gpus = sorted(set(mape.index) | set(mape.columns))
    mape = mape.reindex(index=gpus, columns=gpus)
    n = n.reindex(index=gpus, columns=gpus).fillna(0).astype(int)
    return mape.where(n >= min_rows), n


# ----------------------------------------------------------------------------------- champion evaluation

def run_champion(cfg, op: str, table) -> dict:
    """The published champion on the held-out config split (per GPU) and on the never-trained-on source."""
    root = Path(cfg.checkpoints_dir)
    version = ck.champion_version(root, op) if (root / op).exists() else None
    if version is None:  # nothing published yet: a reduced fit on every training GPU stands in, labelled so
        from pipeline.training.runner import fit

        sub = balanced_subsample(table, None, cfg.logo.max_train_rows, int(cfg.seed))
        res = fit(cfg, op, sub, holdout=[], kind="evaluate-main", max_epochs=int(cfg.logo.max_epochs))
        scaler = scaler_from_fit(op, res, sub)
        out: dict[str, Any] = {"available": True, "published": False, "version": None,
                               "trained_gpus": sorted(set(sub.frame.loc[res.masks["train"], "gpu"])),
                               "epochs": int(res.epochs), "train_rows": int(res.masks["train"].sum())}
    else:
        scaler = api.load_scaler(op, root=root)
        card = scaler.card
        salt = ((card.get("training_data") or {}).get("split") or {}).get("salt")
        out = {"available": True, "published": True, "version": scaler.version, "created": card.get("created"),
               "trained_gpus": sorted((card.get("training_data") or {}).get("gpus", [])),
               "split_salt": salt, "table_split_salt": table.split_cfg.get("salt"),
               # the training run's own leave-GPU-out passes (full data, longer), as published in the card
               "card_leave_gpu_out": {g: {"mape": (v.get("all") or {}).get("mape"), "n": (v.get("all") or {}).get("n"),
                                          "epochs": v.get("epochs")}
                                      for g, v in ((card.get("metrics") or {}).get("leave_gpu_out") or {}).items()
                                      if isinstance(v, Mapping)}}
    if out["published"] and out["split_salt"] not in (None, table.split_cfg.get("salt")):
        out["test"] = None
        out["why_no_test"] = (f"the champion was split with salt {out['split_salt']!r}, the data here with "
                              f"{table.split_cfg.get('salt')!r}: its test configs are not known")
    frames = {}
    for role, mask in (("test", (table.frame["domain"] == "train") & (table.frame["split"] == "test")),
                       ("unseen", table.frame["domain"] == "unseen")):
        if role == "test" and "why_no_test" in out:
            continue
        idx_all = np.flatnonzero(mask.to_numpy())
        idx = supported_rows(table, idx_all)
        if len(idx) == 0:
            frames[role] = pd.DataFrame()
            continue
        pred, flags = api_predict(scaler, table, idx)
        f = table.frame.iloc[idx][["config_id", "source", "gpu", "precision", "phase", "time_ms"]].copy()
        f["pred_ms"], f["ape"], f["flag"] = pred, _ape(pred, f["time_ms"]), flags
        f["roof_ape"] = _ape(roofline_ms(table, idx), f["time_ms"])
        frames[role] = f
    out["frames"] = frames
    return out


# --------------------------------------------------------------------------------------------- plots

def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    _plt().close(fig)
    return buf.getvalue()


def logo_png(op: str, gpus: Mapping[str, dict], target: float | None, neusight: float | None) -> bytes:
    plt = _plt()
    names = list(gpus)
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(names) + 2), 4.2), layout="constrained")
    x = np.arange(len(names))
    ax.bar(x - 0.2, [gpus[g].get("mape", np.nan) for g in names], 0.4, label="MLP (trained without that GPU)")
    ax.bar(x + 0.2, [gpus[g].get("roofline_mape", np.nan) for g in names], 0.4, label="roofline alone", alpha=0.6)
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target:g} %")
    if neusight is not None:
        ax.axhline(neusight, color="r", ls=":", lw=1, label=f"NeuSight unseen-GPU {neusight:g} %")
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("mean absolute % error")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_title(f"{op}: leave-one-GPU-out error per held-out GPU")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def ratio_png(op: str, mape: pd.DataFrame, n: pd.DataFrame) -> bytes:
    plt = _plt()
    k = len(mape)
    fig, ax = plt.subplots(figsize=(1.0 * k + 3, 0.8 * k + 2.5), layout="constrained")
    data = mape.to_numpy(dtype=float)
    im = ax.imshow(np.where(np.isfinite(data), data, np.nan), cmap="viridis_r",
                   vmin=0, vmax=max(10.0, float(np.nanpercentile(data, 95)) if np.isfinite(data).any() else 10.0))
    for i in range(k):
        for j in range(k):
            if np.isfinite(data[i, j]):
                ax.text(j, i, f"{data[i, j]:.1f}", ha="center", va="center", fontsize=7,
                        color="w" if data[i, j] > 0.6 * im.get_clim()[1] else "k")
    ax.set_xticks(range(k), mape.columns, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(k), mape.index, fontsize=8)
    ax.set_xlabel("destination (held out of training)")
    ax.set_ylabel("origin (measured)")
    ax.set_title(f"{op}: ratio-scaling MAPE (%), origin -> destination")
    fig.colorbar(im, ax=ax, label="mean absolute % error")
    return _png(fig)


# -------------------------------------------------------------------------------------------- API speed

_SPEED_SNIPPET = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy, pandas
t1 = time.perf_counter()
import pipeline
s = pipeline.load_scaler(sys.argv[1], root=sys.argv[2])
s.predict(json.loads(sys.argv[3]), "h100", return_flags=True)
t2 = time.perf_counter()
heavy = [m for m in ("torch", "lightning", "pytorch_lightning", "mlflow", "hydra") if m in sys.modules]
print(json.dumps({"numpy_pandas_s": t1 - t0, "import_load_predict_s": t2 - t1, "heavy": heavy}))
"""


def api_speed(op: str, root: Path, table, batch_rows: int) -> dict:
    """Cold-process import+load+first-prediction latency, and batch predictions per second."""
    cols = list(OP_CONFIG_COLUMNS[op])
    one = {c: (bool(v) if isinstance(v, (bool, np.bool_)) else int(v))
           for c, v in table.frame.iloc[0][cols].items()}
    runs = []
    for _ in range(3):
        res = subprocess.run([sys.executable, "-c", _SPEED_SNIPPET, op, str(root), json.dumps(one)],
                             capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
        if res.returncode != 0:
            return {"error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "failed"}
        runs.append(json.loads(res.stdout))
    best = min(runs, key=lambda r: r["import_load_predict_s"])
    scaler = api.load_scaler(op, root=root)
    rng = np.random.default_rng(0)
    pool = table.frame[cols]
    batch = pool.iloc[rng.integers(0, len(pool), batch_rows)].reset_index(drop=True)
    scaler.predict(batch.iloc[:1000], "h100", return_flags=True)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        scaler.predict(batch, "h100", "fp32", "forward", return_flags=True)
        times.append(time.perf_counter() - t)
    n_params = int(sum(np.prod(w.shape) for w in ck.load(root, op, scaler.version)[1].values()))
    return {"numpy_pandas_import_s": best["numpy_pandas_s"], "import_load_predict_s": best["import_load_predict_s"],
            "heavy_modules": best["heavy"], "batch_rows": batch_rows,
            "predictions_per_s": batch_rows / min(times), "hidden": scaler.card["architecture"]["hidden"],
            "activation": scaler.card["architecture"]["activation"], "n_parameters": n_params,
            "weights_bytes": (root / op / f"v{scaler.version}" / ck.WEIGHTS_FILE).stat().st_size}


# -------------------------------------------------------------------------------------------- report

def _by(frame: pd.DataFrame, keys: list[str]) -> list[list]:
    rows = []
    if frame is None or frame.empty:
        return rows
    for key, part in frame.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        s = _summ(part["ape"])
        rows.append([*key, s["n"], s["mape"], s["median_ape"], s["p90_ape"]])
    return rows


def evaluate_op(cfg, op: str) -> dict:
    from pipeline.training.data import OpTable

    t0 = time.perf_counter()
    data_cfg = _container(cfg.data)
    table = OpTable.load(Path(cfg.data.root), op, data_cfg)
    result: dict[str, Any] = {"op": op, "rows": int(len(table.frame)),
                              "rows_by_domain": table.frame["domain"].value_counts().to_dict() if len(table.frame)
                              else {}}
    if table.frame.empty or not (table.frame["domain"] == "train").any():
        result["skipped"] = f"no usable {op} rows under {cfg.data.root}/"
        return result
    result["gpus"] = table.training_gpus()
    result["rows_by_gpu"] = table.frame[table.frame["domain"] == "train"]["gpu"].value_counts().sort_index().to_dict()
    cache = _logo_cache_dir(cfg, op, table)
    logo = _load_logo_cache(cache) if cache is not None else None
    if logo is None:
        logo = run_logo(cfg, op, table)
        if cache is not None:
            _save_logo_cache(cache, logo)
    else:
        logo["reused_from_cache"] = True
        print(f"{op}: leave-one-GPU-out results reused from {cache} (same data, settings and code)", flush=True)
    result["logo"] = logo
    result["champion"] = run_champion(cfg, op, table)
    result["seconds"] = time.perf_counter() - t0
    return result


# ----------------------------------------------------------------------------- leave-one-GPU-out cache
# The retrains are the slow part and do not depend on the champion: their results are kept under
# ``logo.cache_dir`` keyed by a sha256 of the data fingerprint, every setting that shapes a retrain, and the code
# version, so re-running the report after a new champion is published skips them. Files are written into a temp
# folder and renamed; a manifest of sha256 sums is verified on load (a mismatch recomputes).

_CACHE_FILES = ("gpus.json", "errors.parquet", "ratio.parquet")
_LOGO_CACHE_VERSION = 1  # bump when run_logo's results change meaning (this module is not hashed, its report is)


def _logo_cache_dir(cfg, op: str, table) -> Path | None:
    where = cfg.logo.get("cache_dir")
    if not where:
        return None
    from pipeline import features as F
    from pipeline.training.data import fingerprint

    domain = table.frame[table.frame["domain"] == "train"]
    key = {"op": op, "data": fingerprint(domain), "gpus": sorted(domain["gpu"].unique()), "seed": int(cfg.seed),
           "logo": {k: v for k, v in _container(cfg.logo).items() if k != "cache_dir"},
           "model": _container(cfg.model), "optimizer": _container(cfg.optimizer), "fit": _container(cfg.fit),
           "trainer": _container(cfg.trainer), "data": _container(cfg.data), "threads": cfg.get("threads"),
           "features_version": getattr(F, "FEATURES_VERSION", None), "code": _code_digest()}
    digest = ck.sha256_bytes(json.dumps(key, sort_keys=True, default=str).encode())[:20]
    return Path(where) / f"{op}-{digest}"


def _code_digest() -> str:
    """sha256 over the source of the modules a retrain's result depends on (plus ``_LOGO_CACHE_VERSION``)."""
    here = Path(__file__).resolve().parent
    parts = [here / "features.py", here / "api.py", here / "gpus.py", *sorted((here / "training").glob("*.py"))]
    h = hashlib.sha256(f"run_logo v{_LOGO_CACHE_VERSION}".encode())
    for path in parts:
        if path.exists():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _save_logo_cache(directory: Path, logo: Mapping) -> None:
    blobs = {"gpus.json": json.dumps({k: v for k, v in logo.items() if not isinstance(v, pd.DataFrame)},
                                     sort_keys=True).encode()}
    for name, key in (("errors.parquet", "errors"), ("ratio.parquet", "ratio")):
        buf = io.BytesIO()
        logo[key].to_parquet(buf, index=False)
        blobs[name] = buf.getvalue()
    blobs["SHA256SUMS"] = "".join(f"{ck.sha256_bytes(d)}  {n}\n" for n, d in sorted(blobs.items())).encode()
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        for name, data in blobs.items():
            _atomic_write(tmp / name, data)
        if directory.exists():
            import shutil

            shutil.rmtree(directory)
        os.rename(tmp, directory)
    finally:
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def _load_logo_cache(directory: Path) -> dict | None:
    try:
        sums = dict(reversed(line.split("  ", 1)) for line in (directory / "SHA256SUMS").read_text().splitlines())
        blobs = {name: (directory / name).read_bytes() for name in _CACHE_FILES}
    except (OSError, ValueError):
        return None
    if any(sums.get(name) != ck.sha256_bytes(data) for name, data in blobs.items()):
        print(f"{directory}: checksum mismatch, recomputing", flush=True)
        return None
    logo = json.loads(blobs["gpus.json"])
    logo["errors"] = pd.read_parquet(io.BytesIO(blobs["errors.parquet"]))
    logo["ratio"] = pd.read_parquet(io.BytesIO(blobs["ratio.parquet"]))
    return logo


def _container(cfg) -> dict:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with the training extra
        pass
    return dict(cfg)


def write_report(cfg, results: dict[str, dict], speed: dict[str, dict], seconds: float
                 ) -> tuple[dict[str, bytes], dict[str, dict]]:
    """(the Markdown report, PNGs and JSON as {file name: bytes}, the summary); all numbers come from ``results``."""
    files: dict[str, bytes] = {}
    targets = _container(cfg.targets)
    neusight = _container(cfg.neusight_unseen_gpu_mape)
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    ops = [op for op in results if "skipped" not in results[op]]
    md = [f"# Evaluation report", "",
          f"Generated {now} by `python -m pipeline.evaluate` at commit {_git_commit()}, in {seconds / 60:.1f} min on "
          f"{os.cpu_count()} CPU cores ({platform.machine()}). Data: every dataset under `{cfg.data.root}/` "
          f"(sources excluded from training: {', '.join(_container(cfg.data).get('exclude_sources') or []) or 'none'}). "
          f"Error: {ERROR_DEFINITION}.", ""]
    skipped = {op: r["skipped"] for op, r in results.items() if "skipped" in r}
    if skipped:
        md += ["Ops without data (not evaluated): " + "; ".join(f"{op}: {why}" for op, why in skipped.items()), ""]

    # ---- how
    model = _container(cfg.model)
    md += ["## How these numbers were made", "",
           f"- **Leave-one-GPU-out**: for every training GPU with at least {cfg.logo.min_rows} rows of the op, a "
           f"model is retrained without that GPU and predicts all of its rows. The retrains are *reduced* so that "
           f"the report runs on a small CPU machine: at most {cfg.logo.max_epochs} epochs (early stopping after "
           f"{cfg.fit.patience} epochs without validation improvement), and at most "
           f"{cfg.logo.max_train_rows if cfg.logo.max_train_rows else 'all'} training rows (a GPU-balanced random "
           f"subsample: every GPU keeps min(its rows, a common cap)); same architecture as training "
           f"(hidden {model.get('hidden')}, {model.get('activation')}, {model.get('loss')} loss). The published "
           f"models train longer on all rows; where the champion's card holds the training run's own "
           f"leave-GPU-out pass for a GPU (full data, more epochs), it is shown next to the retrain here.",
           "- **Ratio (Habitat-style) scaling**: for every origin -> destination pair, on the (config, precision, "
           "phase) rows both GPUs measured (median over duplicate measurements), the prediction is "
           "`measured(origin) x model(dest) / model(origin)`, using the model retrained *without the destination*; "
           f"pairs with fewer than {cfg.ratio.min_rows} common rows are left blank. Origins are GPUs the model "
           "saw, as in Habitat's use (you measured your op on your GPU).",
           "- **In-distribution**: the published champion (`checkpoints/<op>/champion.json`) on the configs "
           "hashed into the test split (never trained on, on GPUs it trained on), and on the excluded source "
           "(real-model layer shapes, partly on GPUs absent from training).",
           "- All predictions run through the prediction API (`pipeline.api.Scaler`), with precisions a GPU "
           "cannot run (per `conf/gpus.yaml`) skipped; *roofline alone* is the model-free baseline "
           "`max(flops / peak, bytes / bandwidth)` (or its ratio).", ""]

    # ---- summary vs targets
    md += ["## Summary against the targets", ""]
    rows = []
    summary: dict[str, dict] = {}
    for op in ops:
        r = results[op]
        logo = r["logo"]["gpus"]
        logo_mean = float(np.mean([v["mape"] for v in logo.values() if v.get("n")])) if logo else None
        mape, n = ratio_matrix(r["logo"]["ratio"], int(cfg.ratio.min_rows))
        ratio_mean = float(np.nanmean(mape.to_numpy())) if not mape.empty and np.isfinite(mape.to_numpy()).any() \
            else None
        ch = r["champion"]
        test = ch.get("frames", {}).get("test") if ch.get("available") else None
        test_mape = _summ(test["ape"]).get("mape") if test is not None and not test.empty else None
        h200 = test[test["gpu"] == "h200"] if test is not None and not test.empty else None
        h200_mape = _summ(h200["ape"]).get("mape") if h200 is not None and not h200.empty else None
        t_logo = targets["logo"].get(op)
        card_logo = [v["mape"] for v in (ch.get("card_leave_gpu_out") or {}).values() if v.get("mape") is not None]
        card_logo_mean = float(np.mean(card_logo)) if card_logo and ch.get("published") else None
        summary[op] = {"logo_mean_mape": logo_mean, "logo_target": t_logo, "ratio_mean_mape": ratio_mean,
                       "card_logo_mean_mape": card_logo_mean, "card_logo_gpus": len(card_logo),
                       "ratio_target": targets["ratio"], "test_mape": test_mape, "h200_test_mape": h200_mape,
                       "h200_target": targets["h200_heldout"], "neusight_unseen_gpu_mape": neusight.get(op)}

        def verdict(value, goal):
            return "n/a" if value is None or goal is None else ("met" if value <= goal else "missed")

        rows.append([op, f"{_pct(logo_mean)} ({verdict(logo_mean, t_logo)}, <= {t_logo:g} %)"
                     + (f"; training run's own passes ({len(card_logo)} GPU{'s' if len(card_logo) != 1 else ''}): "
                           f"{_pct(card_logo_mean)}"
                        if card_logo_mean is not None else ""),
                     f"{_pct(ratio_mean)} ({verdict(ratio_mean, targets['ratio'])}, <= {targets['ratio']:g} %)",
                     _pct(test_mape) + ((f" (champion v{ch['version']})" if ch.get("published") else
                                         " (reduced fit, no champion)") if ch.get("available") else ""),
                     (f"{_pct(h200_mape)} ({verdict(h200_mape, targets['h200_heldout'])}, "
                      f"<= {targets['h200_heldout']:g} %)") if h200_mape is not None else "no H200 rows",
                     _pct(neusight.get(op)) if neusight.get(op) is not None else "-"])
    md += [_md_table(["op", "leave-one-GPU-out (mean over GPUs)", "ratio scaling (mean over pairs)",
                      "in-distribution test split", "H200 held-out configs", "NeuSight unseen-GPU"], rows)]
    md += ["NeuSight's figures are from its paper (ASPLOS'25) on its own unseen-GPU set; ours are on the GPUs in "
           "this dataset, so the comparison is indicative, not like-for-like.", ""]
    if not any(summary[op]["h200_test_mape"] is not None for op in ops):
        md += ["No H200 measurements are in the dataset yet (`make collect GPU=h200` on an H200 host adds them), "
               "so the H200 held-out target could not be checked.", ""]

    # ---- per op
    for op in ops:
        r = results[op]
        logo = r["logo"]
        md += [f"## {op}", "",
               f"{r['rows']} rows ({', '.join(f'{k}: {v}' for k, v in r['rows_by_domain'].items())}); training GPUs "
               f"(rows): {', '.join(f'{g} ({n})' for g, n in r['rows_by_gpu'].items())}. Evaluated in "
               f"{r['seconds'] / 60:.1f} min" + (" (retrains reused from the cache)" if logo.get("reused_from_cache")
                                                 else "") + ".", ""]
        md += [f"### Leave-one-GPU-out", ""]
        if logo.get("gpus"):
            md += [f"{len(logo['gpus'])} retrains, computed {logo.get('computed')} in {logo.get('seconds', 0) / 60:.1f} min"
                   + (" (reused from the cache: same data, settings and code)" if logo.get("reused_from_cache") else "")
                   + ".", ""]
        if logo["gpus"]:
            t = targets["logo"].get(op)
            card_logo = (r["champion"].get("card_leave_gpu_out") or {}) if r["champion"].get("published") else {}

            def card_cell(g):
                c = card_logo.get(g) or {}
                return "-" if c.get("mape") is None else f"{_num(float(c['mape']))} ({c.get('epochs')} ep.)"

            trows = [[g, v["n"], v["mape"], v["median_ape"], v["p90_ape"], v["roofline_mape"],
                      f"{100 * v['out_of_range_fraction']:.0f} %", v["train_rows"], v["epochs"],
                      "met" if t is not None and v["mape"] <= t else "missed"] + ([card_cell(g)] if card_logo else [])
                     for g, v in logo["gpus"].items() if v.get("n")]
            md += [_md_table(["held-out GPU", "rows", "MAPE %", "median %", "p90 %", "roofline alone MAPE %",
                              "rows outside training ranges", "training rows", "epochs", f"target <= {t:g} %"]
                             + ([f"training run's own pass, MAPE % (champion v{r['champion']['version']} card)"]
                                if card_logo else []), trows)]
            name = f"{op}_leave_one_gpu_out.png"
            files[name] = logo_png(op, logo["gpus"], t, neusight.get(op))
            md += [f"![{op} leave-one-GPU-out]({name})", ""]
            md += ["By precision and phase (all held-out rows pooled):", "",
                   _md_table(["precision", "phase", "rows", "MAPE %", "median %", "p90 %"],
                             _by(logo["errors"], ["precision", "phase"]))]
        else:
            md += ["Not run: the op has fewer than two training GPUs with enough rows.", ""]
        md += ["### Ratio scaling (origin -> destination)", ""]
        mape, n = ratio_matrix(logo["ratio"], int(cfg.ratio.min_rows))
        if not mape.empty and np.isfinite(mape.to_numpy()).any():
            name = f"{op}_ratio_matrix.png"
            files[name] = ratio_png(op, mape, n)
            vals = mape.stack()
            roof = logo["ratio"].groupby(["origin", "dest"])["roof_ape"].mean()
            md += [f"Mean over {len(vals)} pairs: {_pct(float(vals.mean()))} (median pair {_pct(float(vals.median()))}; "
                   f"roofline-ratio alone on the same pairs: {_pct(float(roof.reindex(vals.index).mean()))}). "
                   f"Best pair {vals.idxmin()[0]} -> {vals.idxmin()[1]} {_pct(float(vals.min()))}, worst "
                   f"{vals.idxmax()[0]} -> {vals.idxmax()[1]} {_pct(float(vals.max()))}.", "",
                   f"![{op} ratio matrix]({name})", "",
                   "MAPE % per pair (rows: origin, columns: destination; blank: too few common rows):", "",
                   _md_table(["origin \\ dest", *mape.columns],
                             [[o, *["" if not np.isfinite(v) else _num(float(v)) for v in mape.loc[o]]] for o in mape.index]),
                   "By precision and phase (all pairs pooled):", "",
                   _md_table(["precision", "phase", "rows", "MAPE %", "median %", "p90 %"],
                             _by(logo["ratio"], ["precision", "phase"]))]
        else:
            md += [f"No origin/destination pair shares {cfg.ratio.min_rows} or more measured rows.", ""]
        md += ["### In-distribution: held-out configs, and the never-trained-on source", ""]
        ch = r["champion"]
        if not ch.get("available"):
            md += [f"Not evaluated: {ch['why']}.", ""]
        else:
            if ch.get("published"):
                md += [f"Champion v{ch['version']} (created {ch.get('created')}), trained on: "
                       f"{', '.join(ch['trained_gpus']) or 'n/a'}.", ""]
            else:
                md += [f"No champion was published under `{cfg.checkpoints_dir}/{op}` when this report ran, so a "
                       f"model fitted here with the reduced settings above ({ch['train_rows']} training rows, "
                       f"{ch['epochs']} epochs) stands in; trained on: {', '.join(ch['trained_gpus'])}.", ""]
            test = ch["frames"].get("test")
            if "why_no_test" in ch:
                md += [f"Held-out configs: not evaluated ({ch['why_no_test']}).", ""]
            elif test is not None and not test.empty:
                md += ["Held-out configs (test split) per GPU:", "",
                       _md_table(["gpu", "rows", "MAPE %", "median %", "p90 %"], _by(test, ["gpu"])),
                       "By precision and phase:", "",
                       _md_table(["precision", "phase", "rows", "MAPE %", "median %", "p90 %"],
                                 _by(test, ["precision", "phase"]))]
            unseen = ch["frames"].get("unseen")
            if unseen is not None and not unseen.empty:
                rows_u = []
                for g, part in unseen.groupby("gpu", sort=True):
                    s = _summ(part["ape"])
                    rows_u.append([g, "yes" if g in ch["trained_gpus"] else "no (unseen GPU)", s["n"], s["mape"],
                                   s["median_ape"], _summ(part["roof_ape"])["mape"]])
                md += ["Never-trained-on source (real-model layer shapes) per GPU:", "",
                       _md_table(["gpu", "GPU in training", "rows", "MAPE %", "median %", "roofline alone MAPE %"],
                                 rows_u)]
        if logo.get("skipped_precision_rows"):
            md += [f"{logo['skipped_precision_rows']} rows were skipped because the GPU has no path for their "
                   "precision in `conf/gpus.yaml` (the API refuses those).", ""]
        md += [f"Consistency check: the API and the training code's numpy forward agree to "
               f"{logo['api_vs_training_numpy_max_rel_diff']:.1e} (max relative difference) on the held-out rows.",
               ""]

    # ---- API speed
    if speed:
        md += ["## Prediction API speed (measured here)", "",
               f"Measured on this machine ({os.cpu_count()} CPU cores, shared), with each published champion. "
               "Latency: a fresh Python process, `import pipeline` + `load_scaler` (sha256 checks included) + one "
               "prediction, after `import numpy, pandas` (best of 3). Throughput: one `predict` call on a batch of "
               "configs (best of 3).", ""]
        srows = []
        for op, s in speed.items():
            if "error" in s:
                srows.append([op, "failed: " + s["error"], "", "", "", ""])
                continue
            srows.append([op, f"{1000 * s['import_load_predict_s']:.0f} ms", f"{1000 * s['numpy_pandas_import_s']:.0f} ms",
                          f"{s['predictions_per_s'] / 1e6:.2f} M/s", f"{s['hidden']} {s['activation']}",
                          f"{s['n_parameters']} ({s['weights_bytes'] / 1024:.0f} KiB)"])
        md += [_md_table(["op", "import + load + predict", "(numpy + pandas import)", "batch predictions/s",
                          "hidden layers", "parameters (weights file)"], srows)]
    md_text = "\n".join(md).rstrip() + "\n"
    files["evaluation.md"] = md_text.encode()

    def jsonable(o):
        if isinstance(o, pd.DataFrame):
            return None
        if isinstance(o, Mapping):
            return {str(k): jsonable(v) for k, v in o.items() if not isinstance(v, pd.DataFrame)}
        if isinstance(o, (list, tuple)):
            return [jsonable(v) for v in o]
        if isinstance(o, (np.integer,)):
            return int(o)
        if isinstance(o, (float, np.floating)):
            return float(o) if math.isfinite(float(o)) else None
        return o

    blob = {"generated": now, "commit": _git_commit(), "seconds": seconds, "summary": summary,
            "settings": {"logo": _container(cfg.logo), "ratio": _container(cfg.ratio), "model": model,
                         "targets": targets},
            "ops": {}, "speed": speed}
    for op in results:
        r = results[op]
        entry = {k: v for k, v in r.items() if k not in ("logo", "champion")}
        if "logo" in r:
            mape, n = ratio_matrix(r["logo"]["ratio"], int(cfg.ratio.min_rows))
            entry["leave_one_gpu_out"] = r["logo"]["gpus"]
            entry["ratio_matrix_mape"] = {o: {d: (None if not np.isfinite(v) else float(v)) for d, v in row.items()}
                                          for o, row in mape.iterrows()} if not mape.empty else {}
            entry["ratio_matrix_rows"] = {o: {d: int(v) for d, v in row.items()} for o, row in n.iterrows()} \
                if not n.empty else {}
        if "champion" in r:
            entry["champion"] = {k: v for k, v in r["champion"].items() if k != "frames"}
            for role, f in (r["champion"].get("frames") or {}).items():
                if f is not None and not f.empty:
                    entry["champion"][role] = {"all": _summ(f["ape"]),
                                               "by_gpu": {g: _summ(p["ape"]) for g, p in f.groupby("gpu")}}
        blob["ops"][op] = entry
    files["evaluation.json"] = (json.dumps(jsonable(blob), indent=2, sort_keys=True) + "\n").encode()
    return files, summary


def log_to_mlflow(cfg, files: Mapping[str, bytes], summary: Mapping, seconds: float) -> str | None:
    from pipeline.training import tracking as T

    logger_cfg = _container(cfg.logger) if cfg.get("logger") is not None else {}
    uri = T.resolve_tracking_uri(logger_cfg.get("tracking_uri"))
    c = T.client(uri)
    name = T.experiment_name("evaluate", logger_cfg.get("experiment_prefix", "pipeline-"))
    exp = c.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else c.create_experiment(
        name, artifact_location=T.resolve_artifact_location(logger_cfg.get("artifact_location", "mlruns")))
    run = c.create_run(exp_id, run_name="evaluation-report", tags={"pipeline.kind": "evaluate",
                                                                   "pipeline.commit": _git_commit()})
    rid = run.info.run_id
    try:
        c.log_param(rid, "ops", ",".join(summary))
        for key in ("max_epochs", "max_train_rows", "min_rows"):
            c.log_param(rid, f"logo.{key}", str(cfg.logo.get(key)))
        metrics = T.flatten({op: {k: v for k, v in s.items() if isinstance(v, (int, float)) and v is not None}
                             for op, s in summary.items()})
        metrics["seconds"] = seconds
        T.log_metrics(uri, rid, metrics)
        T.log_artifact_bytes(uri, rid, dict(files), "report")
        c.set_terminated(rid, "FINISHED")
    except Exception:
        c.set_terminated(rid, "FAILED")
        raise
    return rid


def run(cfg) -> dict:
    from pipeline.training.runner import resolve_ops

    ops = resolve_ops(cfg.op)
    t0 = time.perf_counter()
    results = {}
    for op in ops:
        print(f"\n=== evaluating {op}", flush=True)
        results[op] = evaluate_op(cfg, op)
        if "skipped" in results[op]:
            print(f"{op}: skipped ({results[op]['skipped']})", flush=True)
    speed = {}
    root = Path(cfg.checkpoints_dir)
    from pipeline.training.data import OpTable

    for op in ops:
        if "skipped" in results[op] or not results[op]["champion"].get("published"):
            continue
        table = OpTable.load(Path(cfg.data.root), op, _container(cfg.data))
        speed[op] = api_speed(op, root, table, int(cfg.speed.batch_rows))
    seconds = time.perf_counter() - t0
    files, summary = write_report(cfg, results, speed, seconds)
    out_dir = Path(cfg.report_dir)
    for name, data in files.items():
        _atomic_write(out_dir / name, data)
    print(f"\nwrote {out_dir / 'evaluation.md'} ({len(files)} files) in {seconds / 60:.1f} min", flush=True)
    if cfg.get("mlflow", True):
        rid = log_to_mlflow(cfg, files, summary, seconds)
        print(f"logged to MLflow run {rid}", flush=True)
    for op, s in summary.items():
        print(f"{op:>7}: leave-one-GPU-out {_pct(s['logo_mean_mape'])}, ratio {_pct(s['ratio_mean_mape'])}, "
              f"test {_pct(s['test_mape'])}, H200 {_pct(s['h200_test_mape'])}", flush=True)
    return {"results": results, "summary": summary, "speed": speed, "files": sorted(files)}


def _hydra_main():
    import hydra

    @hydra.main(version_base=None, config_path="../conf", config_name="evaluate")
    def main(cfg) -> None:
        run(cfg)

    return main


if __name__ == "__main__":
    _hydra_main()()
