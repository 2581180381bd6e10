"""GPU worker check, the Python half of ``bench/gpu_check.sh``: every method's phases, one verdict line each.

Per method (``coevo.methods.SPECS``, so a registered fourth method needs an entry in
:data:`SETTINGS`, and the check says so), on the random Qwen3-0.6B-shaped model the shell
script built and the committed samples it prepared:

- CoGR: Algorithm 1 seeds, SFT of both sides, one query-side and one item-side GRPO phase;
- GRAPE: the frozen MiniLM index, the untrained rewriter, a few GRPO steps, the trained one;
- CoHyDE: S1a encoder, S1b warm-up, vanilla HyDE and one round (S2, S3, S4, DPO).

Library output (progress bars, TRL's step dictionaries, warnings) goes to ``<work>/gpu_check.log``.
Generation runs on vLLM for a method whose spec declares it (``supports_vllm``) when vLLM is
installed and a GPU is visible. Printed per method: each phase with its seconds and val
headline metric (CoGR adds GRPO step time and tokens/s), the peak GPU memory, then
``gpu_check: <method> ok in <s>s (...)`` or ``gpu_check: <method> FAILED in <s>s: <error>``;
the exit status is 1 when a method failed. A random model writes no useful text: the numbers
measure speed and that each phase runs, not quality.

    python bench/gpu_check.py --work DIR [--dry] [--methods cogr grape cohyde]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Per method: the prepared sample it trains on (a folder under --work) and its --set overrides on
# params.yaml, at GPU scale and (dry) at the CPU rehearsal's toy scale. "{model}" is the random model.
SETTINGS: dict[str, dict[str, Any]] = {
    "cogr": {
        "data": "data",
        "sets": ["cogr.generator={model}", "cogr.rounds=1",
                 "cogr.early_stopping.patience=10",  # a random model's flat curve must not skip the item phase
                 "cogr.max_empty_share=1.0",  # it writes no keywords: an empty index must not stop the check
                 "cogr.sft.epochs=1", "cogr.sft.batch_size=16"],
        "gpu": ["cogr.grpo.num_generations=8", "cogr.grpo.batch_size=32", "cogr.grpo.max_prompts_per_phase=32",
                "cogr.grpo.max_completion_length=48", "cogr.sampling.max_new_tokens=48"],
        "dry": ["cogr.grpo.num_generations=2", "cogr.grpo.batch_size=4", "cogr.grpo.max_prompts_per_phase=4",
                "cogr.grpo.max_completion_length=8", "cogr.sampling.max_new_tokens=8", "cogr.max_train_queries=8"],
    },
    "grape": {
        "data": "data",
        "sets": ["grape.generator={model}", "grape.retriever=text", "grape.text_encoder=all-minilm-l6-v2"],
        "gpu": ["grape.grpo.steps=8", "grape.eval_every=4", "grape.grpo.num_generations=8", "grape.grpo.batch_size=32",
                "grape.grpo.max_completion_length=32", "grape.sampling.max_new_tokens=32"],
        "dry": ["grape.grpo.steps=2", "grape.eval_every=2", "grape.grpo.num_generations=2", "grape.grpo.batch_size=4",
                "grape.grpo.max_completion_length=8", "grape.sampling.max_new_tokens=8"],
    },
    "cohyde": {
        "data": "data-stabletoolbench",
        # A random rewriter writes text only after a real warm-up (S3 refuses a round of empty
        # descriptions): full fine-tuning at a high learning rate, as the tiny model's round test does.
        "sets": ["cohyde.generator={model}", "cohyde.encoder=all-minilm-l6-v2", "cohyde.rounds=1",
                 "cohyde.early_stopping.patience=10", "cohyde.lora.enabled=false", "cohyde.warmup.learning_rate=3e-3",
                 "cohyde.warmup.epochs=2", "cohyde.dpo.learning_rate=1e-3"],
        "gpu": ["cohyde.max_train_queries=64", "cohyde.warmup_max_examples=48", "cohyde.num_samples=4",
                "cohyde.max_new_tokens=48"],
        "dry": ["cohyde.max_train_queries=8", "cohyde.warmup_max_examples=48", "cohyde.num_samples=2",
                "cohyde.max_new_tokens=8", "cohyde.encoder_training.batch_size=8", "cohyde.warmup.batch_size=8"],
    },
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--work", type=Path, required=True,
                        help="gpu_check.sh's work folder: the random model (qwen3-0.6b-random/) and the prepared samples")
    parser.add_argument("--dry", action="store_true",
                        help="CPU rehearsal: toy scale (about 3 minutes for the three methods on 2 cores)")
    parser.add_argument("--methods", nargs="+", default=None, help="default: every registered method")
    return parser.parse_args(argv)


def vllm_ready() -> bool:
    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


def check(name: str, work: Path, dry: bool, out) -> str:
    """Run one method's phases, printing its phase lines to ``out``; returns its verdict line (raises on failure)."""
    import torch

    from coevo.config import load_params
    from coevo.methods import spec_of

    spec = spec_of(name)
    if name not in SETTINGS:
        raise ValueError(f"no settings for method {name!r} in bench/gpu_check.py SETTINGS")
    settings = SETTINGS[name]
    model = work / "qwen3-0.6b-random"
    sets = [s.format(model=model) for s in settings["sets"] + settings["dry" if dry else "gpu"]]
    params = load_params(ROOT / "params.yaml", sets)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    vllm = spec.supports_vllm and vllm_ready()
    extra: dict[str, Any] = {"use_vllm": True} if vllm else {}
    if name == "cogr":
        extra["generation_batch_size"] = 16 if dry else 128
    started = time.perf_counter()
    method = spec.load()(work / f"run-{name}", params, work / settings["data"], **extra)

    def on_phase(phase, record):
        print(f"gpu_check: {name} {phase.name} done ({time.perf_counter() - started:.0f}s)", file=out, flush=True)

    rows = method.run(on_phase=on_phase)
    seconds = time.perf_counter() - started
    print(f"{'phase':<12} {'phase s':>8} {spec.headline:>10} {'GRPO steps':>10} {'step s':>8} {'tokens/s':>9}", file=out)
    for row in rows:
        train = row.get("train") or {}
        steps = (f"{train['steps']:>10} {train.get('step_seconds') or 0:>8.3f} {train.get('tokens_per_s') or 0:>9.0f}"
                 if train.get("steps") else f"{'-':>10} {'-':>8} {'-':>9}")
        print(f"{row['name']:<12} {row.get('seconds') or 0:>8.1f} {row['eval'].get(spec.headline, float('nan')):>10.4f} "
              f"{steps}", file=out)
    not_done = [p.name for p in method.phases() if not method.is_done(p.name)]
    if not_done:
        raise RuntimeError(f"phases not done: {', '.join(not_done)}")
    peak = f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MB" if cuda else "n/a (CPU)"
    return (f"gpu_check: {name} ok in {seconds:.0f}s ({len(method.phases())} phases, peak GPU memory {peak}, "
            f"vLLM {'yes' if vllm else 'no'})")


def main(argv: list[str] | None = None) -> int:
    from coevo.cli.terminal import LibraryOutputToLog
    from coevo.methods import SPECS

    args = parse_args(argv)
    failed = []
    log_path = args.work / "gpu_check.log"
    with LibraryOutputToLog(log_path) as term:
        for name in args.methods or list(SPECS):
            started = time.perf_counter()
            print(f"gpu_check: {name}", file=term.out, flush=True)
            try:
                print(check(name, args.work, args.dry, term.out), file=term.out, flush=True)
            except Exception as exc:  # noqa: BLE001 - one method's failure must not hide the others'
                traceback.print_exc(file=term.log)
                failed.append(name)
                print(f"gpu_check: {name} FAILED in {time.perf_counter() - started:.0f}s: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''} (traceback: {log_path})", file=term.out, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
