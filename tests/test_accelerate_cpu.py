"""Several processes for training: the accelerate configs load, and on CPU two processes (gloo)
train the `tiny` generator through one SFT and one GRPO phase with coevo's TRL wrappers: the SFT
loss falls, and rank 0 writes the same checkpoint and metrics files as a one-process run (the
values may differ).

How two CPU processes are launched: with accelerate 1.15, `accelerate launch --cpu
--num_processes 2` starts ONE process unless MPI is set up (`--mpirun_hostfile`); without MPI,
`CUDA_VISIBLE_DEVICES= accelerate launch --multi_gpu --num_processes 2` starts two through
torch.distributed.run and accelerate picks MULTI_CPU with the gloo backend (checked below).

Run as a script by the test (under `accelerate launch`): ``python tests/test_accelerate_cpu.py OUT``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "configs" / "accelerate"
ITEMS = {f"t{i}": (f"Tool {i} {w}", f"{w} search, {w} lookup and {w} help.", [w, f"{w} search", f"tool {i}"])
         for i, w in enumerate(["weather", "flights", "translate", "currency", "recipes", "music", "maps", "news"])}
OVERRIDES = [
    "cogr.generator=tiny", "cogr.lora.enabled=false", "cogr.max_empty_share=1.0",
    "cogr.sft.epochs=3", "cogr.sft.batch_size=4", "cogr.sft.learning_rate=5e-3",
    "cogr.grpo.num_generations=2", "cogr.grpo.batch_size=4", "cogr.grpo.learning_rate=1e-3",
    "cogr.grpo.max_completion_length=8",
]


def test_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    kinds = {name: load_config_from_file(str(CONFIGS / f"{name}.yaml")) for name in
             ("one_gpu", "multi_gpu_ddp", "deepspeed_zero2")}
    assert kinds["one_gpu"].num_processes == 1
    assert kinds["multi_gpu_ddp"].distributed_type.value == "MULTI_GPU"
    assert kinds["deepspeed_zero2"].deepspeed_config["zero_stage"] == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(processes: int, out: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1", "COEVO_CPU_BF16": "0", "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    mode = ["--multi_gpu"] if processes > 1 else ["--cpu"]  # see the module docstring
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *mode, "--num_processes", str(processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), str(Path(__file__).resolve()), str(out)]
    done = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return json.loads((out / "metrics.json").read_text())


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.full  # full tier: two gloo ranks train SFT and GRPO through `coevo train` in the test below
def test_two_cpu_processes_train_sft_and_grpo_like_one(tmp_path):
    two = _launch(2, tmp_path / "two")
    one = _launch(1, tmp_path / "one")
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["ranks_that_wrote"] == [0]
    assert (two["distributed_type"], two["backend"]) == ("MULTI_CPU", "gloo")
    for run in (one, two):
        assert run["sft_loss_after"] < run["sft_loss_before"], run  # the SFT loss falls
        assert run["grpo"]["steps"] >= 1
    assert _files(tmp_path / "two") == _files(tmp_path / "one")  # same checkpoint and metrics files
    assert set(two) == set(one) and set(two["grpo"]) == set(one["grpo"])


def _launch_cli(processes: int, params: Path, data: Path, out: Path) -> subprocess.CompletedProcess:
    """The README's launch path: the `coevo` console script is the training script."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COEVO_CPU_BF16": "0", "CUDA_VISIBLE_DEVICES": ""}
    mode = ["--multi_gpu"] if processes > 1 else ["--cpu"]  # see the module docstring
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *mode, "--num_processes", str(processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), str(Path(sys.executable).with_name("coevo")),
           "train", "cogr", "-p", str(params), "--data", str(data), "--out", str(out), "-q",
           "--set", "cogr.sft.batch_size=4", "--set", "cogr.grpo.batch_size=2"]
    done = subprocess.run(cmd, env=env, cwd=out.parent, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


@pytest.mark.slow
def test_coevo_train_under_two_processes_writes_once_like_one_process(tmp_path):
    """`accelerate launch ... coevo train cogr` with 2 gloo ranks: every rank runs the phase chain,
    rank 0 alone writes the run folder (coevo.distributed), and the folder holds the same files
    as a one-process run; the ranks really split the data (half the SFT steps)."""
    from conftest import make_toy_metatool, toy_params
    from coevo.data.loaders import load_source
    from coevo.io import read_json

    source = make_toy_metatool(tmp_path / "toy")
    data = tmp_path / "data"
    load_source("metatool", str(source), seed=42, val_fraction=0.2, test_fraction=0.2, name="toy").save(data)
    params = toy_params(tmp_path / "params.yaml")
    two = _launch_cli(2, params, data, tmp_path / "two")
    one = _launch_cli(1, params, data, tmp_path / "one")
    assert two.stdout.count("on the val split") == 1, two.stdout  # rank 0 alone prints the table
    files = _files(tmp_path / "one")
    assert _files(tmp_path / "two") == files
    assert not [f for f in files if f.endswith(".tmp") or ".old" in f], files  # no rank left scratch behind
    for name in ("seed", "00_sft", "01_query", "02_item"):
        stamps = {run: read_json(tmp_path / run / "stamps" / f"{name}.json") for run in ("one", "two")}
        assert {s["state"] for s in stamps.values()} == {"done"}
        assert stamps["one"]["key"] == stamps["two"]["key"]  # same params, data and code
    sft = {run: read_json(tmp_path / run / "phases" / "00_sft" / "metrics.json")["train"] for run in ("one", "two")}
    steps = {run: sft[run]["query_steps"] + sft[run]["item_steps"] for run in sft}
    assert steps["two"] < steps["one"], sft  # each rank trained on its half of the examples


# ------------------------------------------------------------------------ the launched script
def _completion_loss(generator, examples) -> float:
    """Mean cross-entropy of the completions given their prompts (what SFT minimises)."""
    import torch

    tok, model = generator.tokenizer, generator.model
    losses = []
    model.eval()
    with torch.no_grad():
        for row in examples:
            prompt = generator.render(row["prompt"])
            completion = row["completion"][0]["content"] + tok.eos_token
            p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
            c_ids = tok(completion, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([p_ids + c_ids])
            labels = torch.tensor([[-100] * len(p_ids) + c_ids])
            losses.append(float(model(input_ids=ids, labels=labels).loss))
    return sum(losses) / len(losses)


def main(out: Path) -> None:
    from accelerate import PartialState

    from coevo.config import load_params
    from coevo.io import write_json
    from coevo.models.generator import Generator, seeded
    from coevo.models.prompts import item_messages, keyword_completion
    from coevo.train.grpo import train_grpo
    from coevo.train.sft import train_sft

    state = PartialState()  # gloo on CPU under `accelerate launch --cpu`
    params = load_params(REPO_ROOT / "params.yaml", OVERRIDES)
    cfg, seed = params.cogr, params.seed
    corpus = [f"{t} {d}" for t, d, _ in ITEMS.values()]
    with seeded(seed):  # every rank builds the same model
        generator = Generator.create("tiny", cfg.lora, seed=seed, corpus=corpus)
    examples = [{"prompt": item_messages(t, d), "completion": keyword_completion(k)} for t, d, k in ITEMS.values()]
    before = _completion_loss(generator, examples)
    sft = train_sft(generator, examples, cfg.sft, out / "scratch" / "sft", seed)
    after = _completion_loss(generator, examples)

    def length_reward(completions: list[str], item_id: list[str]) -> list[float]:  # noqa: ARG001
        return [-abs(len(c) - 12) / 12 for c in completions]

    rows = [{"prompt": item_messages(t, d), "item_id": i} for i, (t, d, _) in ITEMS.items()]
    grpo = train_grpo(generator, rows, length_reward, cfg.grpo, out / "scratch" / "grpo", seed,
                      temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p)
    state.wait_for_everyone()
    if state.is_main_process:  # removals are rank 0's
        import shutil

        shutil.rmtree(out / "scratch", ignore_errors=True)
    # Every rank saves, as coevo's phases do: rank 0's files land, the others' copies are dropped
    # (coevo.distributed), so "ranks_that_wrote" can only read [0].
    generator.save(out / "generator")
    write_json(out / "metrics.json", {"world_size": state.num_processes, "ranks_that_wrote": [state.process_index],
                                      "distributed_type": str(state.distributed_type.value),
                                      "backend": state.backend,
                                      "sft_loss_before": before, "sft_loss_after": after,
                                      "sft": sft, "grpo": grpo})


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    main(Path(sys.argv[1]))
