"""``make import``: convert public measured op timings into the dataset schema (``pipeline.schema``).

Reads the read-only ``extdata`` folder (config key ``extdata``, default ``../shared/extdata``; see its
README.md) and writes ``<out>/gpu=<label>/op=<op>/<source>.parquet`` (default ``out=datasets/external``), one
file per (GPU, op, source), each with the source's license, citation, original files, library versions, timing
method, mapping and launch floors in its Parquet metadata. One module per source says how its columns map
to op configs: ``neusight`` (single-op tables), ``neusight_nodes`` (the node tables of BERT-Large and
GPT-2-Large, source ``neusight-label``; also THE node-table parser: ``read_node_table``, ``node_config``),
``deepbench``, ``vidur``, ``aiconfigurator``. ``common`` turns reader rows into schema rows and writes them;
``launch`` marks launch-bound rows; ``importer`` runs it all.

Rows on GPUs the registry (``pipeline.gpus``) does not know are skipped with a warning, rows with a missing or
non-positive time are dropped with a counted warning, and repeated configs of one (GPU, source, precision,
phase) are merged into their median time, so (config_id, gpu, source, precision, phase) is unique.
"""

from pipeline.ingest.common import LABEL_KINDS, META_PREFIX, IngestError, Report, Source, Task, finalize
from pipeline.ingest.importer import REGISTRY, SOURCES, run, skipped_table, summary_table
from pipeline.ingest.launch import LaunchRule, floor_table
from pipeline.ingest.neusight_nodes import node_config, read_node_table

__all__ = ["LABEL_KINDS", "META_PREFIX", "IngestError", "Report", "Source", "Task", "finalize", "REGISTRY",
           "SOURCES", "run", "skipped_table", "summary_table", "LaunchRule", "floor_table", "node_config",
           "read_node_table"]
