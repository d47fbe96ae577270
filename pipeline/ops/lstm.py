"""lstm: ``nn.LSTM`` (batch-first) over a whole sequence, stacked and optionally bidirectional."""

from __future__ import annotations

from pipeline.ops.base import Config, OpSpec, choice, log_int


class Lstm(OpSpec):
    name = "lstm"

    def sample_random(self, rng, space):
        return {"batch": log_int(rng, 1, space["max_batch"]), "seq_len": log_int(rng, 1, space["max_seq"]),
                "input_size": log_int(rng, 1, space["max_hidden"]), "hidden_size": log_int(rng, 1, space["max_hidden"]),
                "num_layers": choice(rng, [1, 2, 3, 4, 5, 6], [40, 25, 10, 10, 5, 5])
                if space["max_layers"] >= 6 else int(rng.integers(1, space["max_layers"] + 1)),
                "bidirectional": bool(rng.uniform() < 0.3), "bias": bool(rng.uniform() < 0.9)}

    def sequential_steps(self, cfg: Config) -> int:
        return int(cfg["seq_len"] * cfg["num_layers"])

    def real_shapes(self, catalog, space):
        shapes = []
        for i, h, layers, bidir, seq in catalog.get("models", {}).values():
            for b in catalog.get("batch", []):
                if (b <= space["max_batch"] and seq <= space["max_seq"] and max(i, h) <= space["max_hidden"]
                        and layers <= space["max_layers"]):
                    shapes.append({"batch": b, "seq_len": seq, "input_size": i, "hidden_size": h,
                                   "num_layers": layers, "bidirectional": bool(bidir), "bias": True})
        return shapes

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
