"""One module per op type, each with the same small interface (see ``base.OpSpec``).

Adding an op means adding one module here (registered in ``OP_MODULES``) and one config space in ``conf/space/``.
"""

from __future__ import annotations

import importlib

OP_MODULES = {
    "conv2d": "pipeline.ops.conv2d",
    "linear": "pipeline.ops.linear",
    "bmm": "pipeline.ops.bmm",
    "lstm": "pipeline.ops.lstm",
}


def get_op(name: str):
    """The op module for ``name`` (its ``SPEC`` attribute implements ``base.OpSpec``)."""
    if name not in OP_MODULES:
        raise ValueError(f"op: unknown op {name!r}; allowed: {', '.join(OP_MODULES)}")
    return importlib.import_module(OP_MODULES[name]).SPEC
