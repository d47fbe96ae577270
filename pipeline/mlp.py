"""The MLP forward pass in numpy: the only one. Users (``api.Scaler``), training metrics, the champion rules and
the evaluation report all run published (or freshly trained) weights through it."""

from __future__ import annotations

import math

import numpy as np

from pipeline.checkpoint_checks import ACTIVATIONS, split_members
from pipeline.inputs import InputError

_CHUNK = 1 << 11


def _erf(x: np.ndarray) -> np.ndarray:
    """erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), in place-heavy numpy: numpy has no erf and scipy
    is not a dependency of the light API."""
    a = np.abs(x)
    e = np.multiply(a, a)
    np.negative(e, out=e)
    np.exp(e, out=e)
    t = np.multiply(a, np.float32(0.3275911), out=a)
    t += 1.0
    np.reciprocal(t, out=t)
    p = t * np.float32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        p += np.float32(c)
        p *= t
    p *= e
    np.subtract(1.0, p, out=p)
    return np.copysign(p, x, out=p)


def _activate(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "relu":
        return np.maximum(x, 0, out=x)
    if kind == "gelu":  # exact (erf) GELU, torch.nn.GELU()'s default
        g = _erf(x * np.float32(1 / math.sqrt(2)))
        g += 1.0
        g *= x
        g *= np.float32(0.5)
        return g
    if kind == "silu":
        with np.errstate(over="ignore"):
            e = np.negative(x)
            np.exp(e, out=e)
            e += 1.0
            return np.divide(x, e, out=e)
    raise InputError(f"architecture.activation: {kind!r} is not one of {ACTIVATIONS}")


def _layers(weights: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """One member's (weight.T, bias) per layer; ``split_members`` checked a weight and a bias for each."""
    return [(np.ascontiguousarray(weights[f"layers.{i}.weight"].T, dtype=np.float32),
             weights[f"layers.{i}.bias"].astype(np.float32)) for i in range(len(weights) // 2)]


class MLP:
    """Standardise raw features with the card's mean/std, then each member's layers in order (float32). A
    checkpoint holds one member, or an ensemble of several trained alike from different seeds; ``members=k`` runs
    only the first k."""

    def __init__(self, card: dict, weights: dict[str, np.ndarray], members: int | None = None):
        every = split_members(weights)
        self.held = len(every)  # members in the weights; ``self.members`` the ones run
        if members is not None and not (isinstance(members, int) and not isinstance(members, bool)
                                        and 1 <= members <= self.held):
            raise InputError(f"members: the weights hold {self.held} member(s), so an integer from 1 to "
                             f"{self.held} or None (every member); got {members!r}")
        self.members = [_layers(m) for m in every[:members]]
        self.layers = self.members[0]
        self.outputs = int(self.layers[-1][0].shape[1])
        wanted = int(card["target"].get("outputs", 1))
        if self.outputs != wanted:
            raise InputError(f"weights: the last layer has {self.outputs} outputs, the card's target "
                             f"{card['target'].get('kind')!r} needs {wanted}")
        self.activation = card["architecture"]["activation"]
        self.mean = np.asarray(card["features"]["mean"], dtype=np.float32)
        self.inv_std = (1.0 / np.asarray(card["features"]["std"], dtype=np.float64)).astype(np.float32)

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        """Each member's outputs (float64; (n,) for one output, else (n, k)) for raw features ``x`` (n, F):
        standardise, then the layers in order. Runs in float32 over small row blocks, which keeps the temporaries
        in cache."""
        outs = [np.empty((len(x), self.outputs), dtype=np.float64) for _ in self.members]
        last = len(self.layers) - 1
        for start in range(0, len(x), _CHUNK):
            z = x[start:start + _CHUNK].astype(np.float32)
            z -= self.mean
            z *= self.inv_std
            for out, layers in zip(outs, self.members):
                h = z
                for i, (w, b) in enumerate(layers):
                    h = h @ w
                    h += b
                    if i < last:
                        h = _activate(h, self.activation)
                out[start:start + _CHUNK] = h
        return [out[:, 0] if self.outputs == 1 else out for out in outs]
