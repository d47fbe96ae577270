"""lstm: ``nn.LSTM`` (batch-first) over a whole sequence, stacked and optionally bidirectional."""

from __future__ import annotations

from pipeline import physics
from pipeline.ops.base import Config, OpSpec, choice, log_int

# (input_size, hidden_size, num_layers, bidirectional, seq_len) of GNMT, DeepSpeech2, and word-level LMs.
REAL_LSTMS = [(1024, 1024, 1, True, 50), (1024, 1024, 4, False, 50), (2048, 1024, 1, False, 50),
              (1024, 1024, 1, False, 80), (161, 800, 5, True, 200), (1600, 800, 1, True, 200),
              (650, 650, 2, False, 35), (1500, 1500, 2, False, 35), (512, 512, 2, False, 100),
              (256, 512, 3, True, 64), (300, 300, 1, True, 30), (128, 256, 2, False, 128)]
BATCHES = [16, 32, 64, 128, 256]


class Lstm(OpSpec):
    name = "lstm"

    def sample_random(self, rng, space):
        return {"batch": log_int(rng, 1, space["max_batch"]), "seq_len": log_int(rng, 1, space["max_seq"]),
                "input_size": log_int(rng, 1, space["max_hidden"]), "hidden_size": log_int(rng, 1, space["max_hidden"]),
                "num_layers": choice(rng, [1, 2, 3, 4, 5, 6], [40, 25, 10, 10, 5, 5])
                if space["max_layers"] >= 6 else int(rng.integers(1, space["max_layers"] + 1)),
                "bidirectional": bool(rng.uniform() < 0.3), "bias": bool(rng.uniform() < 0.9)}

    def real_shapes(self, space):
        shapes = []
        for i, h, layers, bidir, seq in REAL_LSTMS:
            for b in BATCHES:
                cfg = {"batch": b, "seq_len": seq, "input_size": i, "hidden_size": h, "num_layers": layers,
                       "bidirectional": bidir, "bias": True}
                if (b <= space["max_batch"] and seq <= space["max_seq"] and max(i, h) <= space["max_hidden"]
                        and layers <= space["max_layers"]):
                    shapes.append(cfg)
        return shapes

    def flops(self, cfg: Config) -> float:
        return physics.flops(self.name, cfg)

    def memory_elems(self, cfg: Config) -> float:
        return physics.footprint_elements(self.name, cfg)

    def build(self, cfg, device, dtype):
        import torch

        layer = torch.nn.LSTM(cfg["input_size"], cfg["hidden_size"], num_layers=cfg["num_layers"],
                              bias=cfg["bias"], batch_first=True, bidirectional=cfg["bidirectional"],
                              device=device, dtype=dtype)
        layer.flatten_parameters()  # one contiguous weight chunk, as after .to(device) in training code
        x = torch.randn(cfg["batch"], cfg["seq_len"], cfg["input_size"], device=device, dtype=dtype,
                        requires_grad=True)
        return (lambda inp: layer(inp)[0]), [x], list(layer.parameters())


SPEC = Lstm()
