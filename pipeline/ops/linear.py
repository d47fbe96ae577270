"""linear: ``y = x Wᵀ + b`` with ``x`` of shape [batch, in_features] (batch = product of leading dims)."""

from __future__ import annotations

from pipeline import physics
from pipeline.ops.base import Config, OpSpec, choice, log_int

# Hidden sizes of transformer models (BERT/GPT-2/GPT-3/Llama families) and their FFN widths.
TRANSFORMER_WIDTHS = [(768, 3072), (1024, 4096), (1280, 5120), (1600, 6400), (2048, 8192), (2560, 10240),
                      (4096, 11008), (4096, 14336), (5120, 13824), (8192, 28672)]
TOKENS = [128, 512, 1024, 2048, 4096, 8192, 16384]
VOCABS = [30522, 32000, 50257]


class Linear(OpSpec):
    name = "linear"

    def sample_random(self, rng, space):
        return {"batch": log_int(rng, 1, space["max_batch"]), "in_features": log_int(rng, 1, space["max_features"]),
                "out_features": log_int(rng, 1, space["max_features"]), "bias": bool(rng.uniform() < 0.7)}

    def real_shapes(self, space):
        shapes = []
        for h, ffn in TRANSFORMER_WIDTHS:
            for tokens in TOKENS:
                if tokens > space["max_batch"] or ffn > space["max_features"]:
                    continue
                for i, o in ((h, h), (h, 3 * h), (h, ffn), (ffn, h), (h, h // 4)):
                    shapes.append({"batch": tokens, "in_features": i, "out_features": o, "bias": True})
        for batch in (32, 64, 128, 256):
            for i, o in ((2048, 1000), (4096, 4096), (25088, 4096), (4096, 1000), (1280, 1000), (512, 10)):
                if max(i, o) <= space["max_features"]:
                    shapes.append({"batch": batch, "in_features": i, "out_features": o, "bias": True})
        for vocab in VOCABS:
            for h in (768, 1024, 4096):
                for tokens in (512, 2048):
                    if vocab <= space["max_features"] and tokens <= space["max_batch"]:
                        shapes.append({"batch": tokens, "in_features": h, "out_features": vocab, "bias": False})
        return shapes

    def flops(self, cfg: Config) -> float:
        return physics.flops(self.name, cfg)

    def memory_elems(self, cfg: Config) -> float:
        return physics.footprint_elements(self.name, cfg)

    def build(self, cfg, device, dtype):
        import torch

        layer = torch.nn.Linear(cfg["in_features"], cfg["out_features"], bias=cfg["bias"], device=device,
                                dtype=dtype)
        x = torch.randn(cfg["batch"], cfg["in_features"], device=device, dtype=dtype, requires_grad=True)
        return layer, [x], list(layer.parameters())


SPEC = Linear()
