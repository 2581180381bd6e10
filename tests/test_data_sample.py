"""The committed embedded samples: small, licensed, attributed, and valid under the data contract."""

from __future__ import annotations

import pytest

from coevo.data.loaders import load_source
from coevo.data.validation import validate
from tests.conftest import SAMPLE_DIR

SAMPLES = {"metatool": ("MIT License", "HowieHwong/MetaTool, commit 35e81bb"),
           "stabletoolbench": ("Apache License", "THUNLP-MT/StableToolBench, commit aa4ed9f")}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_is_small_licensed_and_attributed(name):
    folder = SAMPLE_DIR / name
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < 1_000_000, f"{folder} is {size} bytes"
    licence, source = SAMPLES[name]
    assert licence in (folder / "LICENSE").read_text()
    attribution = (folder / "ATTRIBUTION.md").read_text()
    assert source in attribution and f"coevo data build-sample {name}" in attribution


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_is_valid(name):
    report = validate(load_source(name, SAMPLE_DIR / name))
    assert report.ok, report.message()
