"""Data-parallel steps: DDP's buckets, their overlap with backward, predict_step and the CLI with n_gpus."""

import numpy as np
import pandas as pd
import pytest

from pipeline.collectives.model import CollectiveModel, LinkParams, Protocol
from pipeline.step.parallel import (
    check_gpu_counts,
    configured_inter_node_gbps,
    data_parallel_step,
    ddp_buckets,
    overlap,
)

MIB = 2 ** 20


def _grads(sizes_mib, ready=None, dtype="float32"):
    n = len(sizes_mib)
    return pd.DataFrame({"param": range(n), "bytes": [int(s * MIB) for s in sizes_mib], "dtype": dtype,
                         "numel": [int(s * MIB) // 4 for s in sizes_mib],
                         "ready_seq": ready if ready is not None else list(range(n, 0, -1))})


def test_buckets_first_one_mib_then_25_mib_in_ready_order():
    # registered 0..5, ready in reverse (5 first); DDP closes a bucket once it holds at least its cap
    b = ddp_buckets(_grads([30, 10, 10, 10, 0.5, 0.75]))
    assert list(b["bytes"] / MIB) == [1.25, 30.0, 30.0]  # [5, 4] >= 1 MiB; [3, 2, 1] = 30 >= 25; [0]
    assert list(b["params"]) == [2, 3, 1] and list(b["ready_seq"]) == [2, 5, 6]


def test_buckets_split_dtypes_and_never_ready_params_go_last():
    grads = pd.concat([_grads([2, 2]), _grads([2], dtype="bfloat16").assign(param=2, ready_seq=1)],
                      ignore_index=True)
    grads.loc[0, "ready_seq"] = -1
    b = ddp_buckets(grads)
    assert sorted(zip(b["dtype"], b["bytes"] / MIB)) == [("bfloat16", 2.0), ("float32", 2.0), ("float32", 2.0)]
    assert np.isinf(b["ready_seq"].iloc[-1])
    assert list(ddp_buckets(_grads([30, 10]), bucket_mb=5, first_bucket_mb=5)["bytes"] / MIB) == [10, 30]


def test_overlap_adds_only_what_outlasts_backward():
    r = overlap([10.0, 20.0, 30.0], [5.0, 15.0, 8.0], backward_end_ms=32.0)
    # 10-15, 20-35 (waits for nothing), 35-43 (waits for the previous one): 11 ms after backward
    assert list(r["starts"]) == [10.0, 20.0, 35.0]
    assert r["exposed_ms"] == pytest.approx(11.0) and r["comm_ms"] == pytest.approx(28.0)
    assert overlap([1.0], [2.0], 10.0)["exposed_ms"] == 0.0  # hidden entirely
    with pytest.raises(ValueError, match="differ in length"):
        overlap([1.0], [1.0, 2.0], 5.0)


def test_data_parallel_step_from_op_times_and_copies():
    ops = pd.DataFrame({"seq": range(4), "phase": ["forward", "backward", "backward", "optimizer"],
                        "pred_ms": [10.0, 6.0, 4.0, 2.0]})
    grads = _grads([2, 2], ready=[3, 2])  # param 1 ready after op 1 (t=16), param 0 after op 2 (t=20)
    res = data_parallel_step(ops, grads, lambda nbytes, dtype: np.full(len(nbytes), 3.0))
    # buckets [1] ready 16 -> 16-19, [0] ready 20 -> 20-23: 3 ms after backward (20)
    assert res["buckets"] == 2 and res["exposed_ms"] == pytest.approx(3.0)
    assert res["step_ms"] == pytest.approx(22.0 + 3.0) and res["copy_ms"] == 0.0
    with_copies = data_parallel_step(ops, grads, lambda nbytes, dtype: np.full(len(nbytes), 3.0), copy_gbps=1.0)
    copy_each = 2 * 2 * MIB / 1e6  # ms per bucket at 1 GB/s: read + write
    assert with_copies["copy_ms"] == pytest.approx(4 * copy_each)
    assert with_copies["step_ms"] == pytest.approx(22.0 + 2 * copy_each + 3.0 + 2 * copy_each)


def test_gpu_counts_and_the_network_setting(tmp_path):
    assert check_gpu_counts([8, 1, 2, 2]) == [1, 2, 8] and check_gpu_counts(4) == [4]
    for bad in (0, [1, -2], [1.5], [True], []):
        with pytest.raises(ValueError, match="n_gpus"):
            check_gpu_counts(bad)
    assert configured_inter_node_gbps() is None  # shipped: not set
    conf = tmp_path / "multigpu.yaml"
    conf.write_text("inter_node:\n  bandwidth_gbps: 400\n")
    assert configured_inter_node_gbps(conf) == 400.0
    conf.write_text("inter_node:\n  bandwidth_gbps: fast\n")
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        configured_inter_node_gbps(conf)


# ------------------------------------------------------------------------------------ predict_step, CLI

torch = pytest.importorskip("torch")

_HALF = LinkParams((Protocol(10.0, 0.0, 0.5),))
FLAT = CollectiveModel({"nvlink": _HALF, "pcie": _HALF}, network=LinkParams((Protocol(20.0, 0.0, 0.5),)))


@pytest.fixture(scope="module")
def trace():
    from pipeline.step import models, track
    step = models.make_step("bert", 2, "fp32", "cpu", tiny=True)
    return track(step, warmup=1, repeats=1)


def test_the_trace_knows_when_each_gradient_is_ready(trace):
    g = trace.grads
    assert list(g["param"]) == list(range(len(g))) and (g["ready_seq"] > 0).all()
    backward = trace.ops.loc[trace.ops["phase"] == "backward", "seq"]
    assert g["ready_seq"].between(backward.min(), backward.max() + 1).all()
    assert g.loc[g["param"] == 0, "ready_seq"].item() == g["ready_seq"].max()  # the embedding: ready last


def test_predict_step_over_gpu_counts(trace, tmp_path):
    from pipeline.step import predict_step
    res = predict_step(None, ["h100", "l40s"], trace=trace, origin_gpu="h100", n_gpus=[1, 2, 8], batch=2,
                       scalers=False, collective_model=FLAT, plot=tmp_path / "scaling.png")
    t = res.table.set_index(["gpu", "n_gpus"])
    assert len(t) == 6 and t.loc[("h100-sxm", 8), "interconnect"] == "nvlink" and t.loc[("l40s", 8), "interconnect"] \
        == "pcie"
    one, eight = t.loc[("l40s", 1)], t.loc[("l40s", 8)]
    assert eight["step_ms"] == pytest.approx(one["step_ms"] + eight["ddp_copy_ms"] + eight["exposed_comm_ms"])
    assert eight["exposed_comm_ms"] > 0 and eight["comm_ms"] >= eight["exposed_comm_ms"] - 1e-9
    assert eight["throughput"] == pytest.approx(8 * 2 * 1000 / eight["step_ms"])
    assert eight["scaling_efficiency"] == pytest.approx(one["step_ms"] / eight["step_ms"])
    assert eight["usd_per_hour"] == pytest.approx(8 * one["usd_per_hour"])
    assert eight["usd_per_1k_batches"] == pytest.approx(eight["usd_per_1k_steps"] / 8)
    assert res.table.attrs["throughput_unit"] == "samples/s" and (tmp_path / "scaling.png").stat().st_size > 1000
    # the gradients: all-reduced fp32 bytes on a slower link take longer
    assert t.loc[("l40s", 2), "comm_ms"] > t.loc[("h100-sxm", 2), "comm_ms"]


@pytest.mark.parametrize("kwargs, message", [
    ({"n_gpus": [0, 1]}, "n_gpus"),
    ({"n_gpus": [2], "interconnect": "infiniband"}, "interconnect: 'infiniband' is not one of"),
    ({"n_gpus": [2], "interconnect": "nvlink", "gpus": ["l4"]}, "l4 has no NVLink"),
    ({"n_gpus": [16]}, "more GPUs than one h100-sxm node holds"),
    ({"n_gpus": [2], "batch": 0}, "batch"),
])
def test_bad_multi_gpu_inputs_are_refused_before_tracking(kwargs, message):
    from pipeline.step import predict_step
    gpus = kwargs.pop("gpus", ["h100"])
    with pytest.raises(ValueError, match=message):
        predict_step(lambda: (_ for _ in ()).throw(AssertionError("tracked")), gpus, origin_gpu="h100",
                     collective_model=FLAT, **kwargs)


def test_past_one_node_with_the_network_bandwidth(trace):
    from pipeline.step import predict_step
    res = predict_step(None, ["h100"], trace=trace, origin_gpu="h100", n_gpus=[8, 16], inter_node_gbps=50.0,
                       scalers=False, collective_model=FLAT)
    comm = res.table.set_index("n_gpus")["comm_ms"]
    assert comm[16] > comm[8]  # 0.5 x 50 GB/s between nodes, 0.5 x 450 within


def test_a_trace_without_gradients_cannot_go_data_parallel(trace):
    from pipeline.step import Trace, predict_step
    bare = Trace(ops=trace.ops, total_ms=trace.total_ms, origin=trace.origin, meta=trace.meta)
    assert predict_step(None, ["h100"], trace=bare, origin_gpu="h100", scalers=False).table["n_gpus"].tolist() == [1]
    with pytest.raises(ValueError, match="no gradient table"):
        predict_step(None, ["h100"], trace=bare, origin_gpu="h100", n_gpus=[2], scalers=False, collective_model=FLAT)


def test_cli_prints_the_scaling_table(tmp_path, capsys):
    from pipeline.step import main
    rc = main(["--model", "resnet50", "--tiny", "--batch", "2", "--device", "cpu", "--origin-gpu", "h100",
               "--gpus", "h100,l40s", "--ngpus", "1,2,4", "--no-scalers", "--warmup", "1", "--repeats", "1",
               "--plot", str(tmp_path / "s.png")])
    out = capsys.readouterr().out
    assert rc == 0 and "exposed" in out and "nvlink" in out and "pcie" in out and (tmp_path / "s.png").exists()
    assert main(["--tiny", "--device", "cpu", "--origin-gpu", "h100", "--ngpus", "1,x"]) == 2
    assert main(["--tiny", "--device", "cpu", "--origin-gpu", "h100", "--ngpus", "16", "--gpus", "h100"]) == 2
    assert "inter_node_gbps" in capsys.readouterr().err


# ------------------------------------------------------------------- the buckets against DDP's own (gloo)

@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="needs torch.distributed gloo")
def test_ddp_buckets_match_torch_ddp_after_its_rebuild(tmp_path):
    from pipeline.step import models, track
    from pipeline.step.ddp import measure_ddp
    config = {"seq": 8, "layers": 4, "hidden": 512, "heads": 4, "ffn": 1024, "vocab": 8192}
    case = {"model": "bert", "batch": 1, "precision": "fp32", "config": config}
    measured = measure_ddp([case], 2, tmp_path / "ddp.json", path="host", device="cpu", backend="gloo", warmup=2,
                           steps=1, time_limit_s=60)
    trace = track(models.make_step("bert", 1, "fp32", "cpu", **config), warmup=1, repeats=1)
    ours = list(ddp_buckets(trace.grads)["bytes"])
    assert len(ours) >= 3  # the 1 MiB first bucket and more than one 25 MiB bucket are exercised
    assert ours == measured[0]["rebuilt_bucket_sizes"]
    assert measured[0]["bucket_cap_bytes"] == 25 * MIB and measured[0]["world"] == 2
