"""Kernel sweeps: time op configs forward and backward on every GPU of the host, into the dataset.

``plan`` decides what a sweep measures (seeded, stratified by estimated time, resume-aware), ``worker`` measures
on one device (GPU time and host time per call, optionally inside an SM partition), ``scheduler`` runs the
workers under a watchdog and writes rows atomically, ``cli`` is the Hydra entry point
(``python -m pipeline.collect gpu=h200``).
"""

from pipeline.collect.cli import sweep_from_config
from pipeline.collect.plan import Sweep, Task, completed, plan, resolve_devices
from pipeline.collect.scheduler import run_sweep, write_run_summary

__all__ = ["Sweep", "Task", "completed", "plan", "resolve_devices", "run_sweep", "sweep_from_config",
           "write_run_summary"]
