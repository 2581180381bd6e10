"""TRL wrappers: SFT and GRPO train a tiny generator in place and report their metrics."""

from __future__ import annotations

import pytest

import torch

from coevo.config import section  # noqa: E402
from coevo.models.generator import Generator  # noqa: E402
from coevo.models.prompts import keyword_completion, query_messages  # noqa: E402
from coevo.train.grpo import grpo_config, train_grpo, wrap_reward  # noqa: E402
from coevo.train.sft import train_sft  # noqa: E402

CORPUS = ["weather forecast, city temperature", "flight search, ticket prices", "translate text, languages"]


def _trainable_snapshot(gen: Generator) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in gen.model.named_parameters() if p.requires_grad}


def _changed(before: dict[str, torch.Tensor], gen: Generator) -> bool:
    after = dict(gen.model.named_parameters())
    return any(not torch.equal(before[n], after[n].detach()) for n in before)


@pytest.mark.slow
def test_sft_learns_the_targets(tmp_path):
    torch.set_num_threads(1)
    gen = Generator.create("tiny", section("cogr.lora", enabled=False), seed=0, corpus=CORPUS)
    examples = [
        {"prompt": query_messages(q), "completion": keyword_completion(k)}
        for q, k in [("weather today", ["weather", "forecast"]), ("cheap flights", ["flight search", "tickets"])]
    ]
    before = _trainable_snapshot(gen)
    first = train_sft(gen, examples, section("cogr.sft", epochs=1, learning_rate=1e-3, batch_size=2), tmp_path / "a", seed=0)
    later = train_sft(gen, examples, section("cogr.sft", epochs=15, learning_rate=1e-2, batch_size=2), tmp_path / "b", seed=0)
    assert _changed(before, gen)
    assert first["train/steps"] == 1 and later["train/steps"] == 15
    assert later["train/loss_last"] < first["train/loss"]  # it fits the two targets
    assert not gen.model.training  # handed back ready to generate


def test_sft_rejects_bad_rows(tmp_path):
    gen = Generator.create("tiny", None, seed=0, corpus=CORPUS)
    with pytest.raises(ValueError, match="no training examples"):
        train_sft(gen, [], section("cogr.sft"), tmp_path, seed=0)
    with pytest.raises(ValueError, match="row 1 has no 'completion'"):
        train_sft(gen, [{"prompt": "a", "completion": "b"}, {"prompt": "c"}], section("cogr.sft"), tmp_path, seed=0)


@pytest.mark.slow
def test_grpo_trains_and_passes_columns_to_the_reward(tmp_path):
    torch.set_num_threads(1)
    gen = Generator.create("tiny", section("cogr.lora", r=4, alpha=8), seed=0, corpus=CORPUS)
    seen: list[str] = []
    groups: list[tuple[float, ...]] = []

    def reward(completions: list[str], query_id: list[str]) -> list[float]:
        seen.extend(query_id)
        values = [float(len(c) % 5) for c in completions]  # varies within a group: non-zero advantages
        assert query_id[0::2] == query_id[1::2]  # a prompt's 2 completions are consecutive (GroupOutcomes)
        groups.extend(zip(values[0::2], values[1::2]))
        return values

    rows = [{"prompt": query_messages(f"query {i}"), "query_id": f"q{i}"} for i in range(4)]
    before = _trainable_snapshot(gen)
    params = section("cogr.grpo", num_generations=2, batch_size=4, learning_rate=1e-2, max_completion_length=6)
    result = train_grpo(gen, rows, reward, params, tmp_path, seed=0, solved_at=4.0)
    assert result["steps"] == 2  # 4 prompts x 2 completions / 4 per step
    assert set(seen) == {"q0", "q1", "q2", "q3"} and len(seen) == 8
    assert result["reward_mean"] is not None and result["kl"] == 0.0  # beta 0: no reference model
    assert _changed(before, gen)
    # where the signal went, group by group, as the reward saw the groups
    assert result["groups"] == len(groups) == 4
    assert result["groups_zero_std_share"] == sum(a == b for a, b in groups) / 4
    assert result["groups_solved_in_none_share"] == sum(max(g) <= 0 for g in groups) / 4
    assert result["groups_solved_in_all_share"] == sum(min(g) >= 4.0 for g in groups) / 4
    assert result["rollouts_per_min"] == pytest.approx(8 / result["seconds"] * 60)
    assert 0.0 < result["generation_share"] < 1.0


def test_group_outcomes_count_each_prompts_group():
    from coevo.train.grpo import GroupOutcomes

    outcomes = GroupOutcomes(size=3, solved_at=1.0)
    outcomes.add([1.0, 1.0, 1.0, 0.0, 0.0, -1.0])  # solved in every sample; in none (and not zero-std)
    outcomes.add([0.5, 0.5, 0.5])  # zero std, neither
    outcomes.add([1.0, 0.2])  # a slice that splits a group: counted as completions only
    assert outcomes.summary() == {"groups": 3, "groups_zero_std_share": 2 / 3, "groups_solved_in_none_share": 1 / 3,
                                  "groups_solved_in_all_share": 1 / 3}
    assert outcomes.completions == 11
    assert GroupOutcomes(size=2).summary()["groups_solved_in_all_share"] is None  # no notion of solved


def test_grpo_input_errors_come_before_training(tmp_path):
    gen = Generator.create("tiny", None, seed=0, corpus=CORPUS)
    params = section("cogr.grpo", num_generations=2, batch_size=2)
    with pytest.raises(ValueError, match="no prompts"):
        train_grpo(gen, [], lambda completions: [0.0], params, tmp_path, seed=0)
    with pytest.raises(ValueError, match=r"does not accept prompt column\(s\) \['item_id'\]"):
        train_grpo(gen, [{"prompt": "x", "item_id": "i"}], lambda completions: [0.0], params, tmp_path, seed=0)


def test_cpu_settings_avoid_the_slow_trl_defaults(tmp_path, monkeypatch):
    # TRL defaults to bf16 autocast + gradient checkpointing: several times slower on CPUs without bf16 units.
    from coevo.train import common

    for forced, expected in (("0", False), ("1", True)):
        monkeypatch.setenv("COEVO_CPU_BF16", forced)
        common.cpu_bf16_is_fast.cache_clear()
        config = grpo_config(tmp_path, section("cogr.grpo"), seed=1)
        if not torch.cuda.is_available():
            assert config.bf16 is expected
        assert config.gradient_checkpointing is False
    common.cpu_bf16_is_fast.cache_clear()
    assert config.num_generations == 4 and config.per_device_train_batch_size == 8


def test_wrap_reward_reads_conversational_completions():
    wrapped = wrap_reward(lambda completions, item_id: [len(c) for c in completions], ["item_id"])
    values = wrapped(prompts=[None, None], completions=[[{"role": "assistant", "content": "ab"}], "abc"], item_id=["i", "j"])
    assert values == [2.0, 3.0]


def test_trl_mapping_reaches_the_grpo_config(tmp_path):
    # Options coevo has no knob for come through params' trl mapping, after coevo's settings.
    params = section("cogr.grpo", trl={"loss_type": "dapo", "epsilon": 0.3, "scale_rewards": "batch",
                                      "mask_truncated_completions": True, "gradient_checkpointing": True})
    config = grpo_config(tmp_path, params, seed=1)
    assert (config.loss_type, config.epsilon, config.scale_rewards) == ("dapo", 0.3, "batch")
    assert config.mask_truncated_completions is True and config.gradient_checkpointing is True
    assert config.num_generations == params.num_generations  # coevo's own knobs are untouched


@pytest.mark.slow
def test_trl_gradient_accumulation_reaches_the_sft_and_grpo_trainers(tmp_path):
    # Half as many optimizer steps with gradient_accumulation_steps=2: the option reached the trainer.
    torch.set_num_threads(1)
    examples = [{"prompt": query_messages(f"query {i}"), "completion": keyword_completion([f"kw{i}"])} for i in range(4)]
    steps = {}
    for accumulation in (1, 2):
        gen = Generator.create("tiny", section("cogr.lora", r=4, alpha=8), seed=0, corpus=CORPUS)
        params = section("cogr.sft", epochs=1, batch_size=1, trl={"gradient_accumulation_steps": accumulation})
        steps[accumulation] = train_sft(gen, examples, params, tmp_path / f"sft{accumulation}", seed=0)["train/steps"]
    assert steps == {1: 4, 2: 2}

    rows = [{"prompt": query_messages(f"query {i}")} for i in range(4)]
    grpo_steps = {}
    for accumulation in (1, 2):
        gen = Generator.create("tiny", section("cogr.lora", r=4, alpha=8), seed=0, corpus=CORPUS)
        params = section("cogr.grpo", num_generations=2, batch_size=4, max_completion_length=4,
                         trl={"gradient_accumulation_steps": accumulation})
        result = train_grpo(gen, rows, lambda completions: [float(len(c)) for c in completions], params,
                            tmp_path / f"grpo{accumulation}", seed=0)
        grpo_steps[accumulation] = result["steps"]
        # Throughput counts every completion of an optimizer step: batch_size x accumulation of them.
        sampled = result["completion_length"] * 4 * accumulation
        assert result["tokens_per_s"] == pytest.approx(sampled / result["step_seconds"])
    assert grpo_steps == {1: 2, 2: 1}  # 4 prompts x 2 completions, 4 per micro-batch


def test_padding_free_sft_trains_as_the_padded_batch_does(tmp_path):
    # Padding-free flattens a batch into one row; transformers' SDPA mask keeps each example to
    # itself (block-diagonal, from position_ids), so the loss and the update equal the padded batch's.
    from coevo.runtime import precision_policy

    torch.set_num_threads(1)
    examples = [{"prompt": query_messages("weather " * n + "today"), "completion": keyword_completion(["weather", "forecast"] * n)}
                for n in (1, 4, 9)]  # lengths differ, so the padded batch pads
    results, weights = {}, {}
    # SGD: Adam's first step is lr * sign(gradient), which turns float noise in a near-zero gradient into 2 * lr
    sgd = {"optim": "sgd"}
    for name, trl in {"padded": sgd, "padding_free": {**sgd, "padding_free": True, "max_length": None}}.items():
        # no adapter dropout: its random masks follow the tensor's layout, which differs by design
        gen = Generator.create("tiny", section("cogr.lora", r=4, alpha=8, dropout=0.0), seed=0, corpus=CORPUS)
        with precision_policy("fp32"):
            results[name] = train_sft(gen, examples, section("cogr.sft", epochs=1, learning_rate=1e-2, batch_size=3, trl=trl),
                                      tmp_path / name, seed=0)
        weights[name] = _trainable_snapshot(gen)
    assert results["padded"]["train/steps"] == results["padding_free"]["train/steps"] == 1
    assert results["padding_free"]["train/loss"] == pytest.approx(results["padded"]["train/loss"], rel=2e-5)
    for key, value in weights["padded"].items():
        torch.testing.assert_close(weights["padding_free"][key], value, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_trl_mapping_reaches_the_dpo_trainer(tmp_path):
    from coevo.train.dpo import train_dpo

    torch.set_num_threads(1)
    steps = {}
    for accumulation in (1, 2):
        gen = Generator.create("tiny", section("cohyde.lora", r=4, alpha=8), seed=0, corpus=CORPUS)
        prompts = [gen.render([{"role": "user", "content": f"Request: q{i}"}]) for i in range(4)]
        pairs = [{"prompt": p, "chosen": "weather forecast", "rejected": "stock prices"} for p in prompts]
        params = section("cohyde.dpo", epochs=1, batch_size=2,
                         trl={"gradient_accumulation_steps": accumulation, "label_smoothing": 0.1})
        steps[accumulation] = train_dpo(gen, pairs, params, 0.1, tmp_path / f"dpo{accumulation}", seed=0)["steps"]
    assert steps == {1: 2, 2: 1}
