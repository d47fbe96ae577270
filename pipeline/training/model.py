"""The per-op MLP (a LightningModule); the prediction API (``pipeline.api``) runs its exported weights.

Layers are named ``layers.<i>`` (``torch.nn.Linear``), so ``state_dict`` maps one-to-one onto the published
``layers.<i>.weight`` [out, in] / ``layers.<i>.bias`` tensors; the activation sits between layers. The last layer
has as many outputs as the target kind's head (``pipeline.targets.HEAD_OUTPUTS``); ``head`` turns them into the
target exactly as ``targets.output_to_target`` does in numpy (a test holds them together).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}
LATENCY_INIT_LOGIT = -3.0
"""Initial logit of the bounded head's latency output: sigmoid(-3) x 50 us = 2.4 us per kernel."""


def head(kind: str, out: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
    """Raw outputs (n, k) -> the target ``y`` of ``kind`` (``pipeline.targets``); ``aux`` = ``targets.aux``."""
    from pipeline.targets import U_MIN

    if kind == "bounded_utilisation":
        inv_u = -torch.log(U_MIN + (1.0 - U_MIN) * torch.sigmoid(out[:, 0]))
        return torch.logaddexp(inv_u, torch.log(aux) - nn.functional.softplus(-out[:, 1]))
    if kind == "neusight_utilisation":
        return nn.functional.softplus(-out[:, 0]) - torch.log1p(-torch.sigmoid(out[:, 1]) / aux)
    return out[:, 0]


class MLPRegressor(pl.LightningModule):
    """MLP on z-scored features whose head predicts the target of ``target`` (a ``pipeline.targets`` kind); loss on
    the log error (scale-free, MAPE-like) of ``max(prediction, the row's launch floor)`` (``data.launch_floors``),
    weighted per row. With ``monotone_weight`` > 0 and training batches that carry each row's larger-batch pair
    (``pipeline.training.monotone``), the loss adds that weight times the mean amount by which a larger batch is
    predicted faster.

    ``optimizer`` and ``scheduler`` are factories (Hydra ``_partial_: true`` targets): ``optimizer(params)``
    and ``scheduler(optimizer)``.
    """

    def __init__(self, n_features: int, target: str = "bounded_utilisation", hidden: Sequence[int] = (64, 64),
                 activation: str = "relu", dropout: float = 0.0, loss: str = "huber", huber_delta: float = 0.05,
                 optimizer: Callable | None = None, scheduler: Callable | None = None, monotone_weight: float = 0.0):
        super().__init__()
        from pipeline.targets import HEAD_OUTPUTS

        if activation not in ACTIVATIONS:
            raise ValueError(f"model.activation: {activation!r} is not one of {list(ACTIVATIONS)}")
        if loss not in ("huber", "l1", "mse"):
            raise ValueError(f"model.loss: {loss!r} is not one of ['huber', 'l1', 'mse']")
        if target not in HEAD_OUTPUTS:
            raise ValueError(f"model.target: {target!r} is not one of {list(HEAD_OUTPUTS)}")
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.target = target
        sizes = [int(n_features), *[int(h) for h in hidden], HEAD_OUTPUTS[target]]
        self.layers = nn.ModuleList(nn.Linear(sizes[i], sizes[i + 1]) for i in range(len(sizes) - 1))
        if target == "bounded_utilisation":  # start at a few microseconds per kernel, not half the maximum
            with torch.no_grad():
                self.layers[-1].bias[1] = LATENCY_INIT_LOGIT
        self.act = ACTIVATIONS[activation]()
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.activation = activation
        self.hidden = [int(h) for h in hidden]
        self._optimizer = optimizer
        self._scheduler = scheduler
        self._loss = loss
        self._delta = float(huber_delta)
        self.monotone_weight = float(monotone_weight)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Raw outputs (n, k)."""
        for i, layer in enumerate(self.layers):
            z = layer(z)
            if i < len(self.layers) - 1:
                z = self.drop(self.act(z))
        return z

    def _errors(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log error of each row, its weight, the predicted target): the error is of the prediction at least the
        row's launch floor, against the time."""
        z, y, aux, weight, y_floor = batch[:5]
        y_hat = head(self.target, self(z), aux)
        return torch.maximum(y_hat, y_floor) - y, weight, y_hat

    def _loss_fn(self, err: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self._loss == "huber":  # ~ L1 for big errors
            per_row = nn.functional.huber_loss(err, torch.zeros_like(err), reduction="none", delta=self._delta)
            per_row = per_row / self._delta
        elif self._loss == "l1":
            per_row = err.abs()
        else:
            per_row = err.square()
        return (per_row * weight).sum() / weight.sum()

    def training_step(self, batch, batch_idx):
        err, weight, y_hat = self._errors(batch)
        loss = self._loss_fn(err, weight)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(err))
        if self.monotone_weight > 0 and len(batch) > 5:
            from pipeline.training.monotone import penalty

            z_larger, aux_larger, gain = batch[5:8]
            worse = penalty(y_hat, head(self.target, self(z_larger), aux_larger), gain)
            if len(batch) > 8:  # the same pairs on GPUs the rows were not measured on
                z_row, aux_row, z_big, aux_big, gain_elsewhere = batch[8:]
                worse = worse + penalty(head(self.target, self(z_row), aux_row),
                                        head(self.target, self(z_big), aux_big), gain_elsewhere)
            self.log("train/monotone_penalty", worse, on_step=False, on_epoch=True, batch_size=len(err))
            loss = loss + self.monotone_weight * worse
        return loss

    def validation_step(self, batch, batch_idx):
        err, weight, _ = self._errors(batch)
        ape = torch.expm1(err).abs()  # |predicted/measured - 1|: absolute relative error of the time
        n = len(err)
        self.log("val/loss", self._loss_fn(err, weight), on_step=False, on_epoch=True, batch_size=n)
        self.log("val/mape", (ape * weight).sum() / weight.sum() * 100.0, on_step=False, on_epoch=True, batch_size=n,
                 prog_bar=True)
        self.log("val/mae_log", err.abs().mean(), on_step=False, on_epoch=True, batch_size=n)

    def configure_optimizers(self):
        opt = (self._optimizer or (lambda p: torch.optim.AdamW(p, lr=2e-3, weight_decay=1e-4)))(self.parameters())
        if self._scheduler is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self._scheduler(opt), "interval": "epoch"}}

    def on_train_epoch_end(self):
        opt = self.optimizers()
        if opt is not None and not isinstance(opt, list):
            self.log("lr", opt.param_groups[0]["lr"], on_step=False, on_epoch=True)

    def export_weights(self) -> dict[str, np.ndarray]:
        """The published tensors: ``layers.<i>.weight`` [out, in] and ``layers.<i>.bias``, float32 numpy."""
        return {k: v.detach().cpu().numpy().astype(np.float32).copy() for k, v in self.state_dict().items()
                if k.startswith("layers.")}


class BestWeights(pl.Callback):
    """Keep the weights of the epoch with the best monitored value and restore them when training ends."""

    def __init__(self, monitor: str = "val/mape"):
        self.monitor = monitor
        self.best = math.inf
        self.best_epoch = -1
        self.state = None

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is not None and float(value) < self.best:
            self.best, self.best_epoch = float(value), trainer.current_epoch
            self.state = copy.deepcopy(pl_module.state_dict())

    def on_fit_end(self, trainer, pl_module):
        if self.state is not None:
            pl_module.load_state_dict(self.state)
