"""The one staleness rule: which phases each change re-runs, decided by keys alone (no training).

The same keys serve the library's resume check, the Prefect cache and the CLI's up-to-date
check; dvc.yaml is generated from the same declarations.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO_ROOT, make_toy_metatool, toy_params
from coevo.config import load_params
from coevo.methods.base import early_stopping
from coevo.steps import is_done, run_stamped, step_key

# CoHyDE's three rounds of the toy params, five stamped phases each (S2, S3, S4, DPO, val)
ROUND_PHASES = [f"round_{r}{part}" for r in (1, 2, 3) for part in ("_s2", "_s3", "_s4", "_dpo", "")]


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    from coevo.data.loaders import load_source

    root = tmp_path_factory.mktemp("toy")
    source = make_toy_metatool(root / "toy")
    data = root / "data"
    load_source("metatool", str(source), seed=42, val_fraction=0.2, test_fraction=0.2, name="toy").save(data)
    return toy_params(root / "params.yaml"), data


def keys(method: str, params_file: Path, data: Path, overrides=(), fingerprint="data-v1", code=None) -> dict[str, str]:
    from coevo.methods.base import method_class

    run = method_class(method)("unused", load_params([params_file], list(overrides)), data, data_fingerprint=fingerprint)
    if code is not None:
        run.__dict__["code_hash"] = code  # as if a library source file had changed
    return {p.name: run.key(p.name) for p in run.phases()}


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return [name for name in before if before[name] != after.get(name)]


@pytest.mark.parametrize(
    ("change", "rerun"),
    [
        ({"overrides": ["cogr.grpo.learning_rate=1e-3"]}, ["01_query", "02_item"]),
        ({"overrides": ["cogr.sft.learning_rate=1e-3"]}, ["00_sft", "01_query", "02_item"]),
        ({"overrides": ["cogr.seed_temperature=0.3"]}, ["seed", "00_sft", "01_query", "02_item"]),
        ({"overrides": ["cogr.m_item_keywords=7"]}, ["seed", "00_sft", "01_query", "02_item"]),
        ({"overrides": ["cogr.sampling.top_p=0.5"]}, ["seed", "00_sft", "01_query", "02_item"]),
        ({"overrides": ["cogr.seed_generator=tiny"]}, ["seed", "00_sft", "01_query", "02_item"]),
        ({"overrides": ["evaluation.split=val"]}, []),  # only the final evaluation (a later step) changes
        ({"overrides": ["cogr.early_stopping.patience=1"]}, []),  # decides what runs, not what a phase computes
        ({"fingerprint": "data-v2"}, ["seed", "00_sft", "01_query", "02_item"]),
        ({"code": "edited"}, ["seed", "00_sft", "01_query", "02_item"]),
    ],
)
def test_each_change_reruns_exactly_the_phases_that_depend_on_it(toy, change, rerun):
    params_file, data = toy
    assert changed(keys("cogr", params_file, data), keys("cogr", params_file, data, **change)) == rerun


def test_an_edit_of_the_code_a_phase_runs_reruns_it_and_a_comment_docstring_or_layout_edit_does_not(
        toy, tmp_path, monkeypatch):
    """Edits a library source file for real (a copy of coevo/rewards, added to CoGR's code key)."""
    import shutil

    from coevo.methods.base import method_class
    from coevo.steps import code_hash

    params_file, data = toy
    shutil.copytree(REPO_ROOT / "coevo" / "rewards", tmp_path / "lib" / "edited_rewards")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    source = tmp_path / "lib" / "edited_rewards" / "cogr.py"
    original = source.read_text()

    def keys_after(edit=None) -> dict[str, str]:
        text = original if edit is None else edit(original)
        assert edit is None or text != original, "the edit did not apply"
        source.write_text(text)
        code_hash.cache_clear()
        run = method_class("cogr")("unused", load_params([params_file]), data, data_fingerprint="data-v1")
        run.code = (*run.code, "edited_rewards")
        return {p.name: run.key(p.name) for p in run.phases()}

    base = keys_after()
    assert keys_after(lambda text: text.replace("INVALID_REWARD = -1.0", "INVALID_REWARD = -1.0  # the budget rule")) == base
    assert keys_after(lambda text: text.replace("CoGR rewards: query-side F1", "CoGR's rewards: the query-side F1")) == base
    assert keys_after(lambda text: text.replace('        """F1 of one keyword set (no budget rule)."""\n', "")) == base
    assert keys_after(lambda text: text.replace("\n\n\n", "\n\n\n\n")) == base
    # type hints do not run: a signature's annotations may change without re-training
    assert keys_after(lambda text: text.replace("def distinct_normalized(keywords: Iterable[str]) -> list[str]:",
                                                "def distinct_normalized(keywords: Sequence[str]) -> list:")) == base
    assert keys_after(lambda text: text.replace("def parse_within_budget(completion: Any, k_max: int,",
                                                "def parse_within_budget(completion: str, k_max: int,")) == base
    edited = keys_after(lambda text: text.replace("INVALID_REWARD = -1.0", "INVALID_REWARD = -2.0"))
    assert changed(base, edited) == ["seed", "00_sft", "01_query", "02_item"]
    source.write_text(original)
    code_hash.cache_clear()


def test_a_field_annotation_is_code_and_a_signature_annotation_is_not():
    """A pydantic or dataclass field's annotation decides what it accepts (behaviour); a function's
    parameter and return hints never run (``from __future__ import annotations``)."""
    from coevo.steps import code_of

    model = b"from pydantic import BaseModel\nclass P(BaseModel):\n    rate: %s = 1\n"
    assert code_of(model % b"int") != code_of(model % b"float")
    function = b"from __future__ import annotations\ndef f(x%s, *a%s, k%s=1, **kw%s)%s:\n    return x\n"
    bare = (b"",) * 5
    assert code_of(function % (b": int", b": str", b": float", b": dict", b" -> int")) == code_of(function % bare)
    assert code_of(function % bare) != code_of(function.replace(b"return x", b"return k") % bare)
    # type-only imports never run; a runtime import does
    typed = b"from __future__ import annotations\n%sfrom coevo.config import Params\nX = Params\n"
    checking = b"from typing import TYPE_CHECKING, Any\nif TYPE_CHECKING:\n    from coevo.methods.cogr import CoGR\n"
    assert code_of(typed % checking) == code_of(typed % b"")
    assert code_of(typed % b"import typing\nif typing.TYPE_CHECKING:\n    import numpy\n") == code_of(typed % b"")
    assert code_of(typed % b"import numpy\n") != code_of(typed % b"")
    assert code_of(typed % b"if TYPE_CHECKING:\n    import numpy\nelse:\n    import torch\n") == code_of(
        typed % b"import torch\n")


def test_adding_a_round_keeps_every_finished_phase(toy):
    params_file, data = toy
    one, two = keys("cogr", params_file, data), keys("cogr", params_file, data, ["cogr.rounds=2"])
    assert all(two[name] == key for name, key in one.items())
    assert list(two)[len(one):] == ["03_query", "04_item"]


@pytest.mark.parametrize(
    ("method", "override", "rerun"),
    [
        ("grape", "grape.grpo.learning_rate=1e-3", ["train", "trained"]),
        ("grape", "grape.lora.r=4", ["untrained", "train", "trained"]),
        ("grape", "grape.text_encoder=other", ["index", "raw", "untrained", "train", "trained"]),
        ("cohyde", "cohyde.dpo_beta=0.2", ["round_1_dpo", "round_1", *ROUND_PHASES[5:]]),
        ("cohyde", "cohyde.warmup.epochs=3", ["s1b", "hyde", *ROUND_PHASES]),
        ("cohyde", "cohyde.encoder_training.epochs=3", ["s1a", "hyde", *ROUND_PHASES[1:]]),
    ],
)
def test_grape_and_cohyde_phases_follow_the_same_rule(toy, method, override, rerun):
    params_file, data = toy
    assert changed(keys(method, params_file, data), keys(method, params_file, data, [override])) == rerun


def test_final_evaluation_key_follows_the_split_and_the_trained_phases(toy, tmp_path, monkeypatch):
    from coevo.orchestration.pipeline import Pipeline

    params_file, data = toy
    monkeypatch.chdir(tmp_path)

    def final_key(*overrides: str) -> str:
        pipe = Pipeline("cogr", load_params([params_file], list(overrides)))
        monkeypatch.setattr(type(pipe), "data_fingerprint", lambda self: "data-v1")
        method = pipe.method_cls("run", pipe.params, data, data_fingerprint="data-v1")
        monkeypatch.setattr(method, "is_done", lambda name: True)
        pipe.__dict__["method"] = method
        return pipe.final().key

    base = final_key()
    assert final_key("evaluation.split=val") != base
    assert final_key("cogr.grpo.learning_rate=1e-3") != base
    assert final_key("cogr.early_stopping.patience=1") == base


def test_stamps_rerun_on_a_new_key_and_resume_on_the_same(tmp_path):
    out, stamp = tmp_path / "out", tmp_path / "stamp.json"
    calls = []

    def work() -> dict:
        calls.append(1)
        out.write_text("x")
        return {"n": len(calls)}

    assert run_stamped(stamp, "k1", [out], work) == {"n": 1}
    assert run_stamped(stamp, "k1", [out], work) == {"n": 1} and len(calls) == 1  # done: not run again
    assert is_done(stamp, "k1", [out]) and not is_done(stamp, "k2", [out])
    out.unlink()
    assert not is_done(stamp, "k1", [out])  # a lost output is not done
    assert run_stamped(stamp, "k1", [out], work) == {"n": 2}
    assert run_stamped(stamp, "k2", [out], work) == {"n": 3}
    assert step_key("a", {"x": 1}, ["d"], "c") != step_key("a", {"x": 2}, ["d"], "c")


def test_stamps_verify_their_outputs_and_redo_a_step_whose_outputs_changed(tmp_path, caplog):
    from coevo.steps import fingerprint, output_change, read_stamp

    out, stamp = tmp_path / "out", tmp_path / "stamps" / "train.json"
    calls = []

    def work() -> dict:
        calls.append(1)
        out.mkdir(exist_ok=True)
        (out / "weights.bin").write_bytes(b"w" * 100)
        (out / "config.json").write_text('{"a": 1}')
        return {"n": len(calls)}

    run_stamped(stamp, "k", [out], work, resumable=True)
    recorded = read_stamp(stamp)["outputs"]
    assert recorded == [{"path": "out", "md5": fingerprint(out), "sizes": {"config.json": 8, "weights.bin": 100}}]
    (out / "weights.bin").write_bytes(b"w" * 64)  # truncated
    assert output_change(read_stamp(stamp), [out]) == f"{out / 'weights.bin'}: 64 bytes, 100 when written"
    assert not is_done(stamp, "k", [out])
    with caplog.at_level("WARNING", logger="coevo"):
        assert run_stamped(stamp, "k", [out], work, resumable=True) == {"n": 2}  # redone, not resumed
    assert caplog.messages == [f"train: {out / 'weights.bin'}: 64 bytes, 100 when written; running it again"]
    assert is_done(stamp, "k", [out]) and (out / "weights.bin").read_bytes() == b"w" * 100

    (out / "config.json").write_text('{"a": 2}')  # same size, other bytes: the md5 check
    assert output_change(read_stamp(stamp), [out]).startswith(f"{out}: content changed since the step finished")
    (out / "config.json").write_text('{"a": 1}')
    assert is_done(stamp, "k", [out])  # the same bytes again: done
    (out / "extra.bin").write_bytes(b"x")
    assert output_change(read_stamp(stamp), [out]) == f"{out / 'extra.bin'}: not written by the step"
    (out / "extra.bin").unlink()
    (out / "config.json").unlink()
    assert output_change(read_stamp(stamp), [out]) == f"{out / 'config.json'}: missing"


def test_a_stamped_step_names_itself_by_its_label_and_reruns_when_its_own_check_fails(tmp_path, caplog):
    out, stamp = tmp_path / "out.txt", tmp_path / "prepare-data.json"
    calls = []

    def work() -> dict:
        calls.append(1)
        out.write_text("rows")
        return {"n": len(calls)}

    assert run_stamped(stamp, "k", [out], work, label="prepare data") == {"n": 1}
    out.write_text("rows, edited")
    with caplog.at_level("WARNING", logger="coevo"):
        assert run_stamped(stamp, "k", [out], work, label="prepare data") == {"n": 2}
    assert caplog.messages == [f"prepare data: {out}: 12 bytes, 4 when written; running it again"]
    assert run_stamped(stamp, "k", [out], work, verify=lambda result: True) == {"n": 2}  # its check holds: done
    assert run_stamped(stamp, "k", [out], work, verify=lambda result: False) == {"n": 3}  # its check fails: redone
    assert out.read_text() == "rows" and len(calls) == 3


def test_early_stopping_counts_evaluations_since_the_best():
    state = early_stopping([0.1, 0.3, 0.3, 0.2], "f1", patience=2, min_delta=0.0)
    assert (state.best, state.best_index, state.stale, state.stop) == (0.3, 1, 2, True)
    assert not early_stopping([0.1, 0.3, 0.31], "f1", patience=1, min_delta=0.0).stop
    assert early_stopping([0.1, 0.3, 0.31], "f1", patience=1, min_delta=0.05).stop


def test_no_val_split_is_a_clear_error_before_any_training(toy, tmp_path):
    import pandas as pd

    from coevo.methods.cogr import CoGR

    params_file, data = toy
    broken = tmp_path / "no_val"
    broken.mkdir()
    for name in ("items", "qrels", "queries"):
        frame = pd.read_parquet(data / f"{name}.parquet")
        if name == "queries":
            frame["split"] = frame["split"].replace("val", "test")
        frame.to_parquet(broken / f"{name}.parquet", index=False)
    (broken / "dataset.json").write_text((data / "dataset.json").read_text())
    with pytest.raises(ValueError, match="no val query has a relevant item"):
        CoGR(tmp_path / "run", load_params([params_file]), broken, data_fingerprint="x")




def test_a_method_s_key_holds_its_own_reward_module_and_not_the_others():
    """CoHyDE's pair mining is no part of what CoGR or GRAPE compute: editing it re-runs CoHyDE only."""
    from coevo.methods.base import method_class
    from coevo.steps import module_path

    for name in ("cogr", "grape", "cohyde"):
        code = method_class(name).code
        assert [m for m in code if m.startswith("coevo.rewards")] == [f"coevo.rewards.{name}"], name
        assert module_path(f"coevo.rewards.{name}") == f"coevo/rewards/{name}.py"  # the DVC train stage's dep
