"""Does the collector measure GPU time? Compare, on the same op configs, three ways of timing a call:

- ``gpu``: the collector's method (``pipeline.timing.measure``: reps queued behind a busy-wait kernel);
- ``graph``: CUDA-graph replay of many calls (no launch overhead at all), time per call;
- ``eager``: CUDA events around each call, each call enqueued right after the previous one (the first
  collector's method: for small ops this measures the host's launch rate).

Expectation: ``gpu`` agrees with ``graph`` within a few percent for small ops, and with ``eager`` within 1 % for
ops above 0.1 ms. Needs a CUDA GPU. ``python benchmarks/timing_check.py --n 100 --out reports/``
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.ops import get_op  # noqa: E402
from pipeline.ops.base import sample_configs  # noqa: E402
from pipeline.timing import TimingSettings, measure  # noqa: E402

SETTINGS = TimingSettings()


def eager_ms(fn, reps: int = 50) -> float:
    """The first collector's method: events around each call, no busy-wait ahead of the reps."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for begin, end in events:
        begin.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return float(np.median([b.elapsed_time(e) for b, e in events]))


def graph_ms(fn, calls: int = 20, replays: int = 10) -> float:
    """Median time per call of a CUDA graph holding ``calls`` calls, over ``replays`` timed replays."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / calls)
    return float(np.median(times))


def space_configs(op: str, n: int, seed: int, precision: str, strata_ms=None) -> list[dict]:
    """n configs of ``op`` from the collector's stratified GPU space (conf/space/<op>.yaml) and its catalog;
    ``strata_ms``, when given, replaces the space's time bands."""
    import yaml

    root = Path(__file__).resolve().parents[1] / "conf"
    space = yaml.safe_load((root / "space" / f"{op}.yaml").read_text())["gpu"]
    if strata_ms is not None:
        space["strata_ms"] = strata_ms
    catalog = yaml.safe_load((root / "catalog" / f"{op}.yaml").read_text())
    return sample_configs(get_op(op), space, n, seed, precision, catalog)


def configs(n: int, seed: int) -> list[tuple[str, dict]]:
    """n bf16 configs, half bmm and half linear, from the collector's stratified spaces (every time band)."""
    out = []
    for op in ("bmm", "linear"):
        # small ops, where methods differ, up to a few ms
        out += [(op, c) for c in space_configs(op, n // 2, seed, "bf16", [0, 0.01, 0.03, 0.1, 0.5, 2])]
    return out


def run(n: int, seed: int) -> pd.DataFrame:
    import torch

    torch.backends.cudnn.benchmark = True
    rows = []
    for i, (op, cfg) in enumerate(configs(n, seed)):
        fn, inputs, _params = get_op(op).build(cfg, "cuda", torch.bfloat16)
        with torch.no_grad():
            call = functools.partial(fn, *inputs)
            first = measure(call, "cuda", SETTINGS)
            again = measure(call, "cuda", SETTINGS)
            rows.append({"op": op, **cfg, "gpu_ms": first.median_ms, "gpu_repeat_ms": again.median_ms,
                         "host_ms": first.host_ms, "graph_ms": graph_ms(call, 20 if first.median_ms < 0.1 else 4),
                         "eager_ms": eager_ms(call)})
        del fn, inputs
        torch.cuda.empty_cache()
        if i % 20 == 0:
            print(f"{i}/{n} {op} {rows[-1]['gpu_ms']:.4f} ms", flush=True)
    return pd.DataFrame(rows)


def summary(frame: pd.DataFrame) -> str:
    """The check's verdict as a markdown table: agreement by size class."""
    small = frame[frame["graph_ms"] < 0.03]
    large = frame[frame["eager_ms"] > 0.1]
    lines = ["| comparison | configs | median abs. diff. | p90 abs. diff. | max abs. diff. |", "|---|---|---|---|---|"]

    def line(name, sub, a, b):
        d = (sub[a] / sub[b] - 1).abs() * 100
        if len(d):
            lines.append(f"| {name} | {len(d)} | {d.median():.2f} % | {d.quantile(0.9):.2f} % | {d.max():.2f} % |")

    line("GPU time vs CUDA-graph replay, ops < 30 us", small, "gpu_ms", "graph_ms")
    line("eager loop vs CUDA-graph replay, ops < 30 us", small, "eager_ms", "graph_ms")
    line("GPU time vs eager loop, ops > 0.1 ms", large, "gpu_ms", "eager_ms")
    line("GPU time vs CUDA-graph replay, ops > 0.1 ms", large, "gpu_ms", "graph_ms")
    line("GPU time, run to run (all ops)", frame, "gpu_repeat_ms", "gpu_ms")
    med = small[["gpu_ms", "graph_ms", "eager_ms", "host_ms"]].median() * 1e3
    lines.append("")
    lines.append(f"Ops under 30 us (median over {len(small)}): GPU time {med['gpu_ms']:.1f} us, graph replay "
                 f"{med['graph_ms']:.1f} us, eager loop {med['eager_ms']:.1f} us, host time per call "
                 f"{med['host_ms']:.1f} us.")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="reports")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("timing_check needs a CUDA GPU", file=sys.stderr)
        return 2
    frame = run(args.n, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "timing_check.csv", index=False)
    text = summary(frame)
    (out / "timing_check.md").write_text(f"# Timing-method check on {torch.cuda.get_device_name()}\n\n{text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
