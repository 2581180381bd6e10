"""Deterministic, seeded train/val/test split by query, stratified by group.

Each group is split on its own with a generator seeded by (seed, crc32(group)), over its
query ids in sorted order: the split of a query depends only on the seed, its group and the
ids in that group, never on row order or on the other groups. Queries without a relevant
item (grade > 0) always train: an evaluation query must have something to find.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd


def _validate_fractions(val_fraction: float, test_fraction: float) -> None:
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value}")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"val_fraction + test_fraction must be < 1 (some queries must train), got {val_fraction} + {test_fraction}"
        )


def assign_splits(
    queries: pd.DataFrame,
    qrels: pd.DataFrame,
    *,
    seed: int,
    val_fraction: float,
    test_fraction: float,
    group_column: str = "group",
) -> pd.Series:
    """A split label ("train"/"val"/"test") for every row of ``queries`` (same index)."""
    _validate_fractions(val_fraction, test_fraction)
    eligible = set(qrels.loc[qrels["grade"] > 0, "query_id"])
    groups = queries[group_column] if group_column in queries.columns else pd.Series("", index=queries.index)
    split = pd.Series("train", index=queries.index, dtype=object)
    for group in sorted(groups.fillna("").astype(str).unique()):
        in_group = queries.index[(groups.fillna("").astype(str) == group).to_numpy()]
        ids = queries.loc[in_group, "query_id"]
        candidates = sorted(ids[ids.isin(eligible)])
        rng = np.random.default_rng([seed, zlib.crc32(group.encode("utf-8"))])
        order = [candidates[i] for i in rng.permutation(len(candidates))]
        n_val = int(round(len(order) * val_fraction))
        n_test = int(round(len(order) * test_fraction))
        labels = {qid: "val" for qid in order[:n_val]}
        labels.update({qid: "test" for qid in order[n_val : n_val + n_test]})
        split.loc[in_group] = [labels.get(qid, "train") for qid in ids]
    return split
