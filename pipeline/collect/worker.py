"""The worker process: one per device. It describes its device, then measures the tasks it is handed."""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from pipeline import schema
from pipeline.collect.plan import Task
from pipeline.ops import get_op
from pipeline.timing import Timing, TimingSettings, measure

CUDA_FATAL = ("illegal memory access", "unspecified launch failure", "device-side assert", "CUDA error: an illegal",
              "misaligned address", "cudaErrorLaunchFailure")


def set_precision_flags(torch, precision: str):
    """Set the TF32 switches for ``precision`` and return its tensor dtype (fp32 means TF32 off)."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def task_rows(task: Task, gpu: str, results: dict[str, tuple]) -> list[dict]:
    """The schema rows of one measured task: one per phase."""
    rows = []
    for phase in (p for p in schema.PHASES if p in results):
        status, timing, error = results[phase]
        t: Timing | None = timing
        rows.append({"config_id": task.config_id, "op": task.op, "gpu": gpu, "source": "own",
                     "precision": task.precision, "phase": phase, "time_ms": t and t.median_ms,
                     "time_p20_ms": t and t.p20_ms, "time_p80_ms": t and t.p80_ms, "host_ms": t and t.host_ms,
                     "first_call_ms": (t.first_s * 1e3 or None) if t else None,   # 0: not timed
                     "launch_bound": None if t is None else bool(t.host_ms >= t.median_ms),
                     "reps": t.reps if t else 0, "status": status, "error": error, **task.config})
    return rows


def task_seconds(results: dict[str, tuple], wall_s: float) -> dict[str, float]:
    """Where a task's wall time went: first (autotuning) calls, the rest of the measurements, and the rest
    (building inputs, freeing memory, the backward's graph)."""
    timings = [r[1] for r in results.values() if r[1] is not None]
    first = sum(t.first_s for t in timings)
    measured = sum(t.total_s for t in timings)
    return {"first_call_s": first, "timing_s": measured - first, "other_s": max(wall_s - measured, 0.0)}


def run_task(task: Task, device: str, timing: TimingSettings, faults: Mapping[str, list],
             phases: tuple[str, ...] = schema.PHASES, explicit_backward: bool = False,
             screen_ms: float | None = None) -> tuple[dict, bool]:
    """Measure one task in ``phases``. Returns ({phase: (status, Timing, error)}, fatal). The backward is
    ``torch.autograd.grad``, or with ``explicit_backward`` the same ATen ops called on this thread. With
    ``screen_ms``, a task whose untuned call outlasts it in any phase is not measured (``over_budget`` rows)."""
    import torch

    device_type = "cuda" if device.startswith("cuda") else "cpu"
    results: dict[str, tuple] = {}
    fatal = False
    try:
        _inject_faults(task, faults, torch)
        dtype = set_precision_flags(torch, task.precision)
        spec = get_op(task.op)
        fn, inputs, params = spec.build(task.config, device, dtype)
        flush = _l2_flusher(device) if timing.flush_l2 else None
        chain = spec.sequential_steps(task.config) > 1
        wrt = inputs + params

        def backward_of(out):  # the timed backward of one forward's output
            grad_out = torch.randn_like(out)
            return (spec.explicit_backward(task.config, fn, inputs, grad_out) if explicit_backward
                    else functools.partial(torch.autograd.grad, out, wrt, grad_out, retain_graph=True))

        if screen_ms is not None:
            untuned = untuned_call_ms(torch, lambda: fn(*inputs), backward_of if "backward" in phases else None,
                                      device_type, again_over_ms=screen_ms)
            over = {ph: ms for ph, ms in untuned.items() if ms > screen_ms}
            if over:
                message = ("untuned call " + ", ".join(f"{ph} {ms:.1f} ms" for ph, ms in over.items())
                           + f" > screen_ms {screen_ms:g}: not autotuned or timed")
                return dict.fromkeys(phases, ("over_budget", None, message)), fatal
        results["forward"] = _measured(measure(lambda: fn(*inputs), device_type, timing, flush, chain))
        if "backward" not in phases:
            return results, fatal
        backward = backward_of(fn(*inputs))
        results["backward"] = _measured(measure(backward, device_type, timing, flush, chain))
    except torch.OutOfMemoryError as exc:
        _fill(results, "oom", exc, phases)
    except Exception as exc:  # library errors (cuDNN, cuBLAS, unsupported dtype...) become rows
        _fill(results, "error", exc, phases)
        fatal = any(marker in str(exc) for marker in CUDA_FATAL)
    finally:
        fn = inputs = params = wrt = backward = backward_of = None  # noqa: F841  (free before the next task)
        if device_type == "cuda" and not fatal:
            torch.cuda.empty_cache()
    return results, fatal


SCREEN_KEY = "cudnn.deterministic"
"""How the screen keeps its untuned pick out of the task's cuDNN cache key; recorded in a screened sweep's files.
Files of the first screen (2026-12-02), which shared the key, lack it."""


def untuned_call_ms(torch, forward, backward_of, device_type: str,
                    again_over_ms: float | None = None) -> dict[str, float]:
    """Host wall time of one synced call per phase with cuDNN's autotuning off (its heuristic algorithm): a screen
    of what a call costs before the first autotuned call, which runs every candidate algorithm. Not a measurement:
    nothing of it is recorded as a time. ``backward_of(out)`` is the backward the task times (None: forward only),
    so a partition's explicit backward is screened as it is measured. A call over ``again_over_ms`` runs once
    more and the second time counts: a shape's first call can also pay one-time costs (kernels loaded on first
    use, the library's plan for the shape). Screened on the first call alone, tiny convolutions were skipped (a
    1-channel 1x1 fp16 conv at batch 42: 253 ms; depthwise fp16 3x3 convs of MobileNet shapes, 0.05-0.5 GFLOP:
    262-1,191 ms).

    The screen runs with ``cudnn.deterministic`` on. PyTorch caches one cuDNN algorithm per convolution key, and
    the key holds the deterministic switch but not the benchmark one: a screen under the task's own key left its
    heuristic pick in the cache, and the task's "autotuned" calls reused it (the sweeps of 2026-12-02 with
    ``screen_ms``, retired). ``benchmarks/screen_check.py`` shows on a GPU whether the first call now autotunes."""
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)

    def timed(call):
        sync()
        start = time.perf_counter()
        result = call()
        sync()
        return result, (time.perf_counter() - start) * 1e3

    def screened(call):
        result, ms = timed(call)
        if again_over_ms is not None and ms > again_over_ms:
            result, ms = timed(call)
        return result, ms

    benchmark, deterministic = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    try:
        out, ms_forward = screened(forward)
        ms = {"forward": ms_forward}
        if backward_of is not None:
            ms["backward"] = screened(backward_of(out))[1]
        return ms
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, deterministic


def _measured(t: Timing) -> tuple[str, Timing, str]:
    if t.host_paced:
        return "host_paced", t, ("the GPU had begun a group before the host finished queueing it: time_ms may be "
                                 "host-paced, not GPU time")
    return "ok", t, ""


def _inject_faults(task: Task, faults: Mapping[str, list], torch) -> None:
    if task.config_id in faults.get("hang", []):
        time.sleep(3600)
    if task.config_id in faults.get("crash", []):
        os._exit(17)
    if task.config_id in faults.get("oom", []):
        raise torch.OutOfMemoryError("injected out-of-memory (fault_injection.oom)")


_L2_BUFFERS: dict[str, Any] = {}


def _l2_flusher(device: str):
    """A callable that overwrites a buffer twice the size of the device's L2 cache (64 MiB on a CPU)."""
    import torch

    if device not in _L2_BUFFERS:
        size = (2 * torch.cuda.get_device_properties(torch.device(device)).L2_cache_size
                if device.startswith("cuda") else 64 * 2**20)
        _L2_BUFFERS[device] = torch.empty(size, dtype=torch.uint8, device=device)
    return _L2_BUFFERS[device].zero_


def _fill(results: dict, status: str, exc: BaseException, phases: tuple[str, ...] = schema.PHASES):
    message = f"{type(exc).__name__}: {exc}"[:500]
    for phase in phases:
        results.setdefault(phase, (status, None, message))


def environment(device: str, timing: TimingSettings) -> dict[str, Any]:
    """What the dataset records about where and how it was measured."""
    import platform

    import torch

    env: dict[str, Any] = {"host": socket.gethostname(), "python": platform.python_version(),
                           "torch": torch.__version__, "cuda": torch.version.cuda,
                           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                           "cudnn_benchmark": True, "tf32": "off for fp32, on for tf32",
                           "timing_method": timing.describe("cuda" if device.startswith("cuda") else "cpu"),
                           "time_definition": "time_ms: GPU execution time per call (median over reps); host_ms: "
                                              "host time to enqueue one call; launch_bound: host_ms >= time_ms",
                           "device": device}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update(gpu_name=props.name, sm_count=props.multi_processor_count,
                   memory_gb=round(props.total_memory / 1e9, 1),
                   l2_cache_mb=round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
                   compute_capability=f"{props.major}.{props.minor}", **_nvidia_smi(int(device.split(':')[1])))
    else:
        env.update(gpu_name=f"CPU ({platform.processor() or platform.machine()})", cpu_count=os.cpu_count())
    return env


def _nvidia_smi(index: int) -> dict[str, Any]:
    import subprocess

    fields = "driver_version,clocks.max.sm,clocks.max.mem,clocks.sm,power.limit"
    try:
        line = subprocess.run(["nvidia-smi", f"--id={index}", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
        values = [v.strip() for v in line.split(",")]
        return dict(zip(("driver", "max_sm_clock_mhz", "max_mem_clock_mhz", "sm_clock_mhz_at_start", "power_limit"),
                        values))
    except (OSError, subprocess.SubprocessError):
        return {"driver": None}


def characterise(device: str) -> dict[str, Any]:
    """Measured achievable memory bandwidth and matmul throughput per precision (of the SM partition, when the
    worker runs in one), so a GPU or partition missing from the registry can still be described."""
    import torch

    if not device.startswith("cuda"):
        return {}
    timing = TimingSettings(warmup_ms=20, min_time_ms=50, min_reps=5, max_reps=50)
    src = torch.empty(512 * 2**20 // 4, dtype=torch.float32, device=device)
    ms = measure(functools.partial(torch.Tensor.copy_, torch.empty_like(src), src), "cuda", timing).median_ms
    result: dict[str, Any] = {"copy_bandwidth_gbps": round(2 * src.numel() * 4 / (ms * 1e-3) / 1e9, 1)}
    del src
    size = 8192
    for precision in schema.PRECISIONS:
        dtype = set_precision_flags(torch, precision)
        operands = [torch.randn(size, size, dtype=dtype, device=device) for _ in range(2)]
        ms = measure(functools.partial(torch.matmul, *operands), "cuda", timing).median_ms
        result[f"matmul_{precision}_tflops"] = round(2 * size**3 / (ms * 1e-3) / 1e12, 1)
        del operands
    set_precision_flags(torch, "fp32")
    torch.cuda.empty_cache()
    return result


def explicit_backward_in(sm_partition: int | None, partition_backward: str) -> bool:
    """Whether a worker times the backward as explicit ATen ops (inside an SM partition, when asked to)."""
    return bool(sm_partition) and partition_backward == "explicit"


def task_phases(sm_partition: int | None, partition_backward: str = "skip") -> tuple[str, ...]:
    """The phases a worker measures. Inside an SM partition PyTorch's autograd runs CUDA backward ops on its own
    device threads, outside the green context, and the events on the partition's stream missed those kernels
    (on an H200 the recorded backward took 1e-4 of the forward's time): there the backward is skipped, or with
    ``partition_backward="explicit"`` measured as the same ATen ops called on the worker's own thread."""
    if sm_partition and not explicit_backward_in(sm_partition, partition_backward):
        return ("forward",)
    return schema.PHASES


def enter_partition(device: str, sms: int) -> dict[str, Any]:
    """Run the rest of this process inside a green context of ``sms`` SMs; returns what was obtained (the
    driver may round the count to its granularity, so the SMs actually reached are counted)."""
    import torch
    from torch.cuda.green_contexts import GreenContext

    index = torch.device(device).index or 0
    context = GreenContext.create(num_sms=int(sms), device_id=index)
    context.set_context()
    _PARTITION["context"] = context  # keep it alive for the process's lifetime
    return {"sm_partition_requested": int(sms), "sm_partition_reached": count_reachable_sms(device)}


_PARTITION: dict[str, Any] = {}


def count_reachable_sms(device: str) -> int | None:
    """How many distinct SMs a wide launch reaches on the current context (Triton reads %smid)."""
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def sm_ids(out_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        ids = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [offs], dtype=tl.int32, is_pure=False,
                                        pack=1)
        tl.store(out_ptr + tl.program_id(0) * BLOCK + offs, ids)

    blocks = 8 * torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    out = torch.full((blocks * 32,), -1, dtype=torch.int32, device=device)
    sm_ids[(blocks,)](out, BLOCK=32)
    torch.cuda.synchronize()
    return int(torch.unique(out[out >= 0]).numel())


def worker_main(conn, device: str, gpu: str, timing: TimingSettings, faults: Mapping[str, list],
                describe: bool, sm_partition: int | None = None, cudnn_benchmark_limit: int | None = None,
                partition_backward: str = "skip", screen_ms: float | None = None):
    """One process per device: receive a task, send back its rows; exit after a fatal CUDA error."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    torch.backends.cudnn.benchmark = True
    if cudnn_benchmark_limit is not None:
        torch.backends.cudnn.benchmark_limit = cudnn_benchmark_limit
    if device == "cpu":
        torch.set_num_threads(1)
    env = environment(device, timing)
    if sm_partition:
        env.update(enter_partition(device, sm_partition))
    if describe:
        env["characterisation"] = characterise(device)
    conn.send(("ready", env))
    phases = task_phases(sm_partition, partition_backward)       # the same for every task of this worker
    explicit = explicit_backward_in(sm_partition, partition_backward)
    while True:
        task = conn.recv()
        if task is None:
            return
        started = time.perf_counter()
        results, fatal = run_task(task, device, timing, faults, phases, explicit_backward=explicit, screen_ms=screen_ms)
        conn.send(("done", task_rows(task, gpu, results), task_seconds(results, time.perf_counter() - started)))
        if fatal:
            os._exit(3)
