"""tests/run_by_file.py: every failing file counts in the closing line, by name (issue 24).

Tiny test files in a temporary tests/ folder: passing, failing, crashing (os._exit, SIGSEGV),
hanging past a short per-file timeout, empty on purpose and empty by accident."""

from __future__ import annotations

import json
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tests import run_by_file

FILES = {
    "test_a_pass.py": """
        import pytest
        def test_one(): pass
        def test_two(): pass
        def test_skipped(): pytest.skip("not here")
    """,
    "test_b_fail.py": """
        def test_ok(): pass
        def test_fails(): assert 1 == 2
    """,
    "test_c_crash.py": """
        import os
        def test_ok(): pass
        def test_crashes(): os._exit(3)
        def test_never_runs(): pass
    """,
    "test_d_sleep.py": """
        import time
        def test_ok(): pass
        def test_hangs(): time.sleep(600)
    """,
    "test_e_empty.py": "HELPERS = 1\n",
    "test_f_lost.py": "# its tests were lost\n",
    "test_g_segv.py": """
        import os, signal
        def test_segfaults(): os.kill(os.getpid(), signal.SIGSEGV)
    """,
}
TIMEOUT_S = 20  # well above a tiny file's pytest start-up on a busy machine


def _tests_dir(root: Path, files: dict[str, str]) -> Path:
    tests = root / "tests"
    tests.mkdir()
    for name, body in files.items():
        (tests / name).write_text(textwrap.dedent(body))
    return tests


def test_crashed_and_timed_out_files_count_as_failed_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(run_by_file.TIMEOUT_ENV, str(TIMEOUT_S))
    monkeypatch.setenv(run_by_file.JOBS_ENV, "2")  # two at a time: a hanging file does not hold up the others
    tests = _tests_dir(tmp_path, FILES)
    rc = run_by_file.main(["-p", "no:cacheprovider"], tests_dir=tests, empty_ok={"test_e_empty.py"}, servers=False)
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 1
    assert lines[-1] == (
        "5 passed, 5 failed, 1 skipped; failing: test_b_fail.py (1 failed), test_c_crash.py (crashed: exit 3), "
        f"test_d_sleep.py (timed out after {TIMEOUT_S}s), test_f_lost.py (no tests collected), "
        "test_g_segv.py (crashed: signal SIGSEGV)"
    )
    assert lines[-2].startswith("files: 5 failing ['test_b_fail.py', 'test_c_crash.py', 'test_d_sleep.py', "
                                "'test_f_lost.py', 'test_g_segv.py']; ")
    per_file = {line.split(":", 1)[0]: line for line in lines if line.startswith("test_")}
    assert per_file["test_a_pass.py"].endswith("(rc=0)") and "2 passed, 1 skipped" in per_file["test_a_pass.py"]
    assert per_file["test_c_crash.py"].endswith("(rc=3); crashed: exit 3")
    assert per_file["test_d_sleep.py"] == f"test_d_sleep.py: timed out after {TIMEOUT_S}s, killed"
    assert per_file["test_e_empty.py"].endswith("(rc=5)")


def test_all_passing_and_deselected_files_pass(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(run_by_file.TIMEOUT_ENV, "0")  # 0: no timeout
    monkeypatch.setenv(run_by_file.JOBS_ENV, "1")
    tests = _tests_dir(tmp_path, {"test_a_pass.py": FILES["test_a_pass.py"],
                                  "test_h_other.py": "def test_other(): pass\n"})
    assert run_by_file.main(["-p", "no:cacheprovider", "-k", "one or skipped"], tests_dir=tests, servers=False) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].startswith("test_h_other.py: ")  # one at a time: in name order
    assert "1 deselected" in lines[1] and lines[1].endswith("(rc=5)")  # -k chose none of its tests
    assert lines[-1] == "1 passed, 0 failed, 1 skipped"


def test_files_running_together_have_a_prefect_home_and_server_each(tmp_path, monkeypatch, capsys):
    """Two Prefect servers on one SQLite database lock each other out: with 2 jobs, the two files that
    run at the same time (each waits until the other has started) see two homes, and two servers
    (one per slot, started once by the runner) that answer; the runner stops them at the end."""
    seen = tmp_path / "seen"
    seen.mkdir()
    body = textwrap.dedent(f"""
        import json, os, pathlib, time, urllib.request
        def test_home():
            seen = pathlib.Path({str(seen)!r})
            url = os.environ[{run_by_file.PREFECT_API_ENV!r}]
            (seen / pathlib.Path(__file__).name).write_text(json.dumps([os.environ.get("PREFECT_HOME", ""), url]))
            deadline = time.time() + 30
            while len(list(seen.iterdir())) < 2 and time.time() < deadline:
                time.sleep(0.1)
            assert len(list(seen.iterdir())) == 2, "the other file did not run at the same time"
            deadline = time.time() + 180
            while True:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=5) as answer:
                        assert answer.status == 200
                        break
                except OSError:
                    assert time.time() < deadline, url + " never answered"
                    time.sleep(0.5)
    """)
    monkeypatch.setenv(run_by_file.JOBS_ENV, "2")
    tests = _tests_dir(tmp_path, {"test_x.py": body, "test_y.py": body})
    assert run_by_file.main(["-p", "no:cacheprovider"], tests_dir=tests) == 0, capsys.readouterr().out
    homes, urls = zip(*(json.loads(path.read_text()) for path in seen.iterdir()))
    assert len(set(homes)) == 2 and all(Path(home).name.startswith("prefect-home-") for home in homes), homes
    assert len(set(urls)) == 2, urls
    for url in urls:  # stopped with the run
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=5)
    assert capsys.readouterr().out.strip().splitlines()[-1] == "2 passed, 0 failed, 0 skipped"


SPLIT_FILE = """
    import pytest

    @pytest.fixture(scope="module")
    def built():
        return 1

    @pytest.fixture
    def project(built):
        return built

    def test_fast_one(): pass

    @pytest.mark.slow
    def test_slow_alone(): pass

    def test_uses_built(built): assert built == 1

    class TestFast:
        def test_in_class(self): pass

    def test_uses_built_through_project(project): assert project == 1

    @pytest.mark.slow
    def test_slow_skipped(): pytest.skip("not here")
"""


def test_split_files_run_in_units_and_the_longest_units_start_first(tmp_path, monkeypatch, capsys):
    tests = _tests_dir(tmp_path, {"test_s_split.py": SPLIT_FILE, "test_b_fail.py": FILES["test_b_fail.py"],
                                  "test_h_other.py": "def test_other(): pass\n"})
    units = run_by_file.units_of(sorted(tests.glob("test_*.py")), split={"test_s_split.py"})
    assert [(u.name, u.tests) for u in units] == [
        ("test_b_fail.py", ()), ("test_h_other.py", ()),
        ("test_s_split.py::[fast]", ("test_fast_one", "TestFast")),  # the fast rest, together
        ("test_s_split.py::test_slow_alone", ("test_slow_alone",)),
        ("test_s_split.py::[built]", ("test_uses_built", "test_uses_built_through_project")),  # built once
        ("test_s_split.py::test_slow_skipped", ("test_slow_skipped",))]
    times = {"test_h_other.py": 5.0, "test_s_split.py::[built]": 9.0, "gone.py": 99.0}
    order = [u.name for u in run_by_file.run_order(units, times)]
    assert order == ["test_s_split.py::[built]", "test_h_other.py",  # measured, longest first
                     "test_b_fail.py", "test_s_split.py::[fast]", "test_s_split.py::test_slow_alone",
                     "test_s_split.py::test_slow_skipped"]  # then by name

    monkeypatch.setenv(run_by_file.TIMEOUT_ENV, "0")
    monkeypatch.setenv(run_by_file.JOBS_ENV, "1")
    monkeypatch.setenv(run_by_file.RECORD_ENV, "1")
    times_file = tmp_path / "times.json"
    times_file.write_text(json.dumps(times))
    rc = run_by_file.main(["-p", "no:cacheprovider"], tests_dir=tests, split={"test_s_split.py"}, times_file=times_file,
                          servers=False)
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 1 and lines[-1] == "7 passed, 1 failed, 1 skipped; failing: test_b_fail.py (1 failed)"
    ran = [line.split(": ", 1)[0] for line in lines if line.startswith("test_")]
    assert ran == order  # one at a time, in that order
    assert any(line.startswith("test_s_split.py::[built]: 2 passed") for line in lines)
    recorded = json.loads(times_file.read_text())
    assert sorted(recorded) == sorted(order) and all(v > 0 for v in recorded.values())  # gone.py dropped
    # a filtered run measures only what it ran: units it deselected whole keep their figure
    run_by_file.main(["-p", "no:cacheprovider", "-k", "other"], tests_dir=tests, split={"test_s_split.py"},
                     times_file=times_file, servers=False)
    again = json.loads(times_file.read_text())
    assert {k for k in again if again[k] != recorded[k]} <= {"test_h_other.py"} and sorted(again) == sorted(order)


def test_units_split_and_times_file_are_real(monkeypatch):
    gone = [name for name in run_by_file.SPLIT_BY_TEST if not (run_by_file.TESTS / name).is_file()]
    assert not gone, f"SPLIT_BY_TEST names files that are gone: {gone}"
    units = {u.name for u in run_by_file.units_of(sorted(run_by_file.TESTS.glob("test_*.py")))}
    stale = sorted(set(run_by_file.read_times()) - units)
    assert not stale, f"tests/times.json names units that are gone (COEVO_TEST_RECORD_TIMES=1 rewrites it): {stale}"
    monkeypatch.delenv(run_by_file.JOBS_ENV, raising=False)
    assert run_by_file.jobs_from_env() == run_by_file.DEFAULT_JOBS
    monkeypatch.setenv(run_by_file.JOBS_ENV, "1")
    assert run_by_file.jobs_from_env() == 1
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(run_by_file.JOBS_ENV, bad)
        with pytest.raises(SystemExit, match=f"{run_by_file.JOBS_ENV}={bad!r}"):
            run_by_file.jobs_from_env()


def test_a_broken_times_file_is_one_line(tmp_path):
    bad = tmp_path / "times.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit, match=r"times.json: not a JSON object of unit name -> seconds"):
        run_by_file.read_times(bad)
    assert run_by_file.read_times(tmp_path / "absent.json") == {}


def test_timeout_setting():
    assert run_by_file.DEFAULT_TIMEOUT_S >= 1200  # above pytest-timeout's per-test limit
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(run_by_file.TIMEOUT_ENV, raising=False)
        assert run_by_file.timeout_from_env() == run_by_file.DEFAULT_TIMEOUT_S
        mp.setenv(run_by_file.TIMEOUT_ENV, "90")
        assert run_by_file.timeout_from_env() == 90
        mp.setenv(run_by_file.TIMEOUT_ENV, "0")
        assert run_by_file.timeout_from_env() is None
        mp.setenv(run_by_file.TIMEOUT_ENV, "soon")
        with pytest.raises(SystemExit, match=run_by_file.TIMEOUT_ENV):
            run_by_file.timeout_from_env()
