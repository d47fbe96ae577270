"""The model code of a registered scaler (MLflow models-from-code): ``ScalerModel`` wraps ``pipeline.api``.

MLflow runs this file when a registered version is loaded. The checkpoint travels as the model's artifact
``checkpoints`` (``<op>/v<N>/`` with its checksummed files, verified by ``load_scaler`` on every load), the op and
version as its ``model_config``; the ``pipeline`` package travels as its code.

Input: a DataFrame with the op's config columns (``pipeline.inputs.OP_COLUMNS``; optional ones take their
defaults), ``gpu`` (a registry name or alias) and optionally ``precision`` (default fp32) and ``phase`` (forward |
backward | total, default forward). Output: a DataFrame with ``ms`` and its 80 % interval ``low_ms``, ``high_ms``
(NaN where the version's card carries no calibrated interval: a model trained on too little data to calibrate one).
"""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd

DEFAULTS = {"precision": "fp32", "phase": "forward"}


class ScalerModel(mlflow.pyfunc.PythonModel):
    """``predict`` runs ``load_scaler(op, version).predict(..., return_interval=True)`` per GPU/precision/phase."""

    def load_context(self, context):
        from pipeline import api

        config = context.model_config or {}
        self.scaler = api.load_scaler(config["op"], int(config["version"]), root=context.artifacts["checkpoints"])

    def predict(self, context, model_input, params=None):
        from pipeline.inputs import InputError

        frame = pd.DataFrame(model_input).reset_index(drop=True)
        if "gpu" not in frame:
            raise InputError("model input: a 'gpu' column is required (a registry name such as 'h100')")
        for column, value in DEFAULTS.items():
            frame[column] = frame[column].fillna(value) if column in frame else value
        out = pd.DataFrame({"ms": np.nan, "low_ms": np.nan, "high_ms": np.nan}, index=frame.index)
        configs = frame.drop(columns=["gpu", *DEFAULTS])
        configs = configs[[c for c in configs.columns if configs[c].notna().any()]]
        calibrated = bool(self.scaler.card.get("interval"))
        for (gpu, precision, phase), rows in frame.groupby(["gpu", "precision", "phase"], sort=False).groups.items():
            result = self.scaler.predict(configs.loc[rows], gpu, precision, phase, return_interval=calibrated,
                                         return_flags=True)
            out.loc[rows, "ms"] = result[0]
            if calibrated:
                out.loc[rows, "low_ms"], out.loc[rows, "high_ms"] = result[1], result[2]
        return out


mlflow.models.set_model(ScalerModel())
