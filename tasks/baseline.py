"""Baseline and export tasks: Lucene BM25 over raw item text, keyword index -> Lucene."""

from __future__ import annotations

from typing import Any

from tasks.common import fingerprint, pipeline_task

RETRIEVAL_CODE = ("coevo.retrieval", "coevo.data", "coevo.io")


@pipeline_task(name="bm25-baseline", packages=RETRIEVAL_CODE, tags=("java",))
def bm25_baseline(*, dataset_dir: str, dataset_fingerprint: str, split: str, k: int = 1000) -> dict[str, Any]:
    """BM25 (pyserini/Lucene) over title + text, scored with the project's metrics."""
    from coevo.data.schema import Dataset
    from coevo.retrieval.lucene import bm25_baseline as run_bm25

    metrics = run_bm25(Dataset.load(dataset_dir), split, k)
    return {k_: float(v) for k_, v in metrics.items() if isinstance(v, (int, float))}


@pipeline_task(name="export-lucene", packages=RETRIEVAL_CODE, tags=("java",))
def export_lucene(
    *, keywords_path: str, keywords_fingerprint: str, out_dir: str, field: str | None = "items"
) -> dict[str, Any]:
    """Export an item keyword index (JSON `{item_id: [keywords]}`, or that mapping under
    `field`) as a Lucene index that pyserini can search."""
    from coevo.io import read_json
    from coevo.retrieval.lucene import export_keyword_index

    item_keywords = read_json(keywords_path)
    if field is not None:
        item_keywords = item_keywords[field]
    export_keyword_index(item_keywords, out_dir)
    return {"lucene_dir": out_dir, "fingerprint": fingerprint(out_dir)}
