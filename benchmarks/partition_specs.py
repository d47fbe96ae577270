"""Characterise SM partitions (green contexts) of this host's GPU: the SMs a launch reaches, the copy
bandwidth and the matmul rate per precision, for the full GPU and for each partition (one process each).

Prints one JSON line per partition and writes them to ``--out``. The registry entries of the partition labels
(``h200-sm<N>``) take their rates from these measurements: ``--registry <jsonl>`` prints them (no GPU needed).
Each rate is the full GPU's datasheet rate times the partition's measured share of the full GPU's measured rate
(same method, same session), so partitions and whole GPUs stay on one (datasheet) scale.

    python benchmarks/partition_specs.py 64 32 16              # on the GPU host
    python benchmarks/partition_specs.py --registry reports/partition_specs.jsonl --base h200
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys, torch
sys.path.insert(0, {root!r})
from pipeline.collect.worker import characterise, count_reachable_sms, enter_partition
torch.cuda.set_device(0)
sms = {sms}
info = enter_partition("cuda:0", sms) if sms else {{"sm_partition_requested": None,
                                                    "sm_partition_reached": count_reachable_sms("cuda:0")}}
info.update(characterise("cuda:0"))
print("RESULT " + json.dumps(info), flush=True)
"""


def result_line(stdout: str) -> str | None:
    """The text after "RESULT " on the last line of a child process's ``stdout`` that starts with it (None if none)."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return lines[-1][7:] if lines else None


RATES = {"memory_bandwidth_gbps": "copy_bandwidth_gbps", "fp32_tflops": "matmul_fp32_tflops",
         "tf32_tflops": "matmul_tf32_tflops", "fp16_tflops": "matmul_fp16_tflops", "bf16_tflops": "matmul_bf16_tflops"}


def registry_entries(results: list[dict], base: str) -> str:
    """YAML registry entries for the measured partitions of GPU ``base`` (a registry label)."""
    sys.path.insert(0, str(ROOT))
    from pipeline.gpus import gpu_spec

    spec = gpu_spec(base)
    full = next(r for r in results if r["sm_partition_requested"] is None)
    whole = ", ".join(f"{key}: {full[key]}" for key in RATES.values())
    lines = []
    for r in results:
        requested = r["sm_partition_requested"]
        if requested is None:
            continue
        label = f"{base}-sm{requested}"
        sms = r["sm_partition_reached"]
        lines += [f"  - name: {spec['name']} ({sms}-SM partition)", f"    label: {label}", f"    aliases: [{label}]",
                  f"    partition_of: {base}", f"    compute_capability: \"{spec['compute_capability']}\"",
                  f"    sm_count: {sms}", f"    boost_clock_mhz: {spec['boost_clock_mhz']:g}",
                  f"    memory_gb: {spec['memory_gb']:g}"]
        lines += [f"    {field}: {spec[field] * r[key] / full[key]:.1f}" for field, key in RATES.items()
                  if field == "memory_bandwidth_gbps"]
        lines.append(f"    l2_cache_mb: {spec['l2_cache_mb']:g}")
        lines += [f"    {field}: {spec[field] * r[key] / full[key]:.1f}" for field, key in RATES.items()
                  if field != "memory_bandwidth_gbps"]
        measured = ", ".join(f"{key}: {r[key]}" for key in RATES.values())
        lines.append(f"    measured: {{{measured}, full_gpu: {{{whole}}}}}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sms", type=int, nargs="*", default=[64, 32, 16])
    parser.add_argument("--out", default="reports/partition_specs.jsonl")
    parser.add_argument("--registry", help="print registry entries from this measurements file and exit")
    parser.add_argument("--base", default="h200", help="registry label of the partitioned GPU")
    args = parser.parse_args(argv)
    if args.registry:
        print(registry_entries([json.loads(line) for line in Path(args.registry).read_text().splitlines()], args.base))
        return 0
    results = []
    for sms in [0] + args.sms:
        proc = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), sms=sms)], capture_output=True,
                              text=True, timeout=300)
        payload = result_line(proc.stdout)
        if proc.returncode or payload is None:
            print(f"partition {sms}: failed (exit {proc.returncode}): {proc.stderr[-2000:]}", file=sys.stderr)
            continue
        result = json.loads(payload)
        results.append(result)
        print(json.dumps(result), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in results))
    return 0 if len(results) == len(args.sms) + 1 else 1


if __name__ == "__main__":
    sys.exit(main())
