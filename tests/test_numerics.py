"""Numerics as data: the runtime.precision knob, coevo.runtime.numerics(), stamps, MLflow tags, resume refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch

from coevo import runtime
from coevo.config import ParamsError, load_params
from coevo.methods.base import Method, NumericsMismatch, Phase
from coevo.train import common
from tests.conftest import REPO_ROOT

KEYS = ["precision", "device", "cpu_isa", "bf16_units", "onednn_max_cpu_isa", "torch_threads", "torch", "transformers", "trl",
        "peft", "sentence_transformers", "faiss"]


@pytest.fixture
def bf16_fast(monkeypatch):
    """Pretend this CPU has fast bf16 units (COEVO_CPU_BF16=1), so ``auto`` resolves bf16 here."""
    monkeypatch.setenv("COEVO_CPU_BF16", "1")
    runtime.cpu_bf16_is_fast.cache_clear()
    yield
    runtime.cpu_bf16_is_fast.cache_clear()


# ------------------------------------------------------------------------------ the knob
@pytest.mark.parametrize("value", ["auto", "fp32", "bf16"])
def test_precision_knob_parses(params_file, value):
    assert load_params(params_file, [f"runtime.precision={value}"]).runtime.precision == value


def test_precision_knob_default_is_auto():
    assert load_params(REPO_ROOT / "params.yaml").runtime.precision == "auto"


def test_bad_precision_is_one_error_naming_the_key(params_file):
    with pytest.raises(ParamsError) as info:
        load_params(params_file, ["runtime.precision=fp16"])
    assert str(info.value).splitlines()[1:] == [
        "  runtime.precision: 'fp16' is not one of auto | fp32 | bf16 (did you mean: bf16?)"]


def test_precision_is_explained():
    from typer.testing import CliRunner

    from coevo.cli import app

    result = CliRunner().invoke(app, ["params", "explain", "-p", str(REPO_ROOT / "params.yaml"), "runtime.precision"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "one of: auto | fp32 | bf16" in result.output
    assert "resolves per device" in result.output


def test_resolution_follows_the_knob(monkeypatch):
    monkeypatch.setenv("COEVO_CPU_BF16", "0")
    runtime.cpu_bf16_is_fast.cache_clear()
    try:
        assert runtime.resolved_precision("fp32") == "fp32"
        assert runtime.resolved_precision("bf16") == "bf16"
        assert runtime.resolved_precision("auto") == ("bf16" if torch.cuda.is_available() else "fp32")
        with pytest.raises(ValueError, match=r"runtime.precision = 'fp16': expected one of auto \| fp32 \| bf16"):
            runtime.resolved_precision("fp16")
    finally:
        runtime.cpu_bf16_is_fast.cache_clear()


def test_trainer_args_take_the_knob_in_effect(bf16_fast):
    assert common.trainer_device_args(0)["bf16"] is True  # auto, fast bf16: today's behaviour
    with runtime.precision_policy("fp32"):
        assert common.trainer_device_args(0)["bf16"] is False
        with runtime.precision_policy("bf16"):
            assert common.trainer_device_args(0)["bf16"] is True
        assert common.trainer_device_args(0)["bf16"] is False
    assert common.trainer_device_args(0)["bf16"] is True


# ------------------------------------------------------------------------------ numerics()
def test_numerics_keys_and_values(bf16_fast, monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    record = runtime.numerics("auto")
    assert list(record) == KEYS
    assert record["precision"] == "bf16"
    assert record["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert record["cpu_isa"] == torch.backends.cpu.get_cpu_capability()
    assert record["onednn_max_cpu_isa"] == ""
    assert record["torch_threads"] == str(torch.get_num_threads())
    assert record["torch"] == metadata.version("torch")
    assert record["transformers"] == metadata.version("transformers")
    assert record["trl"] == metadata.version("trl")
    assert record["peft"] == metadata.version("peft")
    assert record["sentence_transformers"] == metadata.version("sentence-transformers")
    assert record["faiss"] == runtime.package_version("faiss-cpu", "faiss-gpu", "faiss")
    assert all(isinstance(v, str) for v in record.values())
    assert runtime.numerics("fp32")["precision"] == "fp32"


def test_numerics_of_params_uses_their_knob(params_file):
    assert runtime.numerics(load_params(params_file, ["runtime.precision=fp32"]))["precision"] == "fp32"
    assert runtime.numerics(load_params(params_file, ["runtime.precision=bf16"]))["precision"] == "bf16"


def test_package_version_of_a_missing_distribution():
    assert runtime.package_version("coevo-no-such-distribution") == "not installed"


_PROBE = """
import json
from coevo import runtime
print(json.dumps({"numerics": runtime.numerics("auto"), "fast": runtime.cpu_bf16_is_fast()}))
"""


def _probe(**env: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "COEVO_CPU_BF16")}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**environ, **env}, capture_output=True, text=True,
                         check=True, cwd=REPO_ROOT, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU numerics")
def test_onednn_isa_cap_is_recorded_and_turns_auto_to_fp32():
    # oneDNN reads ONEDNN_MAX_CPU_ISA when torch loads, so each setting gets its own process.
    capped = _probe(ONEDNN_MAX_CPU_ISA="AVX2")
    # torch's own dispatch ISA does not follow oneDNN's cap: the env var is recorded next to it.
    assert capped["numerics"]["cpu_isa"] == torch.backends.cpu.get_cpu_capability()
    assert capped["numerics"]["onednn_max_cpu_isa"] == "AVX2"
    # capped below AVX512_CORE_BF16 oneDNN has no native bf16, so auto is fp32 whatever the CPU.
    assert capped["fast"] is False
    assert capped["numerics"]["precision"] == "fp32"
    uncapped = _probe()
    assert uncapped["numerics"]["onednn_max_cpu_isa"] == ""
    assert uncapped["fast"] is (uncapped["numerics"]["precision"] == "bf16")
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():  # this CPU has avx512_bf16: only the cap changes it
        assert uncapped["numerics"]["cpu_isa"] == capped["numerics"]["cpu_isa"]


# ------------------------------------------------------------------------------ stamps and resume
class Toy(Method):
    """Two phases, no data: enough for stamps, keys and the resume check."""

    name = "cogr"
    title = "toy"
    code = ("coevo.steps",)
    table_metrics = ()

    def phases(self) -> list[Phase]:
        return [Phase("00_sft", "sft", ("cogr.sft",), ("sft",)),
                Phase("01_query", "query", ("cogr.grpo",), ("query",), reads=("00_sft",))]

    def _run(self, phase: Phase) -> dict[str, Any]:
        (self.run_dir / phase.writes[0]).write_text(phase.name)
        return {"phase": phase.name, "bf16": common.trainer_device_args(0)["bf16"]}

    def require_val(self) -> None:
        pass

    def final_evaluation(self, split: str) -> dict[str, Any]:
        return {"rows": []}

    def write_reports(self, *args: Any) -> list[str]:
        return []


def _toy(tmp_path: Path, params_file: Path, precision: str) -> Toy:
    params = load_params(params_file, [f"runtime.precision={precision}"])
    return Toy(tmp_path / "run", params, tmp_path / "data", data_fingerprint="data-md5")


def _stamp(method: Method, name: str) -> Path:
    return method.run_dir / "stamps" / f"{name}.json"


def test_a_stamp_carries_the_numerics_and_the_phase_trains_under_the_knob(tmp_path, params_file):
    toy = _toy(tmp_path, params_file, "fp32")
    assert toy.run_phase("00_sft") == {"phase": "00_sft", "bf16": False}
    stamp = json.loads(_stamp(toy, "00_sft").read_text())
    assert stamp["state"] == "done"
    assert stamp["numerics"] == runtime.numerics("fp32")
    assert stamp["numerics"]["precision"] == "fp32"
    assert toy.numerics_of("00_sft") == runtime.numerics("fp32")
    assert toy.run_phase("01_query") == {"phase": "01_query", "bf16": False}
    assert runtime.resolved_precision() == runtime.resolved_precision("auto")  # the policy ends with the phase


def test_a_stamp_records_the_thread_count_the_phase_trained_with(tmp_path, params_file, monkeypatch):
    class OneThread(Toy):  # as a phase whose model applies COEVO_THREADS=1 (coevo.runtime.limit_cpu_threads)
        def _run(self, phase: Phase) -> dict[str, Any]:
            runtime.limit_cpu_threads()
            return super()._run(phase)

    before = torch.get_num_threads()
    monkeypatch.setenv("COEVO_THREADS", "1")
    torch.set_num_threads(2)
    try:
        toy = OneThread(tmp_path / "run", load_params(params_file, ["runtime.precision=fp32"]), tmp_path / "data",
                        data_fingerprint="data-md5")
        toy.run_phase("00_sft")
    finally:
        torch.set_num_threads(before)
    assert toy.numerics_of("00_sft")["torch_threads"] == "1"  # 2 when the phase started


def test_precision_is_not_part_of_the_keys(tmp_path, params_file):
    assert _toy(tmp_path, params_file, "fp32").key("01_query") == _toy(tmp_path, params_file, "bf16").key("01_query")


def test_resume_under_other_numerics_is_refused(tmp_path, params_file):
    first = _toy(tmp_path, params_file, "bf16")
    first.run_phase("00_sft")
    # faked: the phase was trained on another machine (bf16, AVX512 capped nowhere)
    stamp = json.loads(_stamp(first, "00_sft").read_text())
    stamp["numerics"].update(precision="bf16", cpu_isa="AVX512", bf16_units="AMX", onednn_max_cpu_isa="", torch="2.4.1")
    _stamp(first, "00_sft").write_text(json.dumps(stamp))

    here = _toy(tmp_path, params_file, "fp32")
    current = runtime.numerics("fp32")
    isa = current["cpu_isa"] + (f", ONEDNN_MAX_CPU_ISA={current['onednn_max_cpu_isa']}"
                                if current["onednn_max_cpu_isa"] else "")
    expected = (f"run folder {here.run_dir}: phase 00_sft was trained with bf16 on AVX512+AMX (torch 2.4.1); this machine "
                f"resolves fp32 on {isa} (torch {current['torch']}): use a fresh run folder or set "
                f"runtime.precision=bf16")
    with pytest.raises(NumericsMismatch) as info:
        here.run_phase("01_query")
    assert str(info.value) == expected
    assert isinstance(info.value, ValueError)
    assert not _stamp(here, "01_query").exists() and not (here.run_dir / "query").exists()
    with pytest.raises(NumericsMismatch, match=r"phase 00_sft was trained with bf16 on AVX512\+AMX"):
        here.run()
    # a finished phase is still answered from its stamp: nothing is trained
    assert here.run_phase("00_sft")["phase"] == "00_sft"


def test_resume_on_another_isa_is_refused_with_the_same_precision(tmp_path, params_file):
    first = _toy(tmp_path, params_file, "fp32")
    first.run_phase("00_sft")
    stamp = json.loads(_stamp(first, "00_sft").read_text())
    other = "AVX512" if runtime.numerics("fp32")["cpu_isa"] == "AVX2" else "AVX2"  # not this machine's ISA
    stamp["numerics"].update(cpu_isa=other, onednn_max_cpu_isa="AVX2")
    _stamp(first, "00_sft").write_text(json.dumps(stamp))
    with pytest.raises(NumericsMismatch, match=rf"trained with fp32 on {other}, ONEDNN_MAX_CPU_ISA=AVX2 \(torch .*\); "
                       r"this machine resolves fp32 on .*: use a fresh run folder or run on a machine with the same CPU "
                       r"ISA and ONEDNN_MAX_CPU_ISA setting"):
        _toy(tmp_path, params_file, "fp32").run_phase("01_query")


def test_the_bf16_units_are_recorded_and_named_for_bf16(monkeypatch):
    """AMX and AVX512-BF16 CPUs are both AVX512 to torch; the record tells them apart by torch's own probes."""
    import torch

    assert runtime.numerics("fp32")["bf16_units"] == (
        "AMX" if torch.cpu._is_amx_tile_supported() else "AVX512_BF16" if torch.cpu._is_avx512_bf16_supported()
        else "none")
    for amx, avx512_bf16, units in ((True, True, "AMX"), (False, True, "AVX512_BF16"), (False, False, "none")):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda b=avx512_bf16: b)
        runtime.cpu_bf16_units.cache_clear()
        assert runtime.cpu_bf16_units() == units
    runtime.cpu_bf16_units.cache_clear()
    record = {"precision": "bf16", "cpu_isa": "AVX512", "bf16_units": "AMX", "torch": "2.14.1"}
    assert runtime.describe_numerics(record) == "bf16 on AVX512+AMX (torch 2.14.1)"
    assert runtime.describe_numerics({**record, "precision": "fp32"}) == "fp32 on AVX512 (torch 2.14.1)"
    assert runtime.describe_numerics({**record, "bf16_units": "none", "onednn_max_cpu_isa": "AVX2"}) == \
        "bf16 on AVX512, ONEDNN_MAX_CPU_ISA=AVX2 (torch 2.14.1)"


def test_resume_of_bf16_phases_on_other_bf16_units_is_refused_and_of_fp32_ones_is_not(tmp_path, params_file):
    first = _toy(tmp_path, params_file, "bf16")
    first.run_phase("00_sft")
    here_units = runtime.numerics("bf16")["bf16_units"]
    other = "AMX" if here_units != "AMX" else "AVX512_BF16"
    stamp = json.loads(_stamp(first, "00_sft").read_text())
    stamp["numerics"]["bf16_units"] = other
    _stamp(first, "00_sft").write_text(json.dumps(stamp))
    with pytest.raises(NumericsMismatch, match=rf"trained with bf16 on \w+\+{other}.*: use a fresh run folder or run "
                       r"on a machine with the same bf16 units"):
        _toy(tmp_path, params_file, "bf16").run_phase("01_query")
    # a stamp from before bf16_units was recorded resumes
    del stamp["numerics"]["bf16_units"]
    _stamp(first, "00_sft").write_text(json.dumps(stamp))
    assert _toy(tmp_path, params_file, "bf16").run_phase("01_query")["phase"] == "01_query"

    fp32 = _toy(tmp_path / "fp32", params_file, "fp32")
    fp32.run_phase("00_sft")
    stamp = json.loads(_stamp(fp32, "00_sft").read_text())
    stamp["numerics"]["bf16_units"] = other  # fp32 kernels do not use the bf16 units
    _stamp(fp32, "00_sft").write_text(json.dumps(stamp))
    assert _toy(tmp_path / "fp32", params_file, "fp32").run_phase("01_query")["phase"] == "01_query"


def test_old_stamps_without_numerics_are_accepted(tmp_path, params_file):
    first = _toy(tmp_path, params_file, "bf16")
    first.run_phase("00_sft")
    stamp = json.loads(_stamp(first, "00_sft").read_text())
    del stamp["numerics"]
    _stamp(first, "00_sft").write_text(json.dumps(stamp))

    here = _toy(tmp_path, params_file, "fp32")
    assert here.is_done("00_sft")
    assert here.numerics_of("00_sft") is None
    assert here.run_phase("01_query") == {"phase": "01_query", "bf16": False}
    assert json.loads(_stamp(here, "01_query").read_text())["numerics"]["precision"] == "fp32"


# ------------------------------------------------------------------------------ MLflow
def test_tracker_tags_the_run_with_its_numerics(tmp_path, monkeypatch, params_file):
    from mlflow.tracking import MlflowClient

    from coevo.orchestration.tracking import Tracker, numerics_tags

    assert numerics_tags({"precision": "bf16", "cpu_isa": "AVX512"}) == {"numerics.precision": "bf16",
                                                                        "numerics.cpu_isa": "AVX512"}
    monkeypatch.chdir(tmp_path)
    params = load_params(params_file, ["runtime.precision=fp32"])
    with Tracker(uri="sqlite:///mlflow.db", artifact_root="mlruns", experiment="cogr") as tracker:
        tracker.log_params(params.flat())
        run_id = tracker.run_id
    tags = MlflowClient(tracker.uri).get_run(run_id).data.tags
    expected = numerics_tags(runtime.numerics("fp32"))
    assert {k: tags.get(k, "<missing>") for k in expected} == {k: v for k, v in expected.items()}
    assert tags["numerics.precision"] == "fp32"
