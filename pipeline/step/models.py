"""Built-in example models for whole-step prediction, defined here in plain PyTorch (no torchvision).

Each ``make_*_step(batch, precision, device, **config)`` returns a ``step_fn()`` that runs one full training
step -- zero_grad, forward, loss, backward, optimizer step -- on synthetic data already on ``device``.
``make_step(model, batch, precision, device, tiny=False, **config)`` picks one by name (``MODELS``).

- ``resnet50``: ResNet-50 v1.5 (bottleneck 3-4-6-3, stride on the 3x3), 224x224 images, 1000 classes, SGD
  with momentum.
- ``bert``: a BERT-base-like Transformer encoder (12 layers, hidden 768, 12 heads, FFN 3072, seq 512, vocab
  30522) with a masked-LM head over every token, AdamW. Attention is written out (matmul, softmax, dropout,
  matmul), as in BERT, so its GEMMs are bmm ops a scaler covers; ``attention="sdpa"`` uses
  ``scaled_dot_product_attention`` instead (fused kernels, scaled as "other").
- ``gnmt``: a GNMT-like LSTM seq2seq: bidirectional + 3 LSTM encoder layers, 4 decoder layers with dot-product
  attention (bmm) after the first, hidden 1024, vocab 32000, 50 tokens each side, Adam.
- ``dcgan``: DCGAN 64x64 (generator of transposed convs, discriminator of convs), one discriminator and one
  generator update per step, Adam.

Precision: ``fp32`` (TF32 off), ``tf32`` (TF32 allowed for cuBLAS and cuDNN), ``fp16`` (autocast + GradScaler),
``bf16`` (autocast). The TF32 flags, and ``cudnn.benchmark = True`` (cuDNN autotuning, as training scripts set it),
are set at the start of every step.
``tiny=True`` shrinks every model (for CPU smoke tests); explicit ``config`` keys override either size.
``wrap`` (resnet50, bert, gnmt): a function applied to the model before its optimizer is built, e.g.
``lambda m: DistributedDataParallel(m, device_ids=[rank])`` for a measured data-parallel step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from pipeline.schema import PRECISIONS

__all__ = ["MODELS", "make_step", "ResNet50", "BertEncoder", "GNMT", "DCGAN"]

# ------------------------------------------------------------------------------------------------ precision

def _set_flags(precision: str) -> None:
    """TF32 as ``precision`` says, and cuDNN's autotuning on, as training scripts set it (what the conv2d data
    measures)."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True


def _autocast(precision: str, device: str):
    if precision in ("fp16", "bf16"):
        dtype = torch.float16 if precision == "fp16" else torch.bfloat16
        return torch.autocast(device_type=torch.device(device).type, dtype=dtype)
    return contextlib.nullcontext()


def _check(precision: str, batch: int) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if int(batch) < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")


def _wrapped(model: nn.Module, wrap: Callable[[nn.Module], nn.Module] | None) -> nn.Module:
    """``wrap(model)`` where given: e.g. ``DistributedDataParallel`` for a measured multi-GPU step."""
    return model if wrap is None else wrap(model)


def _trainer(modules, optimizers, loss_fn: Callable[[], torch.Tensor], precision: str, device: str):
    """The step: zero grads, forward + loss under autocast, backward (GradScaler for fp16), optimizer step.
    ``loss_fn`` may return a list of (loss, optimizer) pairs for multi-optimizer steps (DCGAN)."""
    scaler = torch.amp.GradScaler(torch.device(device).type) if precision == "fp16" else None

    def step():
        _set_flags(precision)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        with _autocast(precision, device):
            loss = loss_fn()
        if scaler is not None:
            scaler.scale(loss).backward()
            for opt in optimizers:
                scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            for opt in optimizers:
                opt.step()
        return loss

    step.modules = modules
    return step


# ------------------------------------------------------------------------------------------------ ResNet-50

class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.down = None
        if stride != 1 or inplanes != out:
            self.down = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)), inplace=True)
        y = F.relu(self.bn2(self.conv2(y)), inplace=True)
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)), inplace=True)


class ResNet50(nn.Module):
    """ResNet-50 v1.5; ``width`` and ``layers`` shrink it for tests."""

    def __init__(self, num_classes: int = 1000, width: int = 64, layers=(3, 4, 6, 3)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        blocks, inplanes = [], width
        for i, n in enumerate(layers):
            planes = width * 2 ** i
            for j in range(n):
                blocks.append(_Bottleneck(inplanes, planes, stride=2 if (j == 0 and i > 0) else 1))
                inplanes = planes * _Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_resnet50_step(batch: int, precision: str = "fp32", device: str = "cpu", *, image_size: int = 224,
                       num_classes: int = 1000, width: int = 64, layers=(3, 4, 6, 3), lr: float = 0.1, wrap=None):
    _check(precision, batch)
    model = _wrapped(ResNet50(num_classes, width, tuple(layers)).to(device), wrap)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(batch, 3, image_size, image_size, device=device)
    y = torch.randint(0, num_classes, (batch,), device=device)
    return _trainer([model], [opt], lambda: F.cross_entropy(model(x), y), precision, device)


# ------------------------------------------------------------------------------------------------- BERT-like

class _EncoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float, attention: str):
        super().__init__()
        self.heads, self.attention, self.dropout = heads, attention, dropout
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attn_out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.inter = nn.Linear(hidden, ffn)
        self.out = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def _split(self, x):
        b, s, h = x.shape
        return x.view(b, s, self.heads, h // self.heads).transpose(1, 2)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        if self.attention == "sdpa":
            ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
            probs = F.dropout(torch.softmax(scores, dim=-1), self.dropout, self.training)
            ctx = torch.matmul(probs, v)
        ctx = ctx.transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + F.dropout(self.attn_out(ctx), self.dropout, self.training))
        y = self.out(F.gelu(self.inter(x)))
        return self.ln2(x + F.dropout(y, self.dropout, self.training))


class BertEncoder(nn.Module):
    """BERT-base-like encoder with a masked-LM head over every token."""

    def __init__(self, vocab: int = 30522, hidden: int = 768, layers: int = 12, heads: int = 12, ffn: int = 3072,
                 max_seq: int = 512, dropout: float = 0.1, attention: str = "math"):
        super().__init__()
        if attention not in ("math", "sdpa"):
            raise ValueError(f"attention: 'math' or 'sdpa', got {attention!r}")
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_seq, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.dropout = dropout
        self.layers = nn.ModuleList(_EncoderLayer(hidden, heads, ffn, dropout, attention) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = F.dropout(self.ln(self.tok(tokens) + self.pos(pos)), self.dropout, self.training)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def make_bert_step(batch: int, precision: str = "fp32", device: str = "cpu", *, seq: int = 512,
                   layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, vocab: int = 30522,
                   attention: str = "math", lr: float = 1e-4, wrap=None):
    _check(precision, batch)
    model = BertEncoder(vocab, hidden, layers, heads, ffn, max(seq, 8), attention=attention).to(device)
    model = _wrapped(model, wrap)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    tokens = torch.randint(0, vocab, (batch, seq), device=device)
    labels = torch.randint(0, vocab, (batch, seq), device=device)

    def loss():
        return F.cross_entropy(model(tokens).reshape(-1, vocab), labels.reshape(-1))

    return _trainer([model], [opt], loss, precision, device)


# ------------------------------------------------------------------------------------------------ GNMT-like

class GNMT(nn.Module):
    """GNMT-like seq2seq: bidirectional first encoder layer, residual stacks, dot-product attention."""

    def __init__(self, vocab: int = 32000, hidden: int = 1024, enc_layers: int = 4, dec_layers: int = 4,
                 dropout: float = 0.2):
        super().__init__()
        if hidden % 2 or enc_layers < 2 or dec_layers < 2:
            raise ValueError("gnmt: hidden must be even, enc_layers and dec_layers >= 2")
        self.embed_src = nn.Embedding(vocab, hidden)
        self.embed_tgt = nn.Embedding(vocab, hidden)
        self.enc_bi = nn.LSTM(hidden, hidden // 2, batch_first=True, bidirectional=True)
        self.enc = nn.LSTM(hidden, hidden, num_layers=enc_layers - 1, batch_first=True,
                           dropout=dropout if enc_layers > 2 else 0.0)
        self.dec1 = nn.LSTM(hidden, hidden, batch_first=True)
        self.dec = nn.LSTM(2 * hidden, hidden, num_layers=dec_layers - 1, batch_first=True,
                           dropout=dropout if dec_layers > 2 else 0.0)
        self.classifier = nn.Linear(hidden, vocab)
        self.dropout = dropout

    def forward(self, src, tgt):
        e, _ = self.enc_bi(F.dropout(self.embed_src(src), self.dropout, self.training))
        e2, _ = self.enc(e)
        enc = e + e2
        d, _ = self.dec1(F.dropout(self.embed_tgt(tgt), self.dropout, self.training))
        scores = torch.bmm(d, enc.transpose(1, 2))
        context = torch.bmm(torch.softmax(scores, dim=-1), enc)
        d2, _ = self.dec(torch.cat([d, context], dim=-1))
        return self.classifier(d + d2)


def make_gnmt_step(batch: int, precision: str = "fp32", device: str = "cpu", *, seq: int = 50,
                   hidden: int = 1024, vocab: int = 32000, enc_layers: int = 4, dec_layers: int = 4,
                   lr: float = 1e-3, wrap=None):
    _check(precision, batch)
    model = _wrapped(GNMT(vocab, hidden, enc_layers, dec_layers).to(device), wrap)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    src = torch.randint(0, vocab, (batch, seq), device=device)
    tgt = torch.randint(0, vocab, (batch, seq), device=device)
    labels = torch.randint(0, vocab, (batch, seq), device=device)

    def loss():
        return F.cross_entropy(model(src, tgt).reshape(-1, vocab), labels.reshape(-1))

    return _trainer([model], [opt], loss, precision, device)


# ---------------------------------------------------------------------------------------------------- DCGAN

class DCGAN(nn.Module):
    """Generator and discriminator of DCGAN for ``2**(levels+2)``-pixel square images (64 by default)."""

    def __init__(self, nz: int = 100, ngf: int = 64, ndf: int = 64, channels: int = 3, levels: int = 4):
        super().__init__()
        g = [nn.ConvTranspose2d(nz, ngf * 2 ** (levels - 1), 4, 1, 0, bias=False),
             nn.BatchNorm2d(ngf * 2 ** (levels - 1)), nn.ReLU(True)]
        for i in range(levels - 1, 0, -1):
            g += [nn.ConvTranspose2d(ngf * 2 ** i, ngf * 2 ** (i - 1), 4, 2, 1, bias=False),
                  nn.BatchNorm2d(ngf * 2 ** (i - 1)), nn.ReLU(True)]
        g += [nn.ConvTranspose2d(ngf, channels, 4, 2, 1, bias=False), nn.Tanh()]
        self.generator = nn.Sequential(*g)
        d = [nn.Conv2d(channels, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True)]
        for i in range(levels - 1):
            d += [nn.Conv2d(ndf * 2 ** i, ndf * 2 ** (i + 1), 4, 2, 1, bias=False),
                  nn.BatchNorm2d(ndf * 2 ** (i + 1)), nn.LeakyReLU(0.2, True)]
        d += [nn.Conv2d(ndf * 2 ** (levels - 1), 1, 4, 1, 0, bias=False)]
        self.discriminator = nn.Sequential(*d)
        self.nz = nz


def make_dcgan_step(batch: int, precision: str = "fp32", device: str = "cpu", *, nz: int = 100, ngf: int = 64,
                    ndf: int = 64, levels: int = 4, lr: float = 2e-4):
    _check(precision, batch)
    gan = DCGAN(nz, ngf, ndf, 3, levels).to(device)
    size = 2 ** (levels + 2)
    opt_d = torch.optim.Adam(gan.discriminator.parameters(), lr=lr, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(gan.generator.parameters(), lr=lr, betas=(0.5, 0.999))
    real = torch.randn(batch, 3, size, size, device=device)
    noise = torch.randn(batch, nz, 1, 1, device=device)
    ones = torch.ones(batch, device=device)
    zeros = torch.zeros(batch, device=device)
    scaler = torch.amp.GradScaler(torch.device(device).type) if precision == "fp16" else None
    D, G = gan.discriminator, gan.generator

    def update(loss, opt):
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
        else:
            loss.backward()
            opt.step()

    def step():
        _set_flags(precision)
        opt_d.zero_grad(set_to_none=True)
        with _autocast(precision, device):
            fake = G(noise)
            loss_d = (F.binary_cross_entropy_with_logits(D(real).view(-1), ones)
                      + F.binary_cross_entropy_with_logits(D(fake.detach()).view(-1), zeros))
        update(loss_d, opt_d)
        opt_g.zero_grad(set_to_none=True)
        with _autocast(precision, device):
            loss_g = F.binary_cross_entropy_with_logits(D(fake).view(-1), ones)
        update(loss_g, opt_g)
        if scaler is not None:
            scaler.update()
        return loss_g

    step.modules = [gan]
    return step


# -------------------------------------------------------------------------------------------------- registry

MODELS: dict[str, Callable] = {
    "resnet50": make_resnet50_step,
    "bert": make_bert_step,
    "gnmt": make_gnmt_step,
    "dcgan": make_dcgan_step,
}

TINY: dict[str, dict] = {
    "resnet50": {"image_size": 32, "width": 8, "layers": (1, 1, 1, 1), "num_classes": 10},
    "bert": {"seq": 16, "layers": 2, "hidden": 32, "heads": 2, "ffn": 64, "vocab": 100},
    "gnmt": {"seq": 6, "hidden": 16, "vocab": 50, "enc_layers": 2, "dec_layers": 2},
    "dcgan": {"nz": 8, "ngf": 4, "ndf": 4, "levels": 2},
}
"""Small configurations for smoke tests on the CPU (seconds, not minutes)."""

ALIASES = {"bert-base": "bert", "transformer": "bert", "resnet": "resnet50", "lstm": "gnmt", "seq2seq": "gnmt"}


def make_step(model: str, batch: int, precision: str = "fp32", device: str = "cpu", *, tiny: bool = False,
              **config) -> Callable[[], torch.Tensor]:
    """The ``step_fn`` of a built-in model by name (``MODELS``); ``tiny`` for the small test size."""
    name = ALIASES.get(model, model)
    if name not in MODELS:
        raise ValueError(f"model: unknown built-in model {model!r}; choose from {', '.join(MODELS)}")
    if name == "dcgan" and config.get("wrap") is not None:
        raise ValueError("wrap: DCGAN's step updates two models in two backward passes; it takes no wrapper")
    kwargs = dict(TINY[name]) if tiny else {}
    kwargs.update(config)
    return MODELS[name](batch, precision, device, **kwargs)
