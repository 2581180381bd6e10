"""One class for every text generator: an HF causal LM (+ optional peft LoRA) and its tokenizer.

CoGR, GRAPE and CoHyDE all use it: ``Generator.create(name, lora, seed)`` to build,
``generate(...)`` for batched, seeded sampling with chat templates, ``save``/``load`` for
checkpoints (LoRA adapters, or full weights when LoRA is off). The TRL wrappers in
``coevo.train`` train ``generator.model`` in place.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from coevo.config import LoraParams
from coevo.io import atomic_path, write_json
from coevo.models.registry import TINY, load_causal_lm
from coevo.runtime import limit_cpu_threads

Prompt = str | list[dict[str, str]]
META_FILE = "generator.json"
SFT_TARGET_SLACK = 4  # tokens an SFT target leaves free under a completion budget: the end-of-turn fits


def cut_to_tokens(text: str, tokenizer: Any, budget: int) -> str:
    """``text`` cut to at most ``budget`` tokens of ``tokenizer``, at a word boundary."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= budget:
        return text
    cut = tokenizer.decode(ids[:budget], skip_special_tokens=True)
    return cut.rsplit(" ", 1)[0].strip() if " " in cut.strip() else cut.strip()


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch (CPU and CUDA) for a block, restoring the global RNG state afterwards."""
    import torch

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class Generator:
    """An HF causal LM with its tokenizer, optionally wrapped in a peft LoRA adapter."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str, lora: LoraParams | None, seed: int):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.lora = lora if lora is not None and lora.enabled else None
        self.seed = seed

    # ----------------------------------------------------------------- building
    @classmethod
    def create(
        cls,
        name: str,
        lora: LoraParams | None = None,
        seed: int = 0,
        corpus: Sequence[str] | None = None,
        cache_dir: Path | None = None,
    ) -> "Generator":
        """Load base model ``name`` and, when ``lora.enabled``, wrap it in a fresh LoRA adapter."""
        model, tokenizer = load_causal_lm(name, corpus=corpus, cache_dir=cache_dir, seed=seed)
        if lora is not None and lora.enabled:
            model = _add_lora(model, lora, seed)
        return cls(model, tokenizer, name=name, lora=lora, seed=seed)

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def is_peft(self) -> bool:
        return hasattr(self.model, "peft_config")

    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    # --------------------------------------------------------------- generation
    def render(self, prompt: Prompt) -> str:
        """Chat messages -> the model's prompt text (generation turn opened); strings pass through."""
        if isinstance(prompt, str):
            return prompt
        return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        num_return_sequences: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 48,
        batch_size: int = 16,
        seed: int | None = None,
        progress: bool = True,
        description: str = "generating",
    ) -> list[list[str]]:
        """Sample ``num_return_sequences`` completions per prompt; ``temperature == 0`` is greedy.

        Prompts are batched by length (left padding) and the results returned in input order.
        The same (prompts, settings, seed) always give the same outputs on one device.
        """
        import torch
        from tqdm.auto import tqdm

        if not prompts:
            return []
        limit_cpu_threads(self.model)
        texts = [self.render(p) for p in prompts]
        lengths = [len(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        order = sorted(range(len(texts)), key=lambda i: (lengths[i], i))
        results: list[list[str]] = [[] for _ in texts]
        do_sample = temperature > 0
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p} if do_sample else {"do_sample": False}
        self.tokenizer.padding_side = "left"
        was_training = self.model.training
        self.model.eval()
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        try:
            with seeded(self.seed if seed is None else seed), torch.inference_mode():
                for batch in tqdm(batches, desc=description, disable=not progress, unit="batch"):
                    enc = self.tokenizer(
                        [texts[i] for i in batch], return_tensors="pt", padding=True, add_special_tokens=False
                    ).to(self.device)
                    out = self.model.generate(
                        **enc,
                        max_new_tokens=max_new_tokens,
                        num_return_sequences=num_return_sequences,
                        pad_token_id=self.tokenizer.pad_token_id,
                        eos_token_id=self.tokenizer.eos_token_id,
                        use_cache=True,
                        **sampling,
                    )
                    decoded = self.tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
                    for j, i in enumerate(batch):
                        chunk = decoded[j * num_return_sequences : (j + 1) * num_return_sequences]
                        results[i] = [c.strip() for c in chunk]
        finally:
            self.model.train(was_training)
        return results

    # -------------------------------------------------------------- persistence
    def save(self, directory: str | Path) -> Path:
        """Write the generator atomically: adapters (LoRA) or full weights, tokenizer, metadata.

        A `tiny` base model cannot be rebuilt from its name alone, so its base weights are saved too.
        """
        directory = Path(directory)
        with atomic_path(directory, is_dir=True) as tmp:
            self.tokenizer.save_pretrained(tmp / "tokenizer")
            if self.is_peft:
                self.model.save_pretrained(tmp / "adapter")
                if self.name == TINY:
                    _save_peft_base(self.model, tmp / "base")
                    self.tokenizer.save_pretrained(tmp / "base")
                fmt = "adapter"
            else:
                self.model.save_pretrained(tmp / "model")
                self.tokenizer.save_pretrained(tmp / "model")
                fmt = "full"
            write_json(
                tmp / META_FILE,
                {
                    "name": self.name,
                    "format": fmt,
                    "seed": self.seed,
                    "lora": self.lora.model_dump() if self.lora else None,
                },
            )
        return directory

    @classmethod
    def load(cls, directory: str | Path, *, trainable: bool = True) -> "Generator":
        """Load a generator written by :meth:`save` (adapters stay trainable by default)."""
        from transformers import AutoTokenizer

        from coevo.models.registry import prepare_tokenizer

        directory = Path(directory)
        meta_path = directory / META_FILE
        if not meta_path.exists():
            raise FileNotFoundError(f"{directory}: not a saved generator ({META_FILE} is missing)")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(directory / "tokenizer"))
        # a model saved before lora.top_layers existed has adapters in every layer
        lora = LoraParams(**{"top_layers": None, **meta["lora"]}) if meta.get("lora") else None
        if meta["format"] == "full":
            model, _ = load_causal_lm(str(directory / "model"))
        else:
            from peft import PeftModel

            base_source = str(directory / "base") if (directory / "base").exists() else meta["name"]
            base, _ = load_causal_lm(base_source)
            model = PeftModel.from_pretrained(base, directory / "adapter", is_trainable=trainable)
        model.eval()
        return cls(model, tokenizer, name=meta["name"], lora=lora, seed=int(meta["seed"]))


def _add_lora(model: Any, lora: LoraParams, seed: int):
    from peft import LoraConfig, get_peft_model

    layers = None
    if lora.top_layers is not None:
        depth = int(model.config.num_hidden_layers)
        if lora.top_layers > depth:
            raise ValueError(f"lora.top_layers={lora.top_layers}: the model has {depth} transformer layers")
        layers = list(range(depth - lora.top_layers, depth))
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        layers_to_transform=layers,
        layers_pattern="layers" if layers else None,
        task_type="CAUSAL_LM",
    )
    with seeded(seed):  # LoRA A matrices are random: same seed, same adapter
        return get_peft_model(model, config)


def _save_peft_base(peft_model: Any, dest: Path) -> None:
    """Save the frozen base weights of a peft model as a plain HF checkpoint (no LoRA keys)."""
    from safetensors.torch import save_file

    base = peft_model.get_base_model()
    state = {}
    for key, tensor in base.state_dict().items():
        if "lora_" in key:
            continue
        state[key.replace(".base_layer.", ".")] = tensor.detach().contiguous().clone()
    if getattr(base.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    dest.mkdir(parents=True, exist_ok=True)
    base.config.save_pretrained(dest)
    base.generation_config.save_pretrained(dest)
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
