"""GRPO step time on CPU: TRL defaults vs coevo's settings, next to the raw operations of a step.

For each model (`tiny`, `smollm2-135m`) and each CPU instruction set it prints:

- raw forward+backward of the LoRA model on 8 x 80 tokens,
- raw batched `generate` of 8 sequences x 32 new tokens (2 prompts x 4, as one GRPO step),
- a TRL `GRPOTrainer` step (LoRA r=8 on q/v, 8 completions = 2 prompts x 4, 32 new tokens,
  fp32 model, one thread) with TRL's default settings, and with coevo's (`coevo.train.grpo`),
- generated tokens/s and peak memory (process RSS high-water mark, which includes the
  reference copy used for the raw operations), and last the ratio
  step / (forward+backward + generate): how much a step costs beyond the work it must do.

The machine may be shared: each GRPO configuration runs in a fresh subprocess (clean peak
memory) and, before every training step, measures one raw forward+backward and one raw
generate on a separate fp32 copy of the model, so the ratio compares operations that ran
under the same load.
``--isa avx2`` runs with ONEDNN_MAX_CPU_ISA=AVX2, i.e. as on a CPU without native bf16
instructions (no AVX512-BF16/AMX), the kind of laptop/CI CPU on which TRL's default
``bf16=True`` autocast is emulated and a step takes ~10x its raw cost.

    .venv/bin/python bench/train_step.py                      # both models, native + avx2
    .venv/bin/python bench/train_step.py --models tiny --isa native --steps 2

The last lines are ``coevo_step_vs_raw_<model>_<isa>=<x>``, one per model and ISA: the coevo
step's ratio to its raw forward+backward + generate.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

PROMPT_TOKENS = 80
BATCH = 8
PROMPTS = 2
GROUP = 4
NEW_TOKENS = 32
ISAS = {"native": None, "avx2": "AVX2"}
QUERIES = [
    "what will the weather be like in paris tomorrow afternoon",
    "convert one hundred us dollars to euros at today's rate",
    "find me a cheap flight from boston to tokyo next month",
    "translate this paragraph from english into french please",
]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _load(model_name: str, workdir: Path):
    """(generator with LoRA r=8 q/v, local checkpoint path of the base model for TRL-by-path)."""
    from coevo.config import section
    from coevo.models.generator import Generator
    from coevo.models.registry import TINY, smollm2_checkpoint

    # params.yaml's LoRA section with this benchmark's fixed shape (the models carry no defaults)
    lora = section("cogr.lora", enabled=True, r=8, alpha=16, dropout=0.05, target_modules=["q_proj", "v_proj"])
    generator = Generator.create(model_name, lora, seed=0, corpus=QUERIES)
    if model_name == TINY:
        path = workdir / "tiny-base"
        base = generator.model.get_base_model()
        base.save_pretrained(path)  # LoRA layers are inert here; TRL-by-path reloads a plain model
        generator.tokenizer.save_pretrained(path)
        generator = Generator.create(model_name, lora, seed=0, corpus=QUERIES)
    else:
        path = smollm2_checkpoint()
    return generator, path


def _prompts():
    from coevo.models.prompts import query_messages

    return [{"prompt": query_messages(q)} for q in QUERIES]


def _reward(completions, **_):
    # Cheap, deterministic and varied within a group (so the loss is not all zeros).
    return [float(len(str(c)) % 7) for c in completions]


class _StepTimer:
    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, *args, **kwargs):
                timer.started = time.perf_counter()

            def on_step_end(self, *args, **kwargs):
                timer.times.append(time.perf_counter() - timer.started)

        self.times: list[float] = []
        self.callback = Callback()


def _raw_ops(generator):
    """Closures timing one raw forward+backward (8 x 80 tokens) and one raw generate (2 x 4 x 32)."""
    import torch

    model, tokenizer = generator.model, generator.tokenizer
    ids = torch.randint(3, len(tokenizer), (BATCH, PROMPT_TOKENS))
    texts = [generator.render(p["prompt"]) for p in _prompts()[:PROMPTS]]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    def forward_backward() -> float:
        model.train()
        started = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        seconds = time.perf_counter() - started
        model.zero_grad(set_to_none=True)
        return seconds

    def generate() -> float:
        model.eval()
        started = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                **enc, do_sample=True, num_return_sequences=GROUP, max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id,
            )
        return time.perf_counter() - started

    return forward_backward, generate


def measure(kind: str, model_name: str, steps: int) -> dict:
    """One GRPO configuration: ``steps`` measured steps after a warm-up step, each preceded
    by a raw forward+backward and a raw generate on a separate copy of the model."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from coevo.config import section
    from coevo.train.grpo import grpo_config, wrap_reward

    torch.set_num_threads(1)
    torch.manual_seed(0)
    workdir = Path(tempfile.mkdtemp(prefix="coevo-bench-"))
    generator, base_path = _load(model_name, workdir)
    reference, _ = _load(model_name, workdir / "reference")  # raw ops never touch the trained model
    forward_backward, generate = _raw_ops(reference)
    record: dict[str, list[float]] = {"step": [], "fwdbwd": [], "generate": []}

    class Interleave(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            record["fwdbwd"].append(forward_backward())
            record["generate"].append(generate())
            self.started = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            record["step"].append(time.perf_counter() - self.started)

    common = {
        "per_device_train_batch_size": BATCH,
        "num_generations": GROUP,
        "max_completion_length": NEW_TOKENS,
        "max_steps": steps + 1,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        # Same completion length in every configuration, so step times compare like for like.
        "generation_kwargs": {"min_new_tokens": NEW_TOKENS},
    }
    dataset = Dataset.from_list(_prompts())
    if kind == "grpo_defaults":
        # As a new user would write it: model by path, LoRA through peft_config, TRL defaults.
        config = GRPOConfig(output_dir=str(workdir / "out"), use_cpu=True, **common)
        trainer = GRPOTrainer(
            model=str(base_path),
            reward_funcs=_reward,
            args=config,
            train_dataset=dataset,
            peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
            callbacks=[Interleave()],
        )
    elif kind == "grpo_coevo":
        params = section("cogr.grpo", num_generations=GROUP, batch_size=BATCH, learning_rate=1e-5, beta=0.0,
                         max_completion_length=NEW_TOKENS)
        config = grpo_config(workdir / "out", params, seed=0, **common)
        trainer = GRPOTrainer(
            model=generator.model,
            reward_funcs=wrap_reward(_reward, []),
            args=config,
            train_dataset=dataset,
            processing_class=generator.tokenizer,
            callbacks=[Interleave()],
        )
    else:
        raise ValueError(f"unknown measurement {kind!r}")
    trainer.train()
    shutil.rmtree(workdir, ignore_errors=True)  # checkpoints of the base model, TRL's output folder

    def mean(key: str) -> float:  # the first step pays one-off compilation and warm-up
        return sum(record[key][1:]) / steps

    return {
        "seconds": mean("step"),
        "fwdbwd": mean("fwdbwd"),
        "generate": mean("generate"),
        "tokens_per_s": BATCH * NEW_TOKENS / mean("step"),
        "peak_mb": _peak_mb(),
        "bf16": bool(config.bf16),
        "gradient_checkpointing": bool(config.gradient_checkpointing),
    }


def _run_worker(kind: str, model_name: str, isa: str, steps: int) -> dict:
    from _workers import run_json_worker

    cmd = [sys.executable, __file__, "--worker", kind, "--models", model_name, "--steps", str(steps)]
    return run_json_worker(cmd, isa_cap=ISAS[isa], failure=f"measurement {kind} {model_name} {isa} failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--isa", nargs="+", default=list(ISAS), choices=list(ISAS))
    parser.add_argument("--steps", type=int, default=2, help="measured repetitions (after one warm-up)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker, args.models[0], args.steps)))
        return

    from rich.console import Console
    from rich.table import Table

    table = Table(title="GRPO step on CPU (1 thread, fp32 model; 8 completions x 32 tokens)")
    for column in ("model", "cpu isa", "trainer", "bf16", "grad ckpt", "step s", "gen tok/s", "peak MB",
                   "fwd+bwd s", "generate s", "step / (fwd+bwd + generate)"):
        table.add_column(column, justify="right")
    ratios = {}
    for model_name in args.models:
        for isa in args.isa:
            for kind in ("grpo_defaults", "grpo_coevo"):
                r = _run_worker(kind, model_name, isa, args.steps)
                base = r["fwdbwd"] + r["generate"]
                if kind == "grpo_coevo":
                    ratios[f"{model_name}_{isa}"] = r["seconds"] / base
                table.add_row(
                    model_name, isa, "TRL defaults" if kind == "grpo_defaults" else "coevo",
                    str(r["bf16"]), str(r["gradient_checkpointing"]), f"{r['seconds']:.2f}",
                    f"{r['tokens_per_s']:.1f}", f"{r['peak_mb']:.0f}", f"{r['fwdbwd']:.2f}",
                    f"{r['generate']:.2f}", f"{r['seconds'] / base:.2f}",
                )
                Console().print(f"{model_name} {isa} {kind}: {json.dumps(r)}", highlight=False)
    Console(width=200).print(table)
    for name, ratio in ratios.items():
        print(f"coevo_step_vs_raw_{name}={ratio:.2f}")


if __name__ == "__main__":
    main()
