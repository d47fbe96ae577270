"""linear: ``y = x Wᵀ + b`` with ``x`` of shape [batch, in_features] (batch = product of leading dims)."""

from __future__ import annotations

from pipeline.ops.base import Config, OpSpec, log_int, square_ish


class Linear(OpSpec):
    name = "linear"

    def sample_random(self, rng, space):
        bias = bool(rng.uniform() < 0.5)
        if rng.uniform() < space.get("square_fraction", 0.0):
            rows, inp, out = square_ish(rng, 64, min(space["max_batch"], space["max_features"]), 3)
            return {"batch": rows, "in_features": inp, "out_features": out, "bias": bias}
        return {"batch": log_int(rng, 1, space["max_batch"]), "in_features": log_int(rng, 1, space["max_features"]),
                "out_features": log_int(rng, 1, space["max_features"]), "bias": bias}

    def real_shapes(self, catalog, space):
        shapes = _llm_layers(catalog.get("llm", {})) + _encoder_layers(catalog.get("encoder", {}))
        heads = catalog.get("heads", {})
        shapes += [_layer(b, i, o, True) for b in heads.get("batch", []) for i, o in heads.get("layers", [])]
        return [s for s in shapes if s["batch"] <= space["max_batch"]
                and max(s["in_features"], s["out_features"]) <= space["max_features"]]

    def build(self, cfg, device, dtype):
        import torch

        layer = torch.nn.Linear(cfg["in_features"], cfg["out_features"], bias=cfg["bias"], device=device,
                                dtype=dtype)
        x = torch.randn(cfg["batch"], cfg["in_features"], device=device, dtype=dtype, requires_grad=True)
        return layer, [x], list(layer.parameters())

    def explicit_backward(self, cfg, fn, inputs, grad_out):
        import torch

        x, weight, g = inputs[0].detach(), fn.weight.detach(), grad_out

        def backward():  # AddmmBackward0 / MmBackward0: grad @ W, (x^T @ grad)^T, grad summed over rows
            return torch.mm(g, weight), torch.mm(x.t(), g), (g.sum(0) if cfg["bias"] else None)

        return backward


SPEC = Linear()


def _layer(batch: int, inp: int, out: int, bias: bool) -> Config:
    return {"batch": int(batch), "in_features": int(inp), "out_features": int(out), "bias": bool(bias)}


def _llm_layers(llm) -> list[Config]:
    """QKV, attention output, MLP up/down and LM head of each decoder LLM, per token count and tensor-parallel
    degree (column-parallel layers shard their outputs, row-parallel ones their inputs)."""
    shapes = []
    for m in llm.get("models", {}).values():
        h, hd = m["hidden"], m["hidden"] // m["heads"]
        up = (2 if m["gated"] else 1) * m["ffn"]
        for tp in llm.get("tensor_parallel", [1]):
            for t in llm.get("tokens", []):
                shapes += [_layer(t, h, (m["heads"] + 2 * m["kv_heads"]) * hd // tp, m["qkv_bias"]),
                           _layer(t, h // tp, h, m["bias"]), _layer(t, h, up // tp, m["bias"]),
                           _layer(t, m["ffn"] // tp, h, m["bias"]), _layer(t, h, m["vocab"] // tp, False)]
    return shapes


def _encoder_layers(encoder) -> list[Config]:
    shapes = []
    for m in encoder.get("models", {}).values():
        h, ffn = m["hidden"], m["ffn"]
        for rows in (b * t for b in m["batch"] for t in m["tokens"]):
            shapes += [_layer(rows, h, 3 * h, True), _layer(rows, h, h, True), _layer(rows, h, ffn, True),
                       _layer(rows, ffn, h, True)]
    return shapes
