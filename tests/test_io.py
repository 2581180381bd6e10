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
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="bad.json: invalid JSON at line 1"):
        io.read_json(bad)
    with pytest.raises(FileNotFoundError, match="absent.json"):
        io.read_json(tmp_path / "absent.json")


def test_artifacts_get_umask_mode_not_0600(tmp_path):
    import os

    umask = os.umask(0)
    os.umask(umask)
    path = io.write_text(tmp_path / "a.txt", "x")
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
