"""On a CUDA GPU: a small real sweep and a tracked training step (skipped without CUDA)."""

from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parent.parent


def test_sweep_on_the_gpu_measures_every_op_and_precision(tmp_path):
    from pipeline import schema
    from pipeline.collect import Sweep, run_sweep

    spaces = {op: yaml.safe_load((ROOT / "conf" / "space" / f"{op}.yaml").read_text()) for op in schema.OPS}
    catalogs = {op: yaml.safe_load((ROOT / "conf" / "catalog" / f"{op}.yaml").read_text()) for op in schema.OPS}
    summary = run_sweep(Sweep(gpu="gpu-test", device="cuda:0", n=3, out=str(tmp_path), spaces=spaces,
                              catalogs=catalogs, precisions=("fp32", "tf32", "bf16"), progress=False))
    rows = schema.read_dataset(tmp_path)
    assert len(rows) == 4 * 3 * 3 * 2 and summary["status"] == {"ok": 72}
    assert set(rows["precision"]) == {"fp32", "tf32", "bf16"}
    meta = schema.file_metadata(schema.dataset_files(tmp_path)[0])
    assert meta["sm_count"] > 0 and meta["characterisation"]["copy_bandwidth_gbps"] > 0
    assert meta["timing_method"].startswith("GPU time: CUDA events")
    ok = rows[rows["status"] == "ok"]
    assert (ok["host_ms"] > 0).all() and ok["launch_bound"].notna().all() and (ok["first_call_ms"] > 0).all()


def test_untuned_call_on_the_gpu_times_both_phases_and_leaves_autotuning_on():
    from pipeline.collect.worker import untuned_call_ms

    conv = torch.nn.Conv2d(256, 256, 3, padding=1).cuda()
    x = torch.randn(64, 256, 56, 56, device="cuda", requires_grad=True)
    torch.backends.cudnn.benchmark = True
    ms = untuned_call_ms(torch, lambda: conv(x), lambda out: lambda: torch.autograd.grad(
        out, [x, *conv.parameters()], torch.randn_like(out)), "cuda")
    assert torch.backends.cudnn.benchmark is True and ms["forward"] > 0.1 and ms["backward"] > ms["forward"] / 10


def _kernels_in(call) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def test_after_the_screen_a_convs_first_call_still_autotunes(monkeypatch):
    """cuDNN's autotuning runs every candidate algorithm on a shape's first call: many more kernels than the call
    after it. A screen that left its heuristic pick in PyTorch's algorithm cache made the two calls alike."""
    from pipeline.collect.worker import untuned_call_ms

    conv = torch.nn.Conv2d(96, 160, 3, padding=1).cuda()
    x = torch.randn(24, 96, 40, 40, device="cuda")   # a shape no other test runs
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    with torch.no_grad():
        untuned_call_ms(torch, lambda: conv(x), None, "cuda")
        first, second = _kernels_in(lambda: conv(x)), _kernels_in(lambda: conv(x))
    assert first > 2 * second, (first, second)


def test_tracking_a_conv_step_without_autotuning_warns(monkeypatch):
    from pipeline.step import track
    from pipeline.step.record import HEURISTIC_CONV_NOTE

    conv = torch.nn.Conv2d(16, 16, 3, padding=1).cuda()
    x = torch.randn(8, 16, 32, 32, device="cuda")
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    with pytest.warns(UserWarning, match="cudnn.benchmark = False"):
        trace = track(lambda: conv(x).sum().backward(), warmup=1, repeats=1)
    assert trace.meta["cudnn_benchmark"] is False and "heuristic" in HEURISTIC_CONV_NOTE


def test_tracked_step_on_the_gpu_covers_the_measured_step():
    """A GPU-bound step: on an H200 a 1.5 ms toy step (batch 64) was launch-bound and its ops covered only
    79 % of it (the rest is the GPU waiting for Python), so this step is sized like real training."""
    from pipeline.step import track

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(64 * 32 * 32, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.Adam(net.parameters())
    x = torch.randn(512, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (512,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    trace = track(step, warmup=3, repeats=10)
    ops = trace.ops
    assert {"conv2d", "linear"} <= set(ops["op"]) and set(ops["phase"]) == {"forward", "backward", "optimizer"}
    conv = ops[(ops["op"] == "conv2d") & (ops["phase"] == "forward")].iloc[0]
    assert (conv["batch"], conv["in_channels"], conv["out_channels"], conv["kernel_h"]) == (512, 3, 64, 3)
    assert 0.8 < trace.coverage < 1.25
