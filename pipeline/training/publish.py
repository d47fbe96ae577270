"""The champion rules: whether a newly published version becomes the one ``load_scaler`` loads.

A new version is promoted automatically only when
1. there is no champion yet, or
2. the new model was trained on at least the champion's data coverage (every source/GPU pair of the champion's
   training data, with no fewer rows) AND beats the champion's error on the SAME evaluation: the new run's
   test split, with the champion loaded and run through the prediction API (``load_scaler``). The error is the
   mean over (source, GPU, precision, phase) groups of each group's mean absolute % error: every measured
   device, precision and phase counts once, as in the targets, so that 36k public bf16 rows of one GPU do not
   outvote a few hundred own rows of another precision. Groups with fewer than ``MIN_GROUP_ROWS`` test rows
   are pooled, per source, into one group: two fits of linear on nearly the same data differed by 2.1 points
   on average in such groups (5-7 rows each) against 0.5 in the larger ones, so 15 of them outvoted the rest
   (``reports/model_experiments.md``, section 12);
and 3. tripling the batch of a test config (300 drawn, seeded) is never predicted over ``MAX_SPEEDUP`` x
faster on a few reference GPUs and precisions (``more_work_faster``: more work of the same shape cannot take
much less time; the MLP can learn such a dip where it extrapolates, to a GPU or precision without data of that
op); rules 2 and 3 apply where a champion exists;
or 4. the new weights are the champion's own, bit for bit (a deterministic retrain on the same data): the same
model, and its newer card is what ``load_scaler`` should serve (a calibration the champion's card lacks, such as
``transfer``);
or when ``promote=true`` is given. Otherwise the version is published but not promoted, and the reason is
printed and recorded. So a retrain on less data (a fresh clone without the public data) never silently
replaces the champion, even if it happens to fit its own, smaller test split better.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pipeline import api
from pipeline import checkpoint as ck
from pipeline.evaluation.metrics import ape
from pipeline.evaluation.predictions import predict_rows
from pipeline.schema import OP_CONFIG_COLUMNS, PHASES
from pipeline.training.data import GROUP_KEYS
from pipeline.training.monotone import WORK_FACTOR

SCALE_CHECKS = (("h200", "bf16"), ("t4", "fp32"), ("a100", "tf32"))   # a Tensor-Core GPU, a small one, an old mode
MAX_SPEEDUP = 1.5     # at WORK_FACTOR x the batch (the training penalty's factor)
SCALE_CONFIGS = 300   # test configs checked
MIN_GROUP_ROWS = 30   # test groups with fewer rows are pooled per source (rule 2)
POOLED = "(pooled)"


@dataclass
class Decision:
    promote: bool
    reason: str
    champion_version: int | None = None
    champion_mape: float | None = None
    new_mape: float | None = None
    n_eval: int = 0

    def as_dict(self) -> dict:
        return {"promoted": self.promote, "reason": self.reason, "champion_version": self.champion_version,
                "champion_test_mape": self.champion_mape, "new_test_mape": self.new_mape, "n_eval": self.n_eval}


def coverage_gaps(champion_data: Mapping, new_data: Mapping) -> list[str]:
    """Source/GPU pairs the champion was trained on that the new training data lacks or has fewer rows of."""
    gaps = []
    old = champion_data.get("by_source_gpu", {}) or {}
    new = new_data.get("by_source_gpu", {}) or {}
    for key, entry in sorted(old.items()):
        rows_old = int(entry.get("rows", 0))
        rows_new = int(new.get(key, {}).get("rows", 0))
        if key not in new:
            gaps.append(f"{key} missing ({rows_old} rows in the champion's data)")
        elif rows_new < rows_old:
            gaps.append(f"{key} has {rows_new} rows < champion's {rows_old}")
    return gaps




def more_work_faster(scaler: api.Scaler, table, test_mask: np.ndarray) -> str | None:
    """Where tripling the batch of a test config is predicted over ``MAX_SPEEDUP`` x faster: a description of the
    worst case, or None."""
    columns = list(OP_CONFIG_COLUMNS[table.op])
    configs = table.frame.loc[np.asarray(test_mask, dtype=bool), columns].drop_duplicates()
    if configs.empty:
        return None
    configs = configs.sample(n=min(SCALE_CONFIGS, len(configs)), random_state=0).reset_index(drop=True)
    worst = (np.inf, "")
    for gpu, precision in SCALE_CHECKS:
        for phase in PHASES:
            base = scaler.predict(configs, gpu, precision, phase, return_flags=True)[0]
            more = scaler.predict(configs.assign(batch=configs["batch"] * WORK_FACTOR), gpu, precision, phase,
                                  return_flags=True)[0]
            ratio = np.where(np.isfinite(more / base), more / base, 0.0)   # a non-finite prediction fails too
            i = int(np.argmin(ratio))
            if ratio[i] < worst[0]:
                worst = (ratio[i], f"{gpu} {precision} {phase} {configs.iloc[i].to_dict()}")
    if worst[0] >= 1 / MAX_SPEEDUP:
        return None
    if worst[0] == 0:
        return f"a non-finite prediction ({worst[1]})"
    return f"tripling the batch is predicted {1 / worst[0]:.2f}x faster ({worst[1]})"


def group_mape(table, test_mask: np.ndarray, pred_ms: np.ndarray) -> float | None:
    """Mean over ``GROUP_KEYS`` groups of the test rows of each group's mean absolute % error; the groups of
    fewer than ``MIN_GROUP_ROWS`` rows of a source count as one group of that source."""
    test_mask = np.asarray(test_mask, dtype=bool)
    rows = table.frame.loc[test_mask, GROUP_KEYS].astype(str)
    if rows.empty:
        return None
    rows["ape"] = ape(pred_ms, table.frame["time_ms"].to_numpy(float)[test_mask])
    small = rows.groupby(GROUP_KEYS)["ape"].transform("size").to_numpy() < MIN_GROUP_ROWS
    rows.loc[small, [k for k in GROUP_KEYS if k != "source"]] = POOLED
    return float(rows.groupby(GROUP_KEYS)["ape"].mean().mean())


def _champion_mape(champion: api.Scaler, table, test_mask: np.ndarray) -> tuple[float | None, str | None]:
    """(the champion's group-mean test MAPE on ``test_mask`` rows, why it could not be computed)."""
    idx = np.flatnonzero(test_mask)
    if len(idx) == 0:
        return None, "the new run has no test rows"
    pred, _ = predict_rows(champion, table, idx)
    return group_mape(table, test_mask, pred), None


def _verdict(decision: Decision, gaps: list[str], cmp: str, min_improvement: float) -> Decision:
    current = decision.champion_version
    if gaps:
        decision.reason = (f"not promoted: trained on less data than champion v{current} ("
                           + "; ".join(gaps[:6]) + (f"; +{len(gaps) - 6} more" if len(gaps) > 6 else "")
                           + f"); {cmp}; pass promote=true to override")
    elif decision.champion_mape is None or decision.new_mape is None:
        decision.reason = f"not promoted: {cmp}; pass promote=true to override"
    elif decision.new_mape < decision.champion_mape * (1.0 - min_improvement):
        decision.promote, decision.reason = True, f"beats champion v{current}: {cmp}"
    else:
        decision.reason = f"not promoted: does not beat champion v{current}: {cmp}"
    return decision


def same_weights(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    """Whether two checkpoints' weights are identical: the same tensors, shapes, dtypes and values."""
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def decide(root, op: str, table, test_mask: np.ndarray, new_pred_ms: np.ndarray | None, new_data: Mapping,
           force: bool = False, min_improvement: float = 0.0, new_scaler: api.Scaler | None = None,
           new_weights: Mapping[str, np.ndarray] | None = None,
           champion: tuple[int, dict, Mapping[str, np.ndarray]] | None = None) -> Decision:
    """Apply the champion rules; evaluates the current champion on ``test_mask`` rows of ``table`` (and, given
    ``new_scaler``, the new model's predictions for more work: rule 3; given ``new_weights``, rule 4).

    ``new_pred_ms=None`` says the new model is the champion's weights republished (``new_weights`` required, and
    checked): its test predictions are the champion's, computed once. ``champion`` is ``(version, card,
    weights)`` as the caller loaded (and verified) them; used while that version is still the champion."""
    if new_pred_ms is None and new_weights is None:
        raise ValueError("decide: new_pred_ms=None needs new_weights (the champion's, republished)")
    new_mape = None if new_pred_ms is None else group_mape(table, test_mask, new_pred_ms)
    current = ck.champion_version(root, op)
    if current is None:
        return Decision(True, "no champion yet" + (" (promote=true given)" if force else ""), None, None, new_mape,
                        int(test_mask.sum()))
    try:
        card, weights = champion[1:] if champion and champion[0] == current else ck.load(root, op, current)
    except (ck.ChecksumError, ck.CheckpointError) as exc:
        if force:
            return Decision(True, f"promote=true given; current champion v{current} unreadable ({exc})", current)
        return Decision(False, f"current champion v{current} cannot be loaded ({exc}); not promoting without "
                               "promote=true", current, None, new_mape)
    try:
        champ_mape, why_not = _champion_mape(api.Scaler(op, current, card, weights), table, test_mask)
    except api.InputError as exc:  # trained by other code: other features or target
        champ_mape, why_not = None, f"the champion cannot be evaluated here ({exc})"
    if new_pred_ms is None:
        if not same_weights(new_weights, weights):
            raise ValueError(f"decide: new_pred_ms=None, but new_weights are not champion v{current}'s")
        new_mape = champ_mape
    decision = Decision(False, "", current, champ_mape, new_mape, int(test_mask.sum()))
    cmp = why_not
    if champ_mape is not None and new_mape is not None:
        cmp = (f"test MAPE (mean over source/GPU/precision/phase groups, those under {MIN_GROUP_ROWS} rows pooled "
               f"per source) on the same {decision.n_eval} rows: "
               f"new {new_mape:.2f} % vs champion v{current} {champ_mape:.2f} %")
    if force:
        decision.promote, decision.reason = True, f"promote=true given; {cmp}"
        return decision
    if new_weights is not None and same_weights(new_weights, weights):
        decision.promote = True
        decision.reason = (f"the weights of champion v{current}, bit for bit (the same model), republished with "
                           f"this run's card; {cmp}")
        return decision
    decision = _verdict(decision, coverage_gaps(card.get("training_data", {}), new_data), cmp, min_improvement)
    faster = more_work_faster(new_scaler, table, test_mask) if decision.promote and new_scaler else None
    if faster:
        decision.promote, decision.reason = False, f"not promoted: {faster}; {cmp}; pass promote=true to override"
    return decision
