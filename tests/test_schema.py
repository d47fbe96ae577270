"""Dataset schema: good rows round-trip, bad rows are refused with file/row/field in the message."""

import numpy as np
import pandas as pd
import pytest

from pipeline import schema


def _row(**overrides):
    row = dict(op="bmm", gpu="h200", source="own", precision="fp32", phase="forward", time_ms=0.5,
               time_p20_ms=0.45, time_p80_ms=0.55, reps=10, status="ok", error="", batch=2, m=3, k=4, n=5)
    row.update(overrides)
    if "config_id" not in overrides:
        row["config_id"] = schema.config_id(row["op"], row)
    return row


def test_config_id_is_stable_and_config_sensitive():
    a = schema.config_id("bmm", {"batch": 2, "m": 3, "k": 4, "n": 5})
    assert a == schema.config_id("bmm", {"n": 5, "k": 4, "m": 3, "batch": np.int64(2), "extra": 1})
    assert a != schema.config_id("bmm", {"batch": 2, "m": 3, "k": 5, "n": 4})
    assert a != schema.config_id("linear", {"batch": 2, "in_features": 3, "out_features": 4, "bias": True})
    assert len(a) == 16


def test_roundtrip_and_whole_dataset_reads(tmp_path):
    rows = [_row(), _row(op="linear", precision="bf16", phase="backward", batch=8, in_features=16, out_features=4,
                         bias=True, m=None, k=None, n=None),
            _row(status="oom", time_ms=None, time_p20_ms=None, time_p80_ms=None, reps=0, error="OOM", m=9)]
    paths = schema.write_partition(schema.make_rows(rows), tmp_path, "part-0", {"gpu_name": "NVIDIA H200"})
    assert {p.parent.name for p in paths} == {"op=bmm", "op=linear"}
    assert schema.file_metadata(paths[0])["gpu_name"] == "NVIDIA H200"
    back = schema.read_dataset(tmp_path)
    assert len(back) == 3 and set(back["op"]) == {"bmm", "linear"} and set(back["gpu"]) == {"h200"}
    assert len(pd.read_parquet(tmp_path)) == 3  # one call reads everything
    bmm = schema.op_frame(back, "bmm")
    assert list(bmm.columns[-4:]) == ["batch", "m", "k", "n"] and bmm["m"].dtype == np.int64
    assert not list(tmp_path.rglob(".*"))  # no temp files left behind


def test_hidden_files_are_skipped(tmp_path):
    schema.write_partition(schema.make_rows([_row()]), tmp_path, "part-0")
    (tmp_path / "gpu=h200" / "op=bmm" / ".part-1.parquet.tmp").write_bytes(b"partial")
    (tmp_path / "gpu=h200" / "op=bmm" / "_partial.parquet").write_bytes(b"partial")
    assert len(schema.dataset_files(tmp_path)) == 1
    assert len(schema.read_dataset(tmp_path)) == 1


@pytest.mark.parametrize("field,value,needle", [
    ("op", "conv3d", "'op'"), ("precision", "fp8", "'precision'"), ("phase", "both", "'phase'"),
    ("status", "fine", "'status'"), ("time_ms", -1.0, "'time_ms'"), ("time_ms", float("nan"), "'time_ms'"),
    ("time_ms", float("inf"), "'time_ms'"), ("time_p20_ms", 0.0, "'time_p20_ms'"), ("reps", 0, "'reps'"),
    ("m", 0, "'m'"), ("k", 2.5, "'k'"), ("gpu", "", "'gpu'"), ("source", None, "'source'"),
])
def test_bad_rows_name_row_and_field(field, value, needle):
    rows = [_row(), _row(**{field: value, "config_id": "x" * 16})]
    frame = schema.make_rows(rows)
    with pytest.raises(schema.SchemaError) as err:
        schema.validate(frame, where="somefile.parquet")
    message = str(err.value)
    assert "somefile.parquet" in message and "row 1" in message and needle in message


def test_missing_column_and_wrong_bool():
    frame = schema.make_rows([_row()]).drop(columns=["reps"])
    with pytest.raises(schema.SchemaError, match="missing columns"):
        schema.validate(frame)
    row = _row(op="linear", batch=2, in_features=3, out_features=4, bias="yes", m=None, k=None, n=None,
               config_id="y" * 16)
    with pytest.raises(schema.SchemaError, match="'bias'"):
        schema.validate(schema.make_rows([row]))


def test_read_refuses_wrong_types_and_foreign_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "gpu=h200" / "op=bmm" / "bad.parquet"
    path.parent.mkdir(parents=True)
    good = schema.make_rows([_row()]).drop(columns=["gpu", "op"])
    table = pa.Table.from_pandas(good.assign(time_ms=good["time_ms"].astype(str)), preserve_index=False)
    pq.write_table(table, path)
    with pytest.raises(schema.SchemaError, match="time_ms"):
        schema.read_dataset(tmp_path)
    path.write_bytes(b"not parquet")
    with pytest.raises(schema.SchemaError, match="bad.parquet"):
        schema.read_file(path)


def test_write_refuses_bad_rows_without_leaving_files(tmp_path):
    with pytest.raises(schema.SchemaError):
        schema.write_partition(schema.make_rows([_row(time_ms=-2.0)]), tmp_path, "part-0")
    assert not any(tmp_path.rglob("*"))


def test_validate_refuses_a_config_id_that_is_not_its_configs_id():
    frame = schema.make_rows([_row(), _row(m=7, config_id=schema.config_id("bmm", _row()))])
    with pytest.raises(schema.SchemaError, match=r"row 1 field 'config_id'"):
        schema.validate(frame)


@pytest.mark.parametrize("p20,p50,p80", [(0.6, 0.5, 0.7), (0.4, 0.5, 0.45)])
def test_validate_refuses_percentiles_out_of_order(p20, p50, p80):
    frame = schema.make_rows([_row(), _row(time_ms=p50, time_p20_ms=p20, time_p80_ms=p80)])
    with pytest.raises(schema.SchemaError, match=r"row 1 fields 'time_p20_ms' <= 'time_ms' <= 'time_p80_ms'"):
        schema.validate(frame)


def test_host_time_and_launch_bound_round_trip_and_are_checked(tmp_path):
    rows = [_row(host_ms=0.02, launch_bound=True), _row(m=4, host_ms=None, launch_bound=None)]
    schema.write_partition(schema.make_rows(rows), tmp_path, "part-0")
    back = schema.read_dataset(tmp_path)
    assert back["host_ms"].iloc[0] == 0.02 and pd.isna(back["host_ms"].iloc[1])
    assert back["launch_bound"].iloc[0] and pd.isna(back["launch_bound"].iloc[1])
    with pytest.raises(schema.SchemaError, match="field 'host_ms'"):
        schema.validate(schema.make_rows([_row(host_ms=-1.0)]))


def test_first_call_time_round_trips_and_is_checked(tmp_path):
    rows = [_row(first_call_ms=850.0), _row(m=4, first_call_ms=None)]
    schema.write_partition(schema.make_rows(rows), tmp_path, "part-0")
    back = schema.read_dataset(tmp_path)
    assert back["first_call_ms"].iloc[0] == 850.0 and pd.isna(back["first_call_ms"].iloc[1])
    with pytest.raises(schema.SchemaError, match="row 0 field 'first_call_ms'"):
        schema.validate(schema.make_rows([_row(first_call_ms=0.0)]))


def test_files_written_before_the_host_time_column_still_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = schema.write_partition(schema.make_rows([_row()]), tmp_path, "part-0")[0]
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["host_ms", "launch_bound", "first_call_ms"]), path)
    back = schema.read_dataset(tmp_path)
    assert len(back) == 1 and pd.isna(back["host_ms"].iloc[0]) and pd.isna(back["launch_bound"].iloc[0])
    assert pd.isna(back["first_call_ms"].iloc[0])
    pq.write_table(pa.Table.from_pandas(pd.DataFrame({"config_id": ["x"]})), path)
    with pytest.raises(schema.SchemaError, match="missing columns"):
        schema.read_dataset(tmp_path)


@pytest.mark.parametrize("text,name", [("BF16", "bf16"), (" bfloat16", "bf16"), ("Half", "fp16"), ("fp32", "fp32")])
def test_precision_names_are_normalised(text, name):
    assert schema.normalize_precision(text) == name


def test_unknown_precision_names_the_field_and_the_allowed_values():
    with pytest.raises(ValueError, match=r"precision: unknown precision 'fp8'; allowed: fp32, tf32, fp16, bf16"):
        schema.normalize_precision("fp8")
