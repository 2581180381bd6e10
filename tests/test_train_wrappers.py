"""TRL wrappers: SFT and GRPO train a tiny generator in place and report their metrics."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from coevo.config import GRPOParams, LoraParams, SFTParams  # noqa: E402
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
    gen = Generator.create("tiny", LoraParams(enabled=False), seed=0, corpus=CORPUS)
    examples = [
        {"prompt": query_messages(q), "completion": keyword_completion(k)}
        for q, k in [("weather today", ["weather", "forecast"]), ("cheap flights", ["flight search", "tickets"])]
    ]
    before = _trainable_snapshot(gen)
    first = train_sft(gen, examples, SFTParams(epochs=1, learning_rate=1e-3, batch_size=2), tmp_path / "a", seed=0)
    later = train_sft(gen, examples, SFTParams(epochs=15, learning_rate=1e-2, batch_size=2), tmp_path / "b", seed=0)
    assert _changed(before, gen)
    assert first["train/steps"] == 1 and later["train/steps"] == 15
    assert later["train/loss_last"] < first["train/loss"]  # it fits the two targets
    assert not gen.model.training  # handed back ready to generate


def test_sft_rejects_bad_rows(tmp_path):
    gen = Generator.create("tiny", None, seed=0, corpus=CORPUS)
    with pytest.raises(ValueError, match="no training examples"):
        train_sft(gen, [], SFTParams(), tmp_path, seed=0)
    with pytest.raises(ValueError, match="row 1 has no 'completion'"):
        train_sft(gen, [{"prompt": "a", "completion": "b"}, {"prompt": "c"}], SFTParams(), tmp_path, seed=0)


@pytest.mark.slow
def test_grpo_trains_and_passes_columns_to_the_reward(tmp_path):
    torch.set_num_threads(1)
    gen = Generator.create("tiny", LoraParams(r=4, alpha=8), seed=0, corpus=CORPUS)
    seen: list[str] = []

    def reward(completions: list[str], query_id: list[str]) -> list[float]:
        seen.extend(query_id)
        return [float(len(c) % 5) for c in completions]  # varies within a group: non-zero advantages

    rows = [{"prompt": query_messages(f"query {i}"), "query_id": f"q{i}"} for i in range(4)]
    before = _trainable_snapshot(gen)
    params = GRPOParams(num_generations=2, batch_size=4, learning_rate=1e-2, max_completion_length=6)
    result = train_grpo(gen, rows, reward, params, tmp_path, seed=0)
    assert result["steps"] == 2  # 4 prompts x 2 completions / 4 per step
    assert set(seen) == {"q0", "q1", "q2", "q3"} and len(seen) == 8
    assert result["reward_mean"] is not None and result["kl"] == 0.0  # beta 0: no reference model
    assert _changed(before, gen)


def test_grpo_input_errors_come_before_training(tmp_path):
    gen = Generator.create("tiny", None, seed=0, corpus=CORPUS)
    params = GRPOParams(num_generations=2, batch_size=2)
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
        config = grpo_config(tmp_path, GRPOParams(), seed=1)
        if not torch.cuda.is_available():
            assert config.bf16 is expected
        assert config.gradient_checkpointing is False
    common.cpu_bf16_is_fast.cache_clear()
    assert config.num_generations == 4 and config.per_device_train_batch_size == 8


def test_wrap_reward_reads_conversational_completions():
    wrapped = wrap_reward(lambda completions, item_id: [len(c) for c in completions], ["item_id"])
    values = wrapped(prompts=[None, None], completions=[[{"role": "assistant", "content": "ab"}], "abc"], item_id=["i", "j"])
    assert values == [2.0, 3.0]
