"""The LightningDataModule of one op: standardised float32 features, targets, head inputs, row weights and
launch floors (as targets) in memory; batches are ``(z, y, aux, weight, y_floor)``, training batches with
``monotone`` also the rows' larger-batch pairs ``(z_larger, aux_larger, gain)`` (``pipeline.training.monotone``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from pipeline.training.data import GROUP_KEYS, OpTable

CONSTANT_FEATURE_STD = 1e9


class _IndexBatches:
    """A map-style dataset indexed by a whole batch of row indices (one tensor gather per batch)."""

    def __init__(self, *tensors: torch.Tensor):
        self.tensors = tensors

    def __len__(self):
        return len(self.tensors[0])

    def __getitem__(self, idx):
        return tuple(t[idx] for t in self.tensors)


def balance_weights(frame, mask: np.ndarray, exponent: float) -> np.ndarray:
    """Row weights ``n_group ** -exponent`` over the ``mask`` rows, groups = (source, GPU, precision, phase),
    scaled to mean 1: 0 weighs every row alike, 1 every group alike (a few hundred H200 rows then count as much
    as tens of thousands of public rows of one GPU)."""
    sub = frame.loc[mask, GROUP_KEYS]
    if not len(sub):
        return np.zeros(0)
    counts = sub.groupby(list(sub.columns), sort=False)["gpu"].transform("size").to_numpy(dtype=float)
    w = counts ** -float(exponent)
    return w / w.mean()


class OpDataModule(pl.LightningDataModule):
    """Rows of ``table`` without ``holdout_gpus``: train/val by the table's config split.

    Features are z-scored with the mean/std of the train rows (published in the card). Batches are drawn by a
    seeded sampler, so a run is reproducible.
    """

    def __init__(self, table: OpTable, holdout_gpus: Sequence[str] = (), batch_size: int = 1024, seed: int = 0,
                 eval_batch_size: int = 8192, balance: float = 0.0, monotone: bool = False,
                 monotone_elsewhere: bool = False):
        super().__init__()
        self.table = table
        self.holdout_gpus = tuple(holdout_gpus)
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size)
        self.seed = int(seed)
        self.balance = float(balance)
        self.monotone = bool(monotone)
        self.monotone_elsewhere = self.monotone and bool(monotone_elsewhere)
        self.masks = table.masks(self.holdout_gpus)
        train = self.masks["train"]
        if not train.any():
            raise ValueError(f"{table.op}: no training rows with GPUs {list(self.holdout_gpus)} held out; the data's "
                             f"training GPUs are {table.training_gpus()}: leaving a GPU out needs another GPU's rows "
                             "(the public measurements: make import)")
        Xt = table.X[train]
        self.mean = Xt.mean(axis=0)
        std = Xt.std(axis=0)
        # A feature without variance in training (e.g. a precision no training GPU ran) teaches the model
        # nothing: a huge std maps it to z ~ 0 everywhere, instead of feeding never-trained weights later.
        self.std = np.where(std > 1e-8, std, CONSTANT_FEATURE_STD)
        self._train = self._val = None

    def standardise(self, X: np.ndarray) -> np.ndarray:
        return ((X - self.mean) / self.std).astype(np.float32)

    def _dataset(self, mask: np.ndarray, pairs: bool = False) -> _IndexBatches:
        t = self.table
        tensors = [self.standardise(t.X[mask]), t.y[mask].astype(np.float32), t.aux[mask].astype(np.float32),
                   balance_weights(t.frame, mask, self.balance).astype(np.float32), self.floor_targets(mask)]
        if pairs:
            from pipeline.training.monotone import more_work_rows

            X, aux, gain = more_work_rows(t.subset(mask))
            tensors += [self.standardise(X), aux.astype(np.float32), gain.astype(np.float32)]
            if self.monotone_elsewhere:
                from pipeline.training.monotone import elsewhere_rows

                X_row, aux_row, X_big, aux_big, gain = elsewhere_rows(t.subset(mask))
                tensors += [self.standardise(X_row), aux_row.astype(np.float32), self.standardise(X_big),
                            aux_big.astype(np.float32), gain.astype(np.float32)]
        return _IndexBatches(*(torch.from_numpy(np.ascontiguousarray(a)) for a in tensors))

    def floor_targets(self, mask: np.ndarray) -> np.ndarray:
        """The launch floor of each row on the target's scale (``y + ln(floor / time)``; -inf where none)."""
        t = self.table
        ratio = t.floor_ms[mask] / t.frame["time_ms"].to_numpy(dtype=float)[mask]
        with np.errstate(invalid="ignore"):
            return np.where(np.isfinite(ratio), t.y[mask] + np.log(ratio), -np.inf).astype(np.float32)

    def setup(self, stage: str | None = None):
        if self._train is None:
            self._train = self._dataset(self.masks["train"], pairs=self.monotone)
            # A tiny dataset may have no val config: validate on train rows rather than not at all.
            val = self.masks["val"] if self.masks["val"].any() else self.masks["train"]
            self._val = self._dataset(val)

    def _loader(self, data: _IndexBatches, batch: int, shuffle: bool) -> DataLoader:
        if shuffle:
            sampler = RandomSampler(range(len(data)), generator=torch.Generator().manual_seed(self.seed))
        else:
            sampler = SequentialSampler(range(len(data)))
        return DataLoader(data, sampler=BatchSampler(sampler, batch, drop_last=False), batch_size=None,
                          num_workers=0)

    def train_dataloader(self):
        self.setup("fit")
        return self._loader(self._train, self.batch_size, shuffle=True)

    def val_dataloader(self):
        self.setup("fit")
        return self._loader(self._val, self.eval_batch_size, shuffle=False)
