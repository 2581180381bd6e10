import subprocess
import sys
import typing

import pydantic
import re

import pytest
import yaml

from coevo.config import (
    COGR_METRICS,
    COHYDE_METRICS,
    Params,
    ParamsError,
    Section,
    apply_override,
    load_params,
    section,
    walk,
)
from tests.conftest import REPO_ROOT

def test_project_params_load(params_file):
    params = load_params(params_file)
    assert params.cogr.grpo.batch_size % params.cogr.grpo.num_generations == 0
    assert params.flat()["cogr.lora.r"] == params.cogr.lora.r
    assert params.evaluation.split == "test"
    # What params.yaml says wins where the models' old defaults disagreed.
    assert params.cogr.sft.epochs == 2 and params.cogr.grpo.learning_rate == 5e-5


def test_override_changes_value(params_file):
    params = load_params(params_file, ["cogr.rounds=5", "cogr.lora.target_modules=[q_proj]"])
    assert params.cogr.rounds == 5
    assert params.cogr.lora.target_modules == ["q_proj"]


def test_grpo_micro_batches_need_whole_groups_per_generation_batch(params_file):
    """batch_size below the group size is a micro-batch: TRL samples batch_size x gradient_accumulation_steps
    completions at once (whole groups) and trains them batch_size at a time."""
    params = load_params(params_file, ["cogr.grpo.num_generations=8", "cogr.grpo.batch_size=4",
                                       "cogr.grpo.trl.gradient_accumulation_steps=4"])
    assert params.cogr.grpo.batch_size == 4
    with pytest.raises(ParamsError, match=r"cogr.grpo: batch_size \(4\) x 3 accumulated passes \(12\) must be a "
                                          r"multiple of num_generations \(8\)"):
        load_params(params_file, ["cogr.grpo.num_generations=8", "cogr.grpo.batch_size=4",
                                  "cogr.grpo.trl.gradient_accumulation_steps=3"])
    with pytest.raises(ParamsError, match=r"cogr.grpo: batch_size \(4\) must be a multiple of num_generations \(8\)"):
        load_params(params_file, ["cogr.grpo.num_generations=8", "cogr.grpo.batch_size=4"])
    # a phase whose prompts cannot fill one step's generation batch would train nothing: refused up front
    with pytest.raises(ParamsError, match=r"cogr.grpo: max_prompts_per_phase \(2\) x num_generations \(2\) = 4 "
                                          r"completions, fewer than one optimizer step samples \(batch_size 2 x 4 "
                                          r"accumulated passes = 8\)"):
        load_params(params_file, ["cogr.grpo.num_generations=2", "cogr.grpo.batch_size=2",
                                  "cogr.grpo.max_prompts_per_phase=2", "cogr.grpo.trl.gradient_accumulation_steps=4"])


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ("cogr.rounds=-1", "cogr.rounds"),
        ("cogr.grpo.batch_size=6", "multiple of num_generations"),
        ("cogr.item_reward=best", "cogr.item_reward"),
        ("cogr.k_max=lots", "cogr.k_max"),
        ("cogr.rounds=true", "cogr.rounds: Input should be a valid integer"),  # a bool is not an int
        ("cogr.rounds=2.0", "cogr.rounds"),
        ("cogr.lora.enabled=1", "cogr.lora.enabled: Input should be a valid boolean"),  # an int is not a bool
        ("cogr.sft.learning_rate=true", "cogr.sft.learning_rate"),  # nor a float
        ("cogr.sft.learning_rate=.nan", "cogr.sft.learning_rate: Input should be a finite number"),
        ("cogr.seed_temperature=.inf", "cogr.seed_temperature"),
        ("cogr.early_stopping.metric=bogus", "cogr.early_stopping.metric"),
        ("cogr.early_stopping.metric=ndcg@5", None),
        ("cohyde.early_stopping.metric=f1", "cohyde.early_stopping.metric: 'f1' is not one of ndcg@5 | recall@5"),
        ("evaluation.split=train", "evaluation.split"),
        ("cogr.generator=", "cogr.generator"),
    ],
)
def test_bad_values_name_the_key(params_file, edit, expected):
    if expected is None:
        load_params(params_file, [edit])
        return
    with pytest.raises(ParamsError, match=expected):
        load_params(params_file, [edit])


def test_floats_accept_integers_and_yaml_exponents(params_file):
    params = load_params(params_file, ["cogr.sft.learning_rate=1", "cogr.grpo.learning_rate=1e-4"])
    assert params.cogr.sft.learning_rate == 1.0 and params.cogr.grpo.learning_rate == 1e-4


def test_close_matches_are_suggested(params_file):
    with pytest.raises(ParamsError, match=r"did you mean: ndcg@10"):
        load_params(params_file, ["cogr.early_stopping.metric=ndcg10"])
    with pytest.raises(ParamsError, match=r"unknown key 'cogr.round' \(did you mean: cogr.rounds"):
        load_params(params_file, ["cogr.round=3"])


def test_unknown_key_in_file_is_named(params_file):
    params_file.write_text(params_file.read_text() + "\nbogus_section: 1\n")
    with pytest.raises(ParamsError, match="bogus_section: unknown key"):
        load_params(params_file)


def test_missing_key_is_an_error_naming_it(params_file):
    tree = yaml.safe_load(params_file.read_text())
    del tree["cogr"]["sft"]["epochs"]
    del tree["evaluation"]
    params_file.write_text(yaml.safe_dump(tree))
    with pytest.raises(ParamsError) as err:
        load_params(params_file)
    assert "cogr.sft.epochs: required key is missing" in str(err.value)
    assert "evaluation: required key is missing" in str(err.value)


def test_a_file_that_extends_the_shipped_profiles_holds_only_its_changes(tmp_path):
    from coevo.config import PROFILES_DIR, load_tree

    overlay = tmp_path / "params.yaml"
    overlay.write_text("extends: [defaults, cpu]\ncogr:\n  rounds: 3\n")
    expected = load_tree([REPO_ROOT / "params.yaml", REPO_ROOT / "params" / "cpu.yaml"], ["cogr.rounds=3"])
    assert load_tree([overlay]) == expected and "extends" not in expected  # the resolved tree names no profile
    assert load_params(overlay).cogr.rounds == 3
    # the shipped profiles are the repository's files (links here, copies in a wheel)
    for name, path in (("defaults", "params.yaml"), ("cpu", "params/cpu.yaml"), ("demo", "params/demo.yaml")):
        assert (PROFILES_DIR / f"{name}.yaml").read_bytes() == (REPO_ROOT / path).read_bytes()
    for text, message in (("extends: gpu\n", "unknown profile 'gpu' (coevo ships: defaults, cpu, demo)"),
                          ("extends: [cpu]\n", "start with 'defaults'"),
                          ("extends: {a: 1}\n", "expected a profile name or a list of them"),
                          ("extends: [defaults]\ncogr:\n  nope: 1\n", "cogr.nope: unknown key")):
        overlay.write_text(text)
        with pytest.raises(ParamsError, match=re.escape(message)):
            load_params(overlay)


def test_unknown_override_key_is_named(params_file):
    with pytest.raises(ParamsError, match="cogr.nope"):
        load_params(params_file, ["cogr.nope=1"])


def test_missing_file(tmp_path):
    with pytest.raises(ParamsError, match="does not exist"):
        load_params(tmp_path / "absent.yaml")


def test_directory_as_params_file(tmp_path):
    with pytest.raises(ParamsError, match=f"{tmp_path}: is a directory"):
        load_params(tmp_path)


def test_duplicate_key_names_file_and_key(params_file):
    params_file.write_text(params_file.read_text().replace("  rounds: 2", "  rounds: 2\n  rounds: 3", 1))
    with pytest.raises(ParamsError, match=rf"{params_file}: not valid YAML: duplicate key 'rounds' \(first at line"):
        load_params(params_file)


@pytest.mark.parametrize(
    "assignment",
    ["cogr.lora.target_modules=[q_proj", "cogr.rounds=!!python/object/apply:os.system [echo hi]", "cogr.rounds={a: 1, a: 2}"],
)
def test_bad_yaml_in_an_override_is_one_line(params_file, assignment):
    with pytest.raises(ParamsError) as err:
        load_params(params_file, [assignment])
    message = str(err.value)
    assert message.startswith(f"override {assignment.split('=')[0]!r}: value ") and "\n" not in message


def test_yaml_tags_in_a_file_are_refused(params_file):
    params_file.write_text(params_file.read_text().replace("seed: 42", "seed: !!python/object/apply:os.getpid []"))
    with pytest.raises(ParamsError, match="not valid YAML: could not determine a constructor"):
        load_params(params_file)


# ------------------------------------------------------------------------- overlays
def test_overlays_merge_in_order_then_overrides(params_file, tmp_path):
    first = tmp_path / "first.yaml"
    first.write_text("cogr:\n  rounds: 7\n  lora: {r: 4, target_modules: [k_proj]}\n")
    second = tmp_path / "second.yaml"
    second.write_text("cogr:\n  rounds: 9\n")
    params = load_params([params_file, first, second], ["cogr.lora.alpha=4"])
    assert params.cogr.rounds == 9  # later files win
    assert (params.cogr.lora.r, params.cogr.lora.alpha) == (4, 4)  # mappings merge key by key, --set last
    assert params.cogr.lora.target_modules == ["k_proj"]  # lists replace
    assert params.cogr.lora.dropout == load_params(params_file).cogr.lora.dropout  # untouched keys kept
    assert load_params([params_file, second], ["cogr.rounds=1"]).cogr.rounds == 1


def test_overlay_unknown_key_names_file_and_key(params_file, tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("cogr:\n  lora:\n    rank: 4\n")
    with pytest.raises(ParamsError, match=rf"{overlay}: invalid parameters\n  cogr.lora.rank: unknown key"):
        load_params([params_file, overlay])


def test_invalid_value_from_an_overlay_names_the_key(params_file, tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("cogr:\n  rounds: many\n")
    with pytest.raises(ParamsError, match=r"overlay.yaml: invalid parameters\n  cogr.rounds"):
        load_params([params_file, overlay])


def test_demo_layers_the_cpu_settings_and_only_shrinks_them(params_file):
    """`coevo demo` = params.yaml + params/cpu.yaml + params/demo.yaml: the CPU settings (extractive
    seeds, groups of 8, LoRA on every linear layer) on the committed sample, with fewer queries,
    prompts and rounds; the demo overlay changes nothing else."""
    from coevo.cli.run import DEMO_PARAMS
    from coevo.config import flatten

    assert [str(p) for p in DEMO_PARAMS] == ["params.yaml", "params/cpu.yaml", "params/demo.yaml"]
    cpu = load_params([params_file, REPO_ROOT / "params" / "cpu.yaml"])
    demo = load_params([params_file, REPO_ROOT / "params" / "cpu.yaml", REPO_ROOT / "params" / "demo.yaml"])
    assert demo.data.source == "data/sample/metatool" and demo.cogr.seed_generator == "yake"
    assert demo.cogr.grpo.num_generations == cpu.cogr.grpo.num_generations == 8
    assert demo.cogr.rounds <= cpu.cogr.rounds and demo.cogr.max_train_queries <= cpu.cogr.max_train_queries
    overlay = yaml.safe_load((REPO_ROOT / "params" / "demo.yaml").read_text())
    changed = {k for k, v in flatten(demo.model_dump(mode="json")).items()
               if flatten(cpu.model_dump(mode="json")).get(k) != v}
    # (its data section restates params.yaml's default, the committed sample, so that the demo never depends on it)
    assert changed == {k for k in flatten(overlay) if not k.startswith("data.")}


# ----------------------------------------------------------------- one place for defaults
def _models(model: type[Section] = Params) -> list[type[Section]]:
    found = [model]
    for info in model.model_fields.values():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, Section):
            found.extend(_models(sub))
    return found


def test_every_field_is_documented_and_has_no_default():
    keys = list(walk())
    assert len(keys) > 90
    for key, info in keys:
        assert info.description and info.description.strip(), f"{key}: no description"
        assert info.is_required(), f"{key}: carries a default; defaults live in params.yaml only"
        assert info.default_factory is None, f"{key}: default_factory"
    for model in _models():
        with pytest.raises(pydantic.ValidationError, match="Field required"):  # nothing is optional
            model()


def test_every_model_field_is_in_params_yaml():
    tree = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    for key, _ in walk():
        node = tree
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"params.yaml lacks {key}"
            node = node[part]


def test_section_helper_applies_changes_and_validates():
    sft = section("cogr.sft", epochs=1, learning_rate=1e-3)
    assert (sft.epochs, sft.learning_rate, sft.batch_size) == (1, 1e-3, 8)
    with pytest.raises(ParamsError, match="cogr.sft.epochs"):
        section("cogr.sft", epochs=0)
    with pytest.raises(ParamsError, match="cogr.grpo.trl.learning_rate: coevo sets"):
        section("cogr.grpo", trl={"learning_rate": 1.0})


# ------------------------------------------------------------------------ metric names
def test_cogr_metric_names_are_what_its_evaluation_produces():
    from coevo.retrieval.evaluate import evaluate_keyword_retrieval

    produced = evaluate_keyword_retrieval({"q": ["a"]}, {"i": ["a"], "j": ["b"]}, {"q": {"i": 1}})
    assert set(COGR_METRICS) == set(produced)
    field = dict(walk())["cogr.early_stopping.metric"]
    assert set(typing.get_args(field.annotation)) == set(COGR_METRICS)


def test_cohyde_metric_names_are_what_its_evaluation_produces():
    from coevo.methods.cohyde import grouped_metrics

    produced = grouped_metrics([{"query_id": "q", "group": "G1", "relevant": {"i": 1}}], [["i", "j"]])
    assert set(COHYDE_METRICS) == set(produced["overall"]) - {"n"}


# ------------------------------------------------------------------------------- trl
@pytest.mark.parametrize(
    ("assignment", "expected"),
    [
        ("cogr.grpo.trl.loss_typ=dapo", r"cogr.grpo.trl.loss_typ: not a field of trl.GRPOConfig \(did you mean: loss_type\?\)"),
        ("cogr.grpo.trl.learning_rate=1.0e-3", "cogr.grpo.trl.learning_rate: coevo sets GRPOConfig.learning_rate itself; use cogr.grpo.learning_rate"),
        ("cogr.grpo.trl.num_train_epochs=2", "use cogr.grpo.query_epochs / cogr.grpo.item_epochs"),
        ("grape.grpo.trl.max_steps=2", "use grape.grpo.steps"),
        ("grape.grpo.trl.temperature=0.5", "use grape.sampling.temperature"),
        ("cohyde.dpo.trl.beta=0.5", "cohyde.dpo.trl.beta: coevo sets DPOConfig.beta itself; use cohyde.dpo_beta"),
        ("cohyde.warmup.trl.per_device_train_batch_size=2", "use cohyde.warmup.batch_size"),
        ("cogr.sft.trl.seed=3", r"use seed \(top level\)"),
        ("cogr.sft.trl.gradient_accumulation_steps=two", "cogr.sft.trl.gradient_accumulation_steps: Input should be a valid integer"),
        ("cogr.sft.trl.gradient_accumulation_steps=true", "cogr.sft.trl.gradient_accumulation_steps"),
        ("cogr.grpo.trl.generation_batch_size=6", "cogr.grpo.trl.generation_batch_size: trl.GRPOConfig refuses it"),
        ("cogr.sft.trl.padding_free=true", r"cogr.sft.trl.padding_free: without packing .* add cogr.sft.trl.max_length: null"),
    ],
)
def test_bad_trl_settings_fail_at_load_time_naming_the_key(params_file, assignment, expected):
    with pytest.raises(ParamsError, match=expected):
        load_params(params_file, [assignment])


def test_trl_settings_pass_through(params_file, tmp_path):
    overlay = tmp_path / "trl.yaml"
    overlay.write_text("cogr:\n  grpo:\n    trl:\n      loss_type: dr_grpo\n      epsilon: 1e-3\n"
                       "cohyde:\n  dpo:\n    trl: {label_smoothing: 0.1}\n")
    params = load_params([params_file, overlay], ["cogr.sft.trl.gradient_accumulation_steps=2",
                                                  "cogr.grpo.trl.generation_kwargs={top_k: 5}"])
    assert params.cogr.grpo.trl == {"loss_type": "dr_grpo", "epsilon": 1e-3, "generation_kwargs": {"top_k": 5}}
    assert isinstance(params.cogr.grpo.trl["epsilon"], float)  # YAML reads 1e-3 as a string
    assert params.cogr.sft.trl == {"gradient_accumulation_steps": 2}
    assert params.cohyde.dpo.trl == {"label_smoothing": 0.1}
    assert params.flat()["cogr.grpo.trl.loss_type"] == "dr_grpo"


def test_one_mapping_from_a_trainer_section_to_its_trl_config(params_file, tmp_path):
    """The config a trainer builds takes each mapped knob's value, and the load-time check refuses
    each mapped field in ``trl``, naming that knob: both read the section's one ``trl_fields``."""
    from coevo.train.grpo import grpo_config
    from coevo.train.sft import sft_settings

    params = load_params(params_file)
    built = {"cogr.grpo": grpo_config(tmp_path, params.cogr.grpo, 0).to_dict(),
             "cogr.sft": sft_settings(type("G", (), {"tokenizer": type("T", (), {"eos_token": "</s>"})()})(),
                                      params.cogr.sft, tmp_path, 0)}
    for key, config in built.items():
        section = params.cogr.grpo if key == "cogr.grpo" else params.cogr.sft
        assert section.trl_fields, key
        for field, knob in section.trl_fields.items():
            assert config[field] == getattr(section, knob), (key, field)
            with pytest.raises(ParamsError, match=rf"{key}.trl.{field}: coevo sets .* itself; use {key}.{knob}$"):
                load_params(params_file, [f"{key}.trl.{field}=1"])


def test_padding_free_sft_loads_without_a_max_length_or_with_packing(params_file):
    params = load_params(params_file, ["cogr.sft.trl.padding_free=true", "cogr.sft.trl.max_length=null"])
    assert params.cogr.sft.trl == {"padding_free": True, "max_length": None}
    packed = load_params(params_file, ["cogr.sft.trl.padding_free=true", "cogr.sft.trl.packing=true"])
    assert packed.cogr.sft.trl["packing"] is True


def test_trl_is_not_imported_when_no_trl_mapping_is_set():
    code = ("import sys; from coevo.config import load_params; load_params('params.yaml'); "
            "assert 'trl' not in sys.modules, 'trl imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_apply_override_still_works_on_plain_trees():
    tree = {"a": {"b": 1}}
    apply_override(tree, "a.b=[1, 2]")
    assert tree == {"a": {"b": [1, 2]}}
    with pytest.raises(ParamsError, match="expected key=value"):
        apply_override(tree, "a.b")
