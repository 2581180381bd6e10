"""CoGR's SFT on CPU: examples/s and trained tokens/s of coevo's settings and of each lever, next to
the raw forward+backward of the same batches.

The examples are CoGR's own SFT targets on the committed MetaTool sample: the seed phase of the
real pipeline (``params/cpu.yaml``: extractive seeds) writes the query and item keyword sets, and
each example is the method's prompt with its keyword completion, as ``CoGR.sft`` builds them. Each
variant is a set of ``--set`` overrides on ``params.yaml + params/cpu.yaml`` (or the ``--params``
overlays) and runs in a fresh subprocess (its own peak memory, its ``ONEDNN_MAX_CPU_ISA``) on one
torch thread:

- ``coevo``: the SFT of ``params/cpu.yaml`` (or of the ``--params`` overlays) as the efficacy runs train it
  (the baseline of every ratio);
- ``group_by_length``: batches of similar length (transformers' ``train_sampling_strategy``), so
  less padding is computed; the examples seen per epoch are the same;
- ``batch_16``: 16 examples per step instead of 8 (half the optimizer steps per epoch);
- any other as ``--variant NAME=KEY=VALUE[,KEY=VALUE...]``.

Per variant: seconds per step (the mean over ``--steps`` steps after one warm-up step), examples/s,
trained (non-pad) tokens/s, the padded share of randomly drawn batches (what ``group_by_length``
can save), peak RSS, and the raw forward+backward of one padded batch of the same examples
(``raw s``: through the LoRA model in the precision training uses, timed before and after
training) with ``step / raw``.
The machine may be shared: compare the ratios of one run, not seconds across runs; ``--repeats N``
runs every variant N times, alternating the order, and takes medians (the ratio's range is printed
beside it).

    .venv/bin/python bench/sft_step.py                          # smollm2-135m, native ISA, 3 variants
    .venv/bin/python bench/sft_step.py --isa native avx2 --steps 8
    .venv/bin/python bench/sft_step.py --steps 8 --repeats 3 --variants \\
        --variant short_pf=cogr.system_prompt=short,cogr.sft.trl.padding_free=true,cogr.sft.trl.max_length=null
    .venv/bin/python bench/sft_step.py --params params/cpu.yaml --params params/cpu_without_sft_levers.yaml
    .venv/bin/python bench/sft_step.py --model tiny --steps 2 --set cogr.lora.top_layers=1   # seconds: the smoke run

The last lines are ``sft_examples_per_s_ratio_<variant>_<isa>=<x>``: the variant's examples/s over
``coevo``'s, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
from _workers import params_argv, params_files  # noqa: E402  (bench/ is on the path when a script runs)

if TYPE_CHECKING:
    from coevo.models.generator import Generator

ISAS = {"native": None, "avx2": "AVX2"}
VARIANTS: dict[str, list[str]] = {
    "coevo": [],
    "group_by_length": ["cogr.sft.trl.train_sampling_strategy=group_by_length"],
    "batch_16": ["cogr.sft.batch_size=16"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="cogr.generator of every variant (tiny: the smoke run)")
    parser.add_argument("--isa", nargs="+", default=["native"], choices=list(ISAS),
                        help="avx2 runs the kernels of a CPU without native bf16 (ONEDNN_MAX_CPU_ISA=AVX2)")
    parser.add_argument("--side", choices=("query", "item"), default="query",
                        help="which generator's SFT examples (CoGR trains both; the query side's are most of them)")
    parser.add_argument("--steps", type=int, default=0,
                        help="measured optimizer steps per variant after one warm-up step; 0: one whole epoch, "
                             "every step counted (what an SFT phase pays, and fair to group_by_length, whose "
                             "sampler puts the longest batch first)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS),
                        help=f"built-in variants besides coevo (none: only --variant ones): {', '.join(VARIANTS)}")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE...]",
                        help="another variant: --set overrides on params.yaml + the --params overlays")
    parser.add_argument("--params", type=Path, action="append", default=None,
                        help="params overlays on params.yaml, coevo's baseline included (default: params/cpu.yaml); "
                             "repeatable")
    parser.add_argument("--set", dest="common", action="append", default=[], metavar="KEY=VALUE",
                        help="an override of every variant, coevo's baseline included (e.g. cogr.lora.top_layers=1 "
                             "for the 2-layer tiny model)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of every variant, each round in the reverse order of the last; a variant's row is "
                             "its median round and its ratio the median of its per-round ratios to coevo's (a shared "
                             "machine drifts between measurements)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--overrides", default="[]", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 0:
        parser.error("--steps must be 0 (one epoch) or more")
    if args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    return args


# ------------------------------------------------------------------------------------ worker
def sft_examples(project: Path, files: list[Path], model: str, overrides: list[str],
                 side: str) -> tuple[Any, list[dict[str, Any]]]:
    """(the CoGR run, its SFT examples of one side) from the real seed phase on the committed sample."""
    from coevo.config import load_params
    from coevo.models.prompts import keyword_completion
    from coevo.orchestration.pipeline import Pipeline

    shutil.copytree(ROOT / "data" / "sample" / "metatool", project / "source")
    os.chdir(project)
    params = load_params(files,
                         ["data.dataset=sft_bench", "data.loader=metatool", f"data.source={project / 'source'}",
                          f"cogr.generator={model}", *overrides])
    pipe = Pipeline("cogr", params)
    pipe.prepare().run()
    pipe.validate().run()
    method = pipe.method
    method.run_phase("seed")
    item_sets, query_sets = method.seed_targets()
    if side == "query":  # as CoGR.sft: the train queries that have seed keywords
        targets = {q: k for q, k in query_sets.items() if k and q in method.train_qrels}
        prompts = method._query_prompts(list(targets))
    else:
        targets = item_sets
        prompts = method._item_prompts(list(targets))
    examples = [{"prompt": p, "completion": keyword_completion(k)} for p, k in zip(prompts, targets.values())]
    return method, examples


def token_lengths(generator: Generator, examples: list[dict[str, Any]]) -> list[int]:
    """Tokens of each example as SFT sees it: the chat-templated prompt and completion."""
    tokenizer = generator.tokenizer
    return [len(tokenizer(tokenizer.apply_chat_template(e["prompt"] + e["completion"], tokenize=False),
                          add_special_tokens=False)["input_ids"]) for e in examples]


def pad_share(lengths: list[int], batch_size: int, seed: int = 0) -> float:
    """The share of padding in batches drawn at random (a seeded shuffle), as the default sampler draws them."""
    import random

    order = list(lengths)
    random.Random(seed).shuffle(order)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    return 1.0 - sum(map(sum, batches)) / sum(len(b) * max(b) for b in batches)


def raw_forward_backward(generator: Generator, examples: list[dict[str, Any]], batch_size: int, accumulate: int = 1) -> float:
    """Seconds of the raw forward+backward of one optimizer step's examples, as padded batches of
    ``batch_size`` (``accumulate`` of them under gradient accumulation), in the precision training uses
    (bf16 autocast where the trainer would use it)."""
    if accumulate > 1:
        return sum(raw_forward_backward(generator, examples[i * batch_size:], batch_size) for i in range(accumulate))
    import torch

    from coevo.train.common import trainer_device_args

    texts = [generator.tokenizer.apply_chat_template(e["prompt"] + e["completion"], tokenize=False)
             for e in examples[:batch_size]]
    batch = generator.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    model = generator.model
    model.train()
    bf16 = bool(trainer_device_args(0).get("bf16"))
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    return seconds


def measure(files: list[Path], model: str, overrides: list[str], side: str, steps: int) -> dict[str, Any]:
    import torch

    from coevo import progress
    from coevo.train.sft import train_sft

    torch.set_num_threads(1)
    workdir = Path(tempfile.mkdtemp(prefix="coevo-sft-bench-"))
    try:
        run, examples = sft_examples(workdir / "project", files, model, overrides, side)
        sft, seed = run.cfg.sft, run.seed
        generator = run._new_generator(run.cfg.generator)  # as CoGR.sft creates it: LoRA of params
        lengths = token_lengths(generator, examples)
        # examples per optimizer step: a micro-batch times TRL's gradient accumulation
        accumulate = int(sft.trl.get("gradient_accumulation_steps", 1))
        per_step = sft.batch_size * accumulate
        raw_before = raw_forward_backward(generator, examples, sft.batch_size, accumulate)

        logged: list[dict[str, float]] = []

        class Steps(progress.StepListener):
            def training_log(self, series: str, step: int, values: dict[str, float]) -> None:
                logged.append(values)

        epoch = math.ceil(len(examples) / per_step)
        with progress.listening(Steps()):
            train_sft(generator, examples, sft, workdir / "out", seed, max_steps=steps + 1 if steps else epoch,
                      what="SFT bench")
        raw_after = raw_forward_backward(generator, examples, sft.batch_size, accumulate)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    measured = logged if not steps else logged[1:]  # an epoch counts every step; a window skips the warm-up
    seconds = sum(v["step_seconds"] for v in measured)
    # TRL logs the trained (non-pad) tokens so far: the window's own tokens, whatever batches it drew
    tokens = measured[-1]["num_tokens"] - (logged[0]["num_tokens"] if steps else 0)
    raw = (raw_before + raw_after) / 2
    examples_seen = len(examples) if not steps else per_step * len(measured)
    return {"examples": len(examples), "batch_size": sft.batch_size, "accumulate": accumulate, "steps": len(measured),
            "step_s": seconds / len(measured), "examples_per_s": examples_seen / seconds, "tokens_per_s": tokens / seconds,
            "mean_tokens": statistics.mean(lengths), "pad_share": pad_share(lengths, sft.batch_size),
            "raw_s": raw, "step_vs_raw": seconds / len(measured) / raw,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def run_worker(name: str, overrides: list[str], args: argparse.Namespace, isa: str) -> dict[str, Any]:
    from _workers import run_json_worker

    cmd = [sys.executable, __file__, "--worker", name, "--model", args.model, "--side", args.side,
           "--steps", str(args.steps), "--overrides", json.dumps([*args.common, *overrides]),
           *params_argv(args.params)]
    return run_json_worker(cmd, isa_cap=ISAS[isa], failure=f"sft_step: variant {name} on {isa} failed")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(measure(params_files(args.params), args.model, json.loads(args.overrides), args.side,
                                 args.steps)))
        return 0
    from _workers import parse_variants

    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"sft_step: unknown variant(s) {', '.join(unknown)}; built in: {', '.join(VARIANTS)} "
                         f"(others: --variant NAME=KEY=VALUE)")
    variants = {"coevo": [], **{v: VARIANTS[v] for v in args.variants}, **parse_variants(args.variant, "sft_step")}
    from coevo.config import load_params

    for name, overrides in variants.items():  # a bad knob fails here, in one line, before any work
        try:
            load_params(params_files(args.params), [*args.common, *overrides])
        except ValueError as exc:
            raise SystemExit(f"sft_step: variant {name}: {exc}") from None

    from rich.console import Console
    from rich.table import Table

    window = f"{args.steps} steps after a warm-up" if args.steps else "one epoch"
    if args.repeats > 1:
        window += f"; median of {args.repeats} rounds"
    table = Table(title=f"CoGR SFT on CPU ({args.model}, {args.side} side, 1 thread; {window})")
    for column in ("variant", "cpu isa", "batch", "step s", "examples/s", "tokens/s", "pad share", "raw s", "step / raw",
                   "peak MB", "examples/s vs coevo"):
        table.add_column(column, justify="right")
    ratios: dict[str, float] = {}
    for isa in args.isa:
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for round_number in range(args.repeats):
            order = list(variants) if round_number % 2 == 0 else list(reversed(variants))
            for name in order:
                r = run_worker(name, variants[name], args, isa)
                rounds[name].append(r)
                Console(stderr=True).print(f"{name} {isa} round {round_number + 1}: {json.dumps(r)}", highlight=False)
        for name in variants:
            runs = rounds[name]
            r = sorted(runs, key=lambda run: run["step_s"])[len(runs) // 2]  # the median round (upper for even counts)
            per_round = [run["examples_per_s"] / base["examples_per_s"] for run, base in zip(runs, rounds["coevo"])]
            ratio = statistics.median(per_round)
            if name != "coevo":
                ratios[f"{name}_{isa}"] = ratio
            spread = f" ({min(per_round):.2f}-{max(per_round):.2f})" if len(runs) > 1 and name != "coevo" else ""
            batch = f"{r['batch_size']}x{r['accumulate']}" if r["accumulate"] > 1 else str(r["batch_size"])
            table.add_row(name, isa, batch, f"{r['step_s']:.2f}", f"{r['examples_per_s']:.2f}", f"{r['tokens_per_s']:.0f}",
                          f"{r['pad_share']:.2f}", f"{r['raw_s']:.2f}", f"{r['step_vs_raw']:.2f}",
                          f"{r['peak_mb']:.0f}", f"{ratio:.2f}{spread}")
    Console(width=160).print(table)
    for name, ratio in ratios.items():
        print(f"sft_examples_per_s_ratio_{name}={ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
