"""Data tasks: turn a source into the three parquet tables, then validate them."""

from __future__ import annotations

from typing import Any

from tasks.common import fingerprint, pipeline_task

DATA_CODE = ("coevo.data", "coevo.io")


@pipeline_task(name="prepare-data", packages=DATA_CODE)
def prepare_data(
    *,
    loader: str,
    source: str,
    source_fingerprint: str,
    name: str,
    seed: int,
    val_fraction: float,
    test_fraction: float,
    out_dir: str,
) -> dict[str, Any]:
    """Load `source` with `loader`, split, save under `out_dir`.

    `source_fingerprint` is not read: it puts the source's content into the cache key.
    """
    from coevo.data.loaders import load_source

    dataset = load_source(
        loader, source, seed=seed, val_fraction=val_fraction, test_fraction=test_fraction, name=name
    )
    dataset.save(out_dir)
    return {"dataset_dir": out_dir, "fingerprint": fingerprint(out_dir), "summary": _summary(dataset)}


def _summary(dataset: Any) -> dict[str, Any]:
    try:
        from coevo.data.summary import summarize
    except ImportError:  # the summary helper is optional; counts are always there
        return dataset.metadata()["counts"]
    summary = summarize(dataset)
    return summary if isinstance(summary, dict) else getattr(summary, "__dict__", {"summary": str(summary)})


@pipeline_task(name="validate-data", packages=DATA_CODE, retries=0)
def validate_data(*, dataset_dir: str, dataset_fingerprint: str, report_path: str) -> dict[str, Any]:
    """Great Expectations checks; a failure raises DataValidationError naming each failed
    expectation and the report's path, which stops the flow."""
    from coevo.data.validation import ensure_valid

    ensure_valid(dataset_dir, report_path)
    return {"report": report_path, "report_fingerprint": fingerprint(report_path), "ok": True}
