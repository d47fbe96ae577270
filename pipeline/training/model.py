"""The per-op MLP (a LightningModule); the prediction API (``pipeline.api``) runs its exported weights.

Layers are named ``layers.<i>`` (``torch.nn.Linear``), so ``state_dict`` maps one-to-one onto the published
``layers.<i>.weight`` [out, in] / ``layers.<i>.bias`` tensors; the activation sits between layers.
"""

from __future__ import annotations

import copy
import math
from typing import Callable, Sequence

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


class MLPRegressor(pl.LightningModule):
    """MLP on z-scored features predicting the log-ratio target; loss on the log error (scale-free, MAPE-like).

    ``optimizer`` and ``scheduler`` are factories (Hydra ``_partial_: true`` targets): ``optimizer(params)``
    and ``scheduler(optimizer)``.
    """

    def __init__(self, n_features: int, hidden: Sequence[int] = (128, 128, 128), activation: str = "relu",
                 dropout: float = 0.0, loss: str = "huber", huber_delta: float = 0.05,
                 optimizer: Callable | None = None, scheduler: Callable | None = None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"model.activation: {activation!r} is not one of {list(ACTIVATIONS)}")
        if loss not in ("huber", "l1", "mse"):
            raise ValueError(f"model.loss: {loss!r} is not one of ['huber', 'l1', 'mse']")
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        sizes = [int(n_features), *[int(h) for h in hidden], 1]
        self.layers = nn.ModuleList(nn.Linear(sizes[i], sizes[i + 1]) for i in range(len(sizes) - 1))
        self.act = ACTIVATIONS[activation]()
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.activation = activation
        self.hidden = [int(h) for h in hidden]
        self._optimizer = optimizer
        self._scheduler = scheduler
        self._loss = loss
        self._delta = float(huber_delta)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            z = layer(z)
            if i < len(self.layers) - 1:
                z = self.drop(self.act(z))
        return z.squeeze(-1)

    def _loss_fn(self, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self._loss == "huber":
            return nn.functional.huber_loss(pred, y, delta=self._delta) / self._delta  # ~ L1 for big errors
        if self._loss == "l1":
            return nn.functional.l1_loss(pred, y)
        return nn.functional.mse_loss(pred, y)

    def training_step(self, batch, batch_idx):
        z, y = batch
        loss = self._loss_fn(self(z), y)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(y))
        return loss

    def validation_step(self, batch, batch_idx):
        z, y = batch
        pred = self(z)
        err = torch.expm1(pred - y).abs()  # |predicted/measured - 1|: absolute relative error of the time
        self.log("val/loss", self._loss_fn(pred, y), on_step=False, on_epoch=True, batch_size=len(y))
        self.log("val/mape", err.mean() * 100.0, on_step=False, on_epoch=True, batch_size=len(y), prog_bar=True)
        self.log("val/mae_log", (pred - y).abs().mean(), on_step=False, on_epoch=True, batch_size=len(y))

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
