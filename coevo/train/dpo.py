"""Direct preference optimisation of a generator on (prompt, chosen, rejected) triples.

A thin wrapper over TRL's DPOTrainer. The reference policy is the generator as it stands
when DPO starts: with LoRA, TRL copies the current adapter into a frozen ``ref`` adapter
(removed again afterwards so the next round can do the same); without LoRA a frozen deep
copy of the model is passed explicitly (TRL 1.16 would otherwise reload the base weights
from the model's name, which is wrong after SFT and impossible for an in-memory model).
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.config import DPOParams
from coevo.io import write_json
from coevo.train.common import (
    check_finite_result,
    check_finite_weights,
    last_of,
    limit_cpu_threads,
    step_callbacks,
    trainer_device_args,
)

if TYPE_CHECKING:
    from coevo.models.generator import Generator

_KEYS = ("prompt", "chosen", "rejected")


def _check_pairs(pairs: Sequence[Mapping[str, str]]) -> None:
    if not pairs:
        raise ValueError("DPO needs at least one (prompt, chosen, rejected) pair, got none")
    for i, pair in enumerate(pairs):
        for key in _KEYS:
            value = pair.get(key) if isinstance(pair, Mapping) else None
            if not isinstance(value, str) or (key != "prompt" and not value.strip()):
                raise ValueError(f"DPO pair {i}: field {key!r} must be a non-empty string, got {value!r}")
        if pair["chosen"] == pair["rejected"]:
            raise ValueError(f"DPO pair {i}: chosen and rejected are the same text")


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a pinned dependency
        return False
    return isinstance(model, PeftModel)


def train_dpo(
    generator: Generator,
    pairs: Sequence[Mapping[str, str]],
    params: DPOParams,
    beta: float,
    out_dir: str | Path,
    seed: int,
    max_length: int = 512,
    what: str = "DPO",
    knob: str | None = None,
) -> dict[str, Any]:
    """Train ``generator.model`` in place by DPO on ``pairs``; save the generator to ``out_dir``.

    A NaN or infinite loss, gradient norm or weight stops training before anything is saved
    (:class:`~coevo.train.common.NonFiniteTraining`, naming ``what``, ``out_dir`` and ``knob``).

    ``pairs`` hold the prompt exactly as the model sees it at generation (chat template
    applied, see ``Generator.render``) and two completions. Returns statistics (also written
    as ``out_dir/dpo.json``): pairs, steps, loss, reward accuracy and margin of the last log.
    """
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from coevo.models.generator import seeded

    _check_pairs(pairs)
    if beta <= 0:
        raise ValueError(f"DPO beta must be > 0, got {beta}")
    model = generator.model
    tokenizer = generator.tokenizer
    limit_cpu_threads(model)
    peft = _is_peft(model)
    ref_model = None
    if not peft:
        ref_model = copy.deepcopy(model).eval()
        for param in ref_model.parameters():
            param.requires_grad_(False)
    dataset = Dataset.from_list([{key: pair[key] for key in _KEYS} for pair in pairs])
    batch_size = max(1, min(params.batch_size, len(pairs)))
    padding_side = tokenizer.padding_side
    started = time.perf_counter()
    guard = {"what": what, "out_dir": out_dir, "knob": knob, "learning_rate": params.learning_rate}
    try:
        with tempfile.TemporaryDirectory(prefix="coevo-dpo-") as scratch, seeded(seed):
            config = DPOConfig(**{
                "output_dir": scratch,
                **params.trl_settings(),  # the section's knobs (epochs, learning_rate, batch_size)
                "per_device_train_batch_size": batch_size,  # capped at the pair count
                "beta": beta,
                "max_length": max_length,
                **trainer_device_args(seed),
                # Any other DPOConfig field (checked against DPOConfig when params load).
                **params.trl,
            })
            trainer = DPOTrainer(
                model=model,
                ref_model=ref_model,
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                callbacks=step_callbacks(**guard),
            )
            result = trainer.train()
            history = trainer.state.log_history
    finally:
        if peft and "ref" in getattr(model, "peft_config", {}):
            # TRL added a frozen copy of the adapter as the reference; drop it so the saved
            # generator holds one adapter and the next DPO round can add its own.
            model.set_adapter("default")
            model.delete_adapter("ref")
        tokenizer.padding_side = padding_side
        model.eval()
    check_finite_result(result.training_loss, "the mean training loss", **guard)
    check_finite_weights(model, **guard)
    stats = {
        "pairs": len(pairs),
        "beta": beta,
        "steps": int(result.global_step),
        "train_loss": float(result.training_loss),
        "rewards_accuracy": last_of(history, "rewards/accuracies"),
        "rewards_margin": last_of(history, "rewards/margins"),
        "reference": "adapter copy" if peft else "frozen model copy",
        "seconds": round(time.perf_counter() - started, 3),
    }
    out_dir = Path(out_dir)
    generator.save(out_dir)
    write_json(out_dir / "dpo.json", stats)
    return stats
