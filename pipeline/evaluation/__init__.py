"""Evaluation of the per-op scalers, shared by training (card metrics, champion rules) and the report.

- ``metrics``: absolute % errors and their summaries, tables;
- ``predictions``: dataset rows through the prediction API (``api.Scaler``), the one forward pass;
- ``logo``: leave-GPU-out retrains and Habitat-style ratio errors;
- ``champion``: the published champion on the held-out split and the unseen source;
- ``cache``, ``speed``, ``summary``, ``report``, ``plots``, ``run``: the report of ``python -m pipeline.evaluation``
  (``conf/evaluate.yaml``; ``make evaluate``).

Importing this package loads nothing heavy; training code (torch, Lightning) loads only where a retrain runs.
"""
