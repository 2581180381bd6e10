"""What the benchmarks that measure in fresh subprocesses share (not a benchmark itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_json_worker(cmd: list[str], *, isa_cap: str | None, failure: str) -> dict[str, Any]:
    """Run one measurement in a fresh process (clean peak memory) on one thread, offline, with oneDNN
    capped at ``isa_cap`` (``AVX2``: the kernels of a CPU without bf16 units); its last JSON line.
    A failed worker's stderr tail is shown and ``failure`` ends the benchmark."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")
    if isa_cap:
        env["ONEDNN_MAX_CPU_ISA"] = isa_cap
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{failure} (exit {proc.returncode})")
    return json.loads(lines[-1])


def parse_variants(specs: list[str], bench: str) -> dict[str, list[str]]:
    """``--variant NAME=KEY=VALUE[,KEY=VALUE...]`` specs as {name: [KEY=VALUE, ...]}; a malformed one
    ends the benchmark with one line naming it."""
    variants: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, settings = spec.partition("=")
        if not sep or not name or "=" not in settings:
            raise SystemExit(f"{bench}: --variant {spec!r} is not NAME=KEY=VALUE[,KEY=VALUE...]")
        variants[name] = settings.split(",")
    return variants


def params_files(overlays: list[Path] | None) -> list[Path]:
    """params.yaml, then the ``--params`` overlays (default: params/cpu.yaml, the CPU settings)."""
    return [ROOT / "params.yaml", *(p.resolve() for p in (overlays or [ROOT / "params" / "cpu.yaml"]))]


def params_argv(overlays: list[Path] | None) -> list[str]:
    """The ``--params`` options that give a worker process the same overlays (:func:`params_files`)."""
    return [arg for path in params_files(overlays)[1:] for arg in ("--params", str(path))]
