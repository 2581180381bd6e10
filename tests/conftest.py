"""Shared fixtures. Tests never reach a model hub; tests needing ../shared/data skip without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
SAMPLE_DIR = REPO_ROOT / "data" / "sample"


def shared_data(name: str) -> Path:
    """Path to ../shared/data/<name>, or skip the calling test with the reason."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} is absent (real public data lives there in CI, not in a user's clone)")
    return path


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    """A copy of the project's params.yaml that a test may edit."""
    dest = tmp_path / "params.yaml"
    dest.write_text((REPO_ROOT / "params.yaml").read_text())
    return dest
