"""bmm: ``[batch, m, k] @ [batch, k, n]`` (attention scores and context in transformers)."""

from __future__ import annotations

from pipeline import physics
from pipeline.ops.base import Config, OpSpec, log_int

HEADS = [(12, 64), (16, 64), (20, 64), (25, 64), (32, 128), (40, 128), (64, 128)]
SEQS = [128, 256, 512, 1024, 2048, 4096]
BATCHES = [1, 2, 4, 8, 16, 32]


class Bmm(OpSpec):
    name = "bmm"

    def sample_random(self, rng, space):
        d = space["max_dim"]
        return {"batch": log_int(rng, 1, space["max_batch"]), "m": log_int(rng, 1, d), "k": log_int(rng, 1, d),
                "n": log_int(rng, 1, d)}

    def real_shapes(self, space):
        shapes = []
        for heads, head_dim in HEADS:
            for seq in SEQS:
                for b in BATCHES:
                    batch = b * heads
                    if batch > space["max_batch"] or seq > space["max_dim"]:
                        continue
                    shapes.append({"batch": batch, "m": seq, "k": head_dim, "n": seq})   # Q Kᵀ
                    shapes.append({"batch": batch, "m": seq, "k": seq, "n": head_dim})   # P V
        return shapes

    def flops(self, cfg: Config) -> float:
        return physics.flops(self.name, cfg)

    def memory_elems(self, cfg: Config) -> float:
        return physics.footprint_elements(self.name, cfg)

    def build(self, cfg, device, dtype):
        import torch

        b, m, k, n = cfg["batch"], cfg["m"], cfg["k"], cfg["n"]
        x = torch.randn(b, m, k, device=device, dtype=dtype, requires_grad=True)
        y = torch.randn(b, k, n, device=device, dtype=dtype, requires_grad=True)
        return torch.bmm, [x, y], []


SPEC = Bmm()
