"""Collectives (all-reduce, reduce-scatter, all-gather, all-to-all) across GPUs: measured, imported, modelled.

Modules: ``schema`` (the collective table: ``datasets/collectives/`` and ``datasets/external/collectives/``),
``model`` (latency + bytes / bus bandwidth per interconnect class, from registry fields and fitted parameters;
numpy only), ``fit`` (calibration on the measured and public rows, held-out error, the learned correction),
``collect`` (the torch.distributed sweep, one process per GPU) and ``cli`` (``python -m pipeline.collectives``).
Importing this package does not import torch.
"""

from pipeline.collectives.model import CollectiveModel, LinkParams, resolve_interconnect
from pipeline.collectives.schema import COLLECTIVES, DTYPES, INTERCONNECTS, read_collectives

__all__ = ["CollectiveModel", "LinkParams", "resolve_interconnect", "COLLECTIVES", "DTYPES", "INTERCONNECTS",
           "read_collectives"]
