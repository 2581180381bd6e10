"""Contrastive fine-tuning of a sentence-transformers encoder on (anchor, positive) text pairs.

A thin wrapper over sentence-transformers' trainer with MultipleNegativesRankingLoss: every
other positive in the batch is a negative for an anchor (in-batch negatives). CoHyDE uses it
for S1a (query, rendered tool) and S3 (generated description, rendered tool).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.config import EncoderTrainingParams
from coevo.io import atomic_path, write_json
from coevo.train.common import check_finite_result, check_finite_weights, limit_cpu_threads, step_callbacks

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def _check_pairs(pairs: Sequence[tuple[str, str]]) -> None:
    if len(pairs) < 2:
        raise ValueError("encoder training needs at least 2 (anchor, positive) pairs for in-batch negatives, "
                         f"got {len(pairs)}")
    for i, pair in enumerate(pairs):
        if len(pair) != 2 or not all(isinstance(t, str) and t.strip() for t in pair):
            raise ValueError(f"encoder training pair {i}: expected two non-empty strings, got {pair!r}")


def train_encoder(
    encoder: "SentenceTransformer",
    pairs: Sequence[tuple[str, str]],
    params: EncoderTrainingParams,
    out_dir: str | Path,
    seed: int,
    what: str = "encoder training",
    knob: str | None = None,
) -> dict[str, Any]:
    """Train ``encoder`` in place on ``pairs`` and save it to ``out_dir`` (atomically).

    A NaN or infinite loss, gradient norm or weight stops training before anything is saved
    (:class:`~coevo.train.common.NonFiniteTraining`, naming ``what``, ``out_dir`` and ``knob``,
    e.g. ``cohyde.encoder_training``).

    Returns training statistics (also written to ``out_dir/training.json``): pairs, steps,
    mean training loss, seconds.
    """
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers

    _check_pairs(pairs)
    limit_cpu_threads(encoder)
    # A batch cannot be larger than the data; in-batch negatives need at least 2 per batch.
    batch_size = max(2, min(params.batch_size, len(pairs)))
    dataset = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="coevo-encoder-") as scratch:
        args = SentenceTransformerTrainingArguments(
            output_dir=scratch,
            num_train_epochs=params.epochs,
            per_device_train_batch_size=batch_size,
            learning_rate=params.learning_rate,
            warmup_steps=0,
            seed=seed,
            data_seed=seed,
            # The same tool twice in one batch would be a false negative for both anchors.
            batch_sampler=BatchSamplers.NO_DUPLICATES,
            save_strategy="no",
            report_to=[],
            logging_steps=max(1, math.ceil(len(pairs) / batch_size) // 4),
            disable_tqdm=False,
            use_cpu=not torch.cuda.is_available(),
            logging_nan_inf_filter=False,
        )
        guard = {"what": what, "out_dir": out_dir, "knob": knob, "learning_rate": params.learning_rate}
        trainer = SentenceTransformerTrainer(
            model=encoder,
            args=args,
            train_dataset=dataset,
            loss=MultipleNegativesRankingLoss(encoder),
            callbacks=step_callbacks(**guard),
        )
        result = trainer.train()
    check_finite_result(result.training_loss, "the mean training loss", **guard)
    check_finite_weights(encoder, **guard)
    stats = {
        "pairs": len(pairs),
        "batch_size": batch_size,
        "steps": int(result.global_step),
        "train_loss": float(result.training_loss),
        "seconds": round(time.perf_counter() - started, 3),
    }
    out_dir = Path(out_dir)
    with atomic_path(out_dir, is_dir=True) as tmp:
        encoder.save(str(tmp))
        write_json(tmp / "training.json", stats)
    return stats
