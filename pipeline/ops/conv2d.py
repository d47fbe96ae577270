"""conv2d: ``nn.Conv2d`` on [batch, in_channels, height, width], incl. strides, dilation and groups."""

from __future__ import annotations

from pipeline import physics
from pipeline.ops.base import Config, OpSpec, choice, log_int

BATCHES = [8, 16, 32, 64, 128]


def _conv(size, cin, cout, k, stride=1, pad=None, groups=1, bias=False):
    return {"height": size, "width": size, "in_channels": cin, "out_channels": cout, "kernel_h": k, "kernel_w": k,
            "stride_h": stride, "stride_w": stride, "pad_h": k // 2 if pad is None else pad,
            "pad_w": k // 2 if pad is None else pad, "dilation_h": 1, "dilation_w": 1, "groups": groups, "bias": bias}


def _resnet50():
    layers = [_conv(224, 3, 64, 7, 2)]
    size, cin = 56, 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        out = width * 4
        layers += [_conv(size, cin, width, 1), _conv(size, width, width, 3, stride),
                   _conv(size // stride, width, out, 1), _conv(size, cin, out, 1, stride),
                   _conv(size // stride, out, width, 1), _conv(size // stride, width, width, 3)]
        size, cin = size // stride, out
    return layers


def _vgg16():
    plan = [(224, 3, 64), (224, 64, 64), (112, 64, 128), (112, 128, 128), (56, 128, 256), (56, 256, 256),
            (28, 256, 512), (28, 512, 512), (14, 512, 512)]
    return [_conv(s, i, o, 3) for s, i, o in plan]


def _mobilenet_v2():
    plan = [(112, 32, 1), (112, 96, 2), (56, 144, 1), (56, 144, 2), (28, 192, 1), (28, 192, 2), (14, 384, 1),
            (14, 576, 1), (14, 576, 2), (7, 960, 1)]
    layers = []
    for size, ch, stride in plan:
        layers.append(_conv(size, ch, ch, 3, stride, groups=ch))          # depthwise
        layers.append(_conv(size // stride, ch, ch // 6 * 2 or 16, 1))   # pointwise projection
    return layers


def _dcgan_discriminator():
    return [_conv(64, 3, 64, 4, 2, 1), _conv(32, 64, 128, 4, 2, 1), _conv(16, 128, 256, 4, 2, 1),
            _conv(8, 256, 512, 4, 2, 1), _conv(4, 512, 1, 4, 1, 0)]


def _unet():
    return [_conv(s, c_in, c, 3, bias=True) for s, c_in, c in
            ((256, 3, 64), (256, 64, 64), (128, 64, 128), (64, 128, 256), (32, 256, 512), (16, 512, 1024))]


REAL_LAYERS = _resnet50() + _vgg16() + _mobilenet_v2() + _dcgan_discriminator() + _unet()


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

    def real_shapes(self, space):
        return [dict(layer, batch=b) for layer in REAL_LAYERS for b in BATCHES if b <= space["max_batch"]
                and layer["height"] <= space["max_size"] and layer["in_channels"] <= space["max_channels"]
                and layer["out_channels"] <= space["max_channels"]]

    def valid(self, cfg: Config) -> bool:
        return (cfg["in_channels"] % cfg["groups"] == 0 and cfg["out_channels"] % cfg["groups"] == 0
                and self._out(cfg)[0] >= 1 and self._out(cfg)[1] >= 1)

    @staticmethod
    def _out(cfg: Config) -> tuple[int, int]:
        return physics.conv_output_hw(cfg)

    def flops(self, cfg: Config) -> float:
        return physics.flops(self.name, cfg)

    def memory_elems(self, cfg: Config) -> float:
        return physics.footprint_elements(self.name, cfg)

    def build(self, cfg, device, dtype):
        import torch

        layer = torch.nn.Conv2d(cfg["in_channels"], cfg["out_channels"], (cfg["kernel_h"], cfg["kernel_w"]),
                                stride=(cfg["stride_h"], cfg["stride_w"]), padding=(cfg["pad_h"], cfg["pad_w"]),
                                dilation=(cfg["dilation_h"], cfg["dilation_w"]), groups=cfg["groups"],
                                bias=cfg["bias"], device=device, dtype=dtype)
        x = torch.randn(cfg["batch"], cfg["in_channels"], cfg["height"], cfg["width"], device=device, dtype=dtype,
                        requires_grad=True)
        return layer, [x], list(layer.parameters())


SPEC = Conv2d()
