"""bmm: ``[batch, m, k] @ [batch, k, n]`` (attention scores and context in transformers)."""

from __future__ import annotations

from pipeline.ops.base import OpSpec, log_int, square_ish


class Bmm(OpSpec):
    name = "bmm"

    def sample_random(self, rng, space):
        d = space["max_dim"]
        if rng.uniform() < space.get("square_fraction", 0.0):
            # half of them Tensor-Core aligned (multiples of 64), as real layers are; odd dims run far from peak
            m, k, n = square_ish(rng, 64, d, 3, align=64 if rng.uniform() < 0.5 else 1)
            return {"batch": log_int(rng, 1, space["max_batch"]), "m": m, "k": k, "n": n}
        return {"batch": log_int(rng, 1, space["max_batch"]), "m": log_int(rng, 1, d), "k": log_int(rng, 1, d),
                "n": log_int(rng, 1, d)}

    def real_shapes(self, catalog, space):
        """Attention scores (Q Kᵀ) and context (P V) of real models at each batch and sequence length."""
        att = catalog.get("attention", {})
        shapes = []
        for heads, head_dim in att.get("heads", {}).values():
            for seq in att.get("seq", []):
                for b in att.get("batch", []):
                    bh = b * heads
                    if bh > space["max_batch"] or seq > space["max_dim"]:
                        continue
                    shapes.append({"batch": bh, "m": seq, "k": head_dim, "n": seq})   # Q Kᵀ
                    shapes.append({"batch": bh, "m": seq, "k": seq, "n": head_dim})   # P V
        return shapes

    def build(self, cfg, device, dtype):
        import torch

        b, m, k, n = cfg["batch"], cfg["m"], cfg["k"], cfg["n"]
        x = torch.randn(b, m, k, device=device, dtype=dtype, requires_grad=True)
        y = torch.randn(b, k, n, device=device, dtype=dtype, requires_grad=True)
        return torch.bmm, [x, y], []

    def explicit_backward(self, cfg, fn, inputs, grad_out):
        import torch

        a, b, g = inputs[0].detach(), inputs[1].detach(), grad_out

        def backward():  # BmmBackward0
            return torch.bmm(g, b.transpose(1, 2)), torch.bmm(a.transpose(1, 2), g)

        return backward


SPEC = Bmm()
