import pytest

from coevo.config import ParamsError, load_params


def test_project_params_load(params_file):
    params = load_params(params_file)
    assert params.cogr.grpo.batch_size % params.cogr.grpo.num_generations == 0
    assert params.flat()["cogr.lora.r"] == params.cogr.lora.r


def test_override_changes_value(params_file):
    params = load_params(params_file, ["cogr.rounds=5", "cogr.lora.target_modules=[q_proj]"])
    assert params.cogr.rounds == 5
    assert params.cogr.lora.target_modules == ["q_proj"]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ("cogr.rounds=-1", "cogr.rounds"),
        ("cogr.grpo.batch_size=6", "multiple of num_generations"),
        ("cogr.item_reward=best", "cogr.item_reward"),
        ("cogr.k_max=lots", "cogr.k_max"),
    ],
)
def test_bad_values_name_the_key(params_file, edit, expected):
    with pytest.raises(ParamsError, match=expected):
        load_params(params_file, [edit])


def test_unknown_key_in_file_is_named(params_file):
    params_file.write_text(params_file.read_text() + "\nbogus_section: 1\n")
    with pytest.raises(ParamsError, match="bogus_section: unknown key"):
        load_params(params_file)


def test_unknown_override_key_is_named(params_file):
    with pytest.raises(ParamsError, match="cogr.nope"):
        load_params(params_file, ["cogr.nope=1"])


def test_missing_file(tmp_path):
    with pytest.raises(ParamsError, match="does not exist"):
        load_params(tmp_path / "absent.yaml")


def test_demo_overrides_are_valid_params(params_file):
    from coevo.cli.run import DEMO_OVERRIDES

    params = load_params(params_file, list(DEMO_OVERRIDES))
    assert params.cogr.generator == "smollm2-135m"
    assert params.data.source == "data/sample/metatool"
