"""conv2d: ``nn.Conv2d`` on [batch, in_channels, height, width], incl. strides, dilation and groups."""

from __future__ import annotations

from pipeline import physics
from pipeline.ops.base import Config, OpSpec, choice, log_int


class Conv2d(OpSpec):
    name = "conv2d"

    def sample_random(self, rng, space):
        h = log_int(rng, space["min_size"], space["max_size"])
        w = h if rng.uniform() < 0.75 else log_int(rng, space["min_size"], space["max_size"])
        k = choice(rng, [1, 3, 5, 7, 11, 2, 4, 6, 8, 9, 10], [30, 40, 8, 6, 2, 2, 2, 1, 1, 1, 1])
        kh, kw = (k, k) if rng.uniform() < 0.9 else choice(rng, [(1, 3), (3, 1), (1, 7), (7, 1), (5, 20)])
        stride = choice(rng, [1, 2, 3, 4], [60, 30, 5, 5])
        dilation = 1 if rng.uniform() < 0.85 else choice(rng, [2, 3, 4])
        same = rng.uniform() < 0.7
        pad_h = dilation * (kh // 2) if same else int(rng.integers(0, 4))
        pad_w = dilation * (kw // 2) if same else int(rng.integers(0, 4))
        cin = log_int(rng, 1, space["max_channels"])
        cout = log_int(rng, 1, space["max_channels"])
        groups = 1
        mode = rng.uniform()
        if mode < 0.12:  # depthwise
            cout = cin
            groups = cin
        elif mode < 0.2:  # grouped
            groups = choice(rng, [2, 4, 8, 16, 32])
            cin = max(1, cin // groups) * groups
            cout = max(1, cout // groups) * groups
        return {"batch": log_int(rng, 1, space["max_batch"]), "in_channels": cin, "out_channels": cout,
                "height": h, "width": w, "kernel_h": kh, "kernel_w": kw, "stride_h": stride, "stride_w": stride,
                "pad_h": pad_h, "pad_w": pad_w, "dilation_h": dilation, "dilation_w": dilation, "groups": groups,
                "bias": bool(rng.uniform() < 0.5)}

    def real_shapes(self, catalog, space):
        shapes = []
        for layers in catalog.get("models", {}).values():
            for size, cin, cout, k, stride, pad, groups, bias in layers:
                if size > space["max_size"] or max(cin, cout) > space["max_channels"]:
                    continue
                for b in catalog.get("batch", []):
                    if b <= space["max_batch"]:
                        shapes.append({"batch": b, "in_channels": cin, "out_channels": cout, "height": size,
                                       "width": size, "kernel_h": k, "kernel_w": k, "stride_h": stride,
                                       "stride_w": stride, "pad_h": pad, "pad_w": pad, "dilation_h": 1,
                                       "dilation_w": 1, "groups": groups, "bias": bool(bias)})
        return shapes

    def valid(self, cfg: Config) -> bool:
        return (cfg["in_channels"] % cfg["groups"] == 0 and cfg["out_channels"] % cfg["groups"] == 0
                and self._out(cfg)[0] >= 1 and self._out(cfg)[1] >= 1)

    @staticmethod
    def _out(cfg: Config) -> tuple[int, int]:
        return physics.conv_output_hw(cfg)

    def build(self, cfg, device, dtype):
        import torch

        layer = torch.nn.Conv2d(cfg["in_channels"], cfg["out_channels"], (cfg["kernel_h"], cfg["kernel_w"]),
                                stride=(cfg["stride_h"], cfg["stride_w"]), padding=(cfg["pad_h"], cfg["pad_w"]),
                                dilation=(cfg["dilation_h"], cfg["dilation_w"]), groups=cfg["groups"],
                                bias=cfg["bias"], device=device, dtype=dtype)
        x = torch.randn(cfg["batch"], cfg["in_channels"], cfg["height"], cfg["width"], device=device, dtype=dtype,
                        requires_grad=True)
        return layer, [x], list(layer.parameters())

    def explicit_backward(self, cfg, fn, inputs, grad_out):
        import torch

        x, weight, g = inputs[0].detach(), fn.weight.detach(), grad_out
        bias = [cfg["out_channels"]] if cfg["bias"] else None
        args = (bias, fn.stride, fn.padding, fn.dilation, False, [0, 0], cfg["groups"], [True, True, cfg["bias"]])

        def backward():  # ConvolutionBackward0
            return torch.ops.aten.convolution_backward.default(g, x, weight, *args)

        return backward


SPEC = Conv2d()
