import pandas as pd
import pytest

from coevo import io


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    dest = tmp_path / "table.json"
    io.write_json(dest, {"a": 1})
    with pytest.raises(RuntimeError):
        with io.atomic_path(dest) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert io.read_json(dest) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["table.json"]


def test_atomic_dir_swap(tmp_path):
    dest = tmp_path / "ckpt"
    for version in ("1", "2"):
        with io.atomic_path(dest, is_dir=True) as tmp:
            (tmp / "v").write_text(version)
    assert (dest / "v").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_parquet_round_trip(tmp_path):
    frame = pd.DataFrame({"x": [1, 2]})
    io.write_parquet(tmp_path / "f.parquet", frame)
    assert pd.read_parquet(tmp_path / "f.parquet").equals(frame)


def test_read_json_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1,\n nope}')
    with pytest.raises(ValueError, match=r"bad\.json: line 2, column 2: invalid JSON \(Expecting property name"):
        io.read_json(bad)
    with pytest.raises(FileNotFoundError, match=r"absent\.json: file does not exist"):
        io.read_json(tmp_path / "absent.json")
    with pytest.raises(ValueError, match=r"folder\.json: expected a file, found a folder"):
        (tmp_path / "folder.json").mkdir()
        io.read_json(tmp_path / "folder.json")
    (tmp_path / "empty.json").write_text(" \n")
    with pytest.raises(ValueError, match=r"empty\.json: file is empty"):
        io.read_json(tmp_path / "empty.json")
    (tmp_path / "latin1.json").write_bytes(b'{"a":\n "caf\xe9"}')
    with pytest.raises(ValueError, match=r"latin1\.json: line 2: not valid UTF-8 \(byte 0xe9"):
        io.read_json(tmp_path / "latin1.json")


def test_read_json_accepts_str_paths_and_a_bom(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + '{"k": "é"}'.encode())
    assert io.read_json(str(path)) == {"k": "é"}


def test_one_read_json_for_artifacts_and_raw_sources():
    from coevo.data import readers

    assert readers.read_json is io.read_json and readers.read_text is io.read_text


def test_jsonable_makes_json_types_only(tmp_path):
    import json
    import math

    import numpy as np
    import torch

    value = {
        1: np.float32(0.5), "i": np.int64(3), "b": np.bool_(True), "arr": np.arange(3), "t": torch.tensor(2.5),
        "tt": torch.tensor([[1, 2]]), "nan": float("nan"), "inf": np.float64(math.inf), "tuple": (1, "x"),
        "set": {"b", "a"}, "path": tmp_path, "none": None, "nested": [{"k": np.nan}],
    }
    out = io.jsonable(value)
    assert out == {
        "1": 0.5, "i": 3, "b": True, "arr": [0, 1, 2], "t": 2.5, "tt": [[1, 2]], "nan": None, "inf": None,
        "tuple": [1, "x"], "set": ["a", "b"], "path": str(tmp_path), "none": None, "nested": [{"k": None}],
    }
    assert type(out["i"]) is int and type(out["b"]) is bool and type(out["1"]) is float
    text = json.dumps(out, allow_nan=False)  # strict JSON: no NaN / Infinity
    io.write_json(tmp_path / "v.json", out)
    assert io.read_json(tmp_path / "v.json") == json.loads(text)


def test_artifacts_get_umask_mode_not_0600(tmp_path):
    import os

    umask = os.umask(0)
    os.umask(umask)
    path = io.write_text(tmp_path / "a.txt", "x")
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


# ------------------------------------------------ several processes, one writer (coevo.distributed)
@pytest.fixture
def launched(monkeypatch):
    """This process as rank ``r`` of a 2-process launch; barriers are recorded, not waited on."""
    from coevo import distributed

    events: list[str] = []
    monkeypatch.setattr(distributed, "barrier", lambda: events.append("barrier"))

    def as_rank(r: int) -> list[str]:
        monkeypatch.setenv("RANK", str(r))
        monkeypatch.setenv("WORLD_SIZE", "2")
        return events

    return as_rank


def test_only_rank_0_commits_a_write_and_every_rank_meets_at_the_barrier(tmp_path, launched):
    events = launched(1)
    io.write_json(tmp_path / "a.json", {"rank": 1})
    with io.atomic_path(tmp_path / "ckpt", is_dir=True) as tmp:
        io.write_json(tmp / "inner.json", {})  # nested: lands in this rank's temp folder, no barrier of its own
    assert list(tmp_path.iterdir()) == [] and events == ["barrier", "barrier"]  # nothing left behind
    with io.atomic_path(tmp_path / "ckpt", is_dir=True):
        io.write_json(tmp_path / "beside.json", {})  # inside the block, outside its folder: a shared write
    assert list(tmp_path.iterdir()) == [] and events == ["barrier"] * 4

    events = launched(0)
    io.write_json(tmp_path / "a.json", {"rank": 0})
    with io.atomic_path(tmp_path / "ckpt", is_dir=True) as tmp:
        io.write_json(tmp / "inner.json", {})
    assert io.read_json(tmp_path / "a.json") == {"rank": 0} and (tmp_path / "ckpt" / "inner.json").is_file()
    assert events == ["barrier"] * 6  # 4 on rank 1, 2 here


def test_a_failed_write_waits_for_no_one_and_a_private_write_commits_on_any_rank(tmp_path, launched):
    events = launched(1)
    with pytest.raises(RuntimeError):
        with io.atomic_path(tmp_path / "a.json") as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    io.write_json(tmp_path / "lock.json", {"pid": 1}, collective=False)
    assert [p.name for p in tmp_path.iterdir()] == ["lock.json"] and events == []


@pytest.mark.parametrize("rank, order", [(0, ["work", "barrier"]), (1, ["barrier", "work"])])
def test_writer_first_runs_rank_0_before_the_others(rank, order, launched):
    from coevo import distributed

    events = launched(rank)
    with distributed.writer_first():
        events.append("work")
    assert events == order


def test_outside_a_launch_every_process_writes(tmp_path, monkeypatch):
    from coevo import distributed

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed.is_writer() and not distributed.multi_process()
    distributed.barrier()  # a no-op: no process group is needed
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        distributed.world_size()
