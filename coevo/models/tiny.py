"""`tiny`: a randomly initialised small Llama with a byte-level BPE trained on the corpus.

Used by tests and CI: it builds in about a second on CPU, has a ChatML chat template like the
real generators, and is fully determined by (corpus, seed, sizes). Its outputs are noise until
trained, which is exactly what a pipeline test needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# ChatML, the template SmolLM2 and Qwen use; `add_generation_prompt` opens the assistant turn.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|im_start|>", "<|im_end|>"]

# Text always present in the tokenizer's training data, so chat roles and the keyword
# separators get their own merges even when the corpus is tiny.
_FIXED_TEXT = [
    "system user assistant",
    "keywords: a, b, c, d",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]


@dataclass(frozen=True)
class TinySpec:
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024


def build_tiny_tokenizer(corpus: Sequence[str], vocab_size: int):
    """Train a byte-level BPE on ``corpus`` and wrap it as a fast HF tokenizer with ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Sorted, de-duplicated input: the merges depend only on the corpus content, not its order.
    texts = sorted({t for t in list(corpus) + _FIXED_TEXT if t})
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        padding_side="left",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(tokenizer, seed: int, spec: TinySpec = TinySpec()):
    """A random LlamaForCausalLM sized for ``tokenizer``; identical weights for identical seeds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    fork_devices: list = []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
