"""Every script in bench/ runs at a tiny scale and prints its last line in its documented format.

Benchmarks are scripts, not tests (README, "Benchmarks"), so nothing else imports them, and a
change of a library signature or a knob name breaks them silently. Each test here runs one
script as a user would (a subprocess from the project root, its real code path) with the
smallest arguments that still go through every stage: the `tiny` random generator, the
committed sample under data/sample/, a handful of items, queries and steps, one torch thread.
The figures mean nothing at this scale; the test checks the exit status and the exact format
of the script's last line (and, where the script reports one, its own correctness check).

`test_every_bench_script_has_a_smoke_run` fails when a script is added to bench/ without one.
Smoke runs marked ``full`` run in `make test-all` only (their paths are covered by the CI tier's own
tests); `test_every_bench_script_imports` loads every script in CI, so an import they lose fails there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, SAMPLE_DIR

BENCH = REPO_ROOT / "bench"
FLOAT = r"[-+]?\d+\.\d+"
# bench script -> the test below that runs it
SMOKED = {
    "rewards.py": "test_rewards",
    "rank_reward.py": "test_rank_reward",
    "cohyde_round.py": "test_cohyde_round",
    "cohyde_vague_val.py": "test_cohyde_vague_val",
    "train_step.py": "test_train_step",
    "sft_step.py": "test_sft_step",
    "sft_learning.py": "test_sft_learning",
    "scale_out.py": "test_scale_out",
    "serve.py": "test_serve",
    "pipeline_overhead.py": "test_pipeline_overhead",
    "staleness_table.py": "test_staleness_table",
    "mlflow_screenshot.py": "test_mlflow_screenshot",
    "demo_quote.py": "test_demo_quote",
    "gpu_check.sh": "test_gpu_check_dry_run",
    "gpu_check.py": "test_gpu_check_dry_run",
    "efficacy.py": "test_efficacy",
    "variants.py": "test_efficacy",
    "seeds.py": "test_efficacy",
}


def run_bench(command: list[str], *, timeout: float, env: dict[str, str] | None = None) -> list[str]:
    """Run ``command`` from the project root on one thread; its non-empty stdout lines."""
    full_env = {
        **os.environ,
        "COEVO_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **(env or {}),
    }
    result = subprocess.run(command, cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (f"{' '.join(command)} exited {result.returncode}\n--- stdout\n"
                                    f"{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-8000:]}")
    lines = [line.rstrip() for line in result.stdout.splitlines() if line.strip()]
    assert lines, f"{' '.join(command)} printed nothing on stdout\n--- stderr\n{result.stderr[-4000:]}"
    return lines


def script(name: str, *args: str) -> list[str]:
    return [sys.executable, str(BENCH / name), *args]


def last_line(lines: list[str], pattern: str) -> re.Match:
    match = re.fullmatch(pattern, lines[-1])
    assert match, f"last line {lines[-1]!r} does not match {pattern!r}; output ended:\n" + "\n".join(lines[-15:])
    return match


def test_every_bench_script_has_a_smoke_run():
    scripts = {p.name for p in BENCH.iterdir()  # a leading underscore marks a module the scripts share
               if p.is_file() and p.suffix in (".py", ".sh") and not p.name.startswith("_")}
    assert scripts == set(SMOKED), f"bench/ scripts without a smoke run here: {sorted(scripts - set(SMOKED))}; " \
                                   f"smoke runs of scripts that are gone: {sorted(set(SMOKED) - scripts)}"
    missing = [test for test in SMOKED.values() if test not in globals()]
    assert not missing, missing


def test_every_bench_script_imports(monkeypatch):
    """Each script's module loads against the library as it is (a moved or renamed import fails here, in
    seconds, also for the scripts whose smoke run is in the full tier only); nothing runs: main() is not called."""
    monkeypatch.syspath_prepend(str(BENCH))  # as `python bench/x.py` has it: bench/_workers.py importable
    for path in sorted(BENCH.glob("[!_]*.py")):
        spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert callable(getattr(module, "main", None)), f"{path.name} has no main()"


# ------------------------------------------------------------------ synthetic, seconds
def test_rewards():
    lines = run_bench(script("rewards.py", "--items", "300", "--queries", "100", "--rel-per-query", "5",
                             "--vocab", "500", "--group-size", "4", "--groups-per-batch", "8", "--item-rewards", "64",
                             "--naive-rewards", "2", "--query-rewards", "64"), timeout=300)
    bad = [line for line in lines if not re.fullmatch(rf"\w+=(?:{FLOAT}|\d+|{FLOAT}e[-+]\d+)", line)]
    assert not bad, f"not `name=value`: {bad}"  # "One figure per line, `name=value`"
    figures = dict(line.split("=", 1) for line in lines)
    assert float(figures["max_abs_diff_incremental_vs_naive"]) < 1e-9  # incremental == naive reward
    last_line(lines, r"speedup_vs_naive=\d+")


def test_rank_reward():
    lines = run_bench(script("rank_reward.py", "--queries", "8", "--sizes", "500", "2000", "--dim", "16",
                             "--repeats", "1"), timeout=300)
    assert sum(line.startswith("N=") for line in lines) == 2
    last_line(lines, r"ratio \(full sort time / exact_ranks time\): N=500: x\d+\.\d, N=2,000: x\d+\.\d")


# ------------------------------------------------------------------ tiny models
@pytest.mark.slow
@pytest.mark.full  # full tier: the round's sub-phases train in test_cohyde_train and test_flows_cohyde
def test_cohyde_round(tmp_path):
    from tests.test_cohyde_train import _small_stabletoolbench

    dataset = _small_stabletoolbench(tmp_path)
    lines = run_bench(script("cohyde_round.py", "--dataset", str(dataset), "--generators", "tiny", "--queries", "4",
                             "--max-new-tokens", "8", "--warmup-examples", "4", "--search-items", "200",
                             "--search-queries", "20", "--repeats", "1"), timeout=600)
    stages = [line.split(None, 1)[1].rsplit(None, 5)[0].strip() for line in lines if line.startswith("tiny ")]
    for stage in ("S2 generate", "S3 encoder + index", "S4 sample + score", "DPO"):  # the round's sub-phases
        assert stage in stages, (stage, stages)
    assert re.search(r"^\s+200\s+20\s+384\s+5\s.*x\s+1\.000$", "\n".join(lines), re.M)  # faiss == numpy top-1
    last_line(lines, rf"faiss_vs_numpy={FLOAT}")


@pytest.mark.slow
@pytest.mark.full  # full tier: the CoHyDE round it builds is test_cohyde_train's and test_flows_cohyde's
def test_cohyde_vague_val(tmp_path, monkeypatch):
    """A tiny CoHyDE round in a project folder: rows for val and its vague copies, the standard s1a and round
    rows equal to the run's own val evaluations (the script searches as the method does), the oracle row and
    the named-tool share present for both kinds of query."""
    from coevo.layout import Layout, write_run_params
    from coevo.methods.cohyde import S1A, CoHyDE
    from tests.test_cohyde_train import TINY_ROUND, _params, _small_stabletoolbench

    dataset = _small_stabletoolbench(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)  # data.root is relative to the project folder
    params = _params(*TINY_ROUND, "data.dataset=tiny")
    layout = Layout.of(params, "cohyde")
    shutil.copytree(dataset, layout.processed)
    run = CoHyDE(layout.run_dir, params, layout.processed)
    run.run()
    write_run_params(layout.run_dir, params)

    def files_of(folder: Path) -> dict[str, int]:
        return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}

    before = files_of(project)
    lines = run_bench(script("cohyde_vague_val.py", str(project), "--round", "round_1", "--samples", "2",
                             "--weights", "0.5", "--json", str(tmp_path / "rows.json")), timeout=600)
    match = last_line(lines, rf"cohyde_vague_named=({FLOAT}) round_minus_s1a=({FLOAT}) oracle_minus_s1a=({FLOAT})")
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    table = {(r["queries"], r["row"]): r for r in rows}
    names = ("s1a", "round, query alone", "round", "mix w=0.5", "hyde mean", "oracle", "greedy names a right tool")
    assert set(table) == {(kind, name) for kind in ("standard", "vague") for name in names}
    val = run.evaluate  # stored val evaluations of the run
    assert table["standard", "s1a"]["ndcg@5"] == pytest.approx(val(S1A)["splits"]["val"]["overall"]["ndcg@5"], abs=1e-9)
    assert table["standard", "round"]["ndcg@5"] == pytest.approx(val("round_1")["splits"]["val"]["overall"]["ndcg@5"],
                                                                  abs=1e-9)
    assert table["standard", "s1a"]["n"] == 6 and 1 <= table["vague", "s1a"]["n"] <= 6
    vague = table["vague", "round"]
    assert vague["ci_low"] <= vague["minus_s1a"] <= vague["ci_high"]
    assert float(match.group(2)) == pytest.approx(vague["minus_s1a"], abs=1e-4)
    assert float(match.group(1)) == pytest.approx(table["vague", "greedy names a right tool"]["share"], abs=1e-3)
    for kind in ("standard", "vague"):
        assert 0.0 <= table[kind, "oracle"]["ndcg@5"] <= 1.0
    assert files_of(project) == before  # nothing in the project was written, the run's scratch included


@pytest.mark.slow
def test_train_step(tmp_path):
    lines = run_bench(script("train_step.py", "--models", "tiny", "--isa", "native", "--steps", "1"), timeout=600,
                      env={"TMPDIR": str(tmp_path)})
    last_line(lines, rf"coevo_step_vs_raw_tiny_native={FLOAT}")


@pytest.mark.slow
@pytest.mark.full  # full tier: its SFT variants train in test_train_wrappers and test_config
def test_sft_step(tmp_path):
    """CoGR's SFT examples from the real seed phase, one step of each variant, ratios against coevo's."""
    lines = run_bench(script("sft_step.py", "--model", "tiny", "--set", "cogr.lora.top_layers=1", "--steps", "1",
                             "--variants", "group_by_length",
                             "--variant", "micro=cogr.sft.batch_size=2,cogr.sft.trl.gradient_accumulation_steps=4",
                             "--variant", "pf=cogr.sft.trl.padding_free=true,cogr.sft.trl.max_length=null",
                             "--repeats", "2"), timeout=900, env={"TMPDIR": str(tmp_path)})
    assert re.fullmatch(rf"sft_examples_per_s_ratio_group_by_length_native={FLOAT}", lines[-3]), lines[-3]
    assert re.fullmatch(rf"sft_examples_per_s_ratio_micro_native={FLOAT}", lines[-2]), lines[-2]
    last_line(lines, rf"sft_examples_per_s_ratio_pf_native={FLOAT}")
    # two rounds: the table says so and gives each ratio's range over the rounds
    assert any("median of 2 rounds" in line for line in lines)
    assert re.search(rf" pf .*{FLOAT} \({FLOAT}-{FLOAT}\)", next(line for line in lines if " pf " in line))
    # a step under gradient accumulation holds micro-batch x accumulation examples (8, as coevo's batch of 8)
    assert re.search(r"micro .*native .*2x4 ", next(line for line in lines if " micro " in line))
    bad = subprocess.run(script("sft_step.py", "--model", "tiny", "--variant", "typo=cogr.sft.learning_rat=1"),
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("sft_step: variant typo: ")


@pytest.mark.slow
@pytest.mark.full  # full tier: Ray's corpus passes equal the local ones in test_compute_ray
def test_scale_out():  # no TMPDIR here: Ray's socket paths under pytest's tmp_path exceed 107 bytes
    lines = run_bench(script("scale_out.py", "--model", "tiny", "--items", "4", "--embed-items", "8",
                             "--max-new-tokens", "4", "--batch-size", "4", "--index-items", "200",
                             "--queries", "100"), timeout=600)
    ray_rows = [line.split() for line in lines if re.match(r"(generate|embed)\s+ray_[12]w\s", line)]
    assert len(ray_rows) == 4 and all(row[-1] == "True" for row in ray_rows), ray_rows  # Ray == local outputs
    last_line(lines, rf"ray_2w_vs_local={FLOAT}")


@pytest.mark.slow
def test_serve(tmp_path):
    lines = run_bench(script("serve.py", "--requests", "2", "--methods", "cogr", "--generators", "tiny",
                             "--tools", "4", "--queries-per-tool", "4", "--workdir", str(tmp_path / "work")),
                      timeout=600)
    assert any(line.startswith('{"generator": "tiny", "method": "cogr"') for line in lines)
    last_line(lines, rf"serve_overhead_ratio={FLOAT}   \(cogr with tiny; the target is for cogr with smollm2-135m\)")


def test_serve_settings_are_valid_knobs():
    """The other methods' serve settings (their serve runs take a minute each) still load."""
    from coevo.config import load_params

    spec = importlib.util.spec_from_file_location("serve_bench", BENCH / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.SETTINGS) == {"cogr", "grape", "cohyde"}
    for method, settings in module.SETTINGS.items():
        load_params(REPO_ROOT / "params.yaml", ["seed=0", f"{method}.generator=tiny", *settings])


@pytest.mark.slow
@pytest.mark.full  # full tier: its three toy runs are the flow tests' (test_flows_*)
def test_gpu_check_dry_run(tmp_path):
    work = tmp_path / "gpu-check"
    lines = run_bench(["bash", str(BENCH / "gpu_check.sh")], timeout=600,
                      env={"GPU_CHECK_DRY": "1", "PYTHON": sys.executable, "WORK": str(work)})
    assert lines[0] == "gpu_check: dry run on CPU (toy shape; numbers mean nothing)"
    phases = [line.split()[0] for line in lines if re.match(r"0\d_(sft|query|item)\s", line)]
    assert phases == ["00_sft", "01_query", "02_item"]
    verdicts = [line for line in lines if re.fullmatch(r"gpu_check: \w+ (ok|FAILED) in \d+s.*", line)]
    assert [v.split()[1:3] for v in verdicts] == [["cogr", "ok"], ["grape", "ok"], ["cohyde", "ok"]], verdicts
    assert not [line for line in lines if "it/s]" in line], "library progress bars reached the terminal"
    last_line(lines, rf"gpu_check: done in \d+s; work files in {re.escape(str(work))}")


# ------------------------------------------------------------------ whole pipelines (tiny CoGR flow)
@pytest.mark.slow
@pytest.mark.java
@pytest.mark.full  # full tier: the cached re-run and dvc repro it times are test_flows_cogr's and test_dvc's
def test_pipeline_overhead(tmp_path):
    lines = run_bench(script("pipeline_overhead.py", "--queries", "4", "--rounds", "0"), timeout=900,
                      env={"TMPDIR": str(tmp_path)})
    forced = next(line for line in lines if line.startswith("forced_flow_rerun_s="))
    assert re.search(r"tasks executed/cached: 0/\d+\)$", forced), forced  # a forced re-run only hits the cache
    last_line(lines, rf"cached_rerun_ratio={FLOAT}   \(target <= 0\.10\)")


@pytest.mark.slow
@pytest.mark.java
@pytest.mark.full  # full tier: what each change re-runs is test_flows_cogr's and test_pipeline's
def test_staleness_table(tmp_path):
    lines = run_bench(script("staleness_table.py", "--change", "final split"), timeout=900,
                      env={"TMPDIR": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect-home")})
    rows = [line for line in lines if line.startswith("| final split")]
    assert len(rows) == 1 and rows[0].endswith("| yes |") and "final evaluation (val)" in rows[0], rows
    last_line(lines, r"identical=True")


@pytest.mark.slow
@pytest.mark.full  # full tier: SFT learning is test_train_wrappers' test_sft_learns_the_targets
def test_sft_learning(tmp_path):
    """Seeds and SFT of the real pipeline per variant and cap; a second invocation adds to the report."""
    common = ["--data", str(SAMPLE_DIR / "metatool"), "--queries", "0", "--out", str(tmp_path / "out"),
              "--set", "cogr.generator=tiny", "--set", "cogr.seed_generator=null", "--set", "cogr.max_empty_share=1.0",
              "--set", "cogr.lora.top_layers=2",  # the tiny model's 2 layers (params/cpu.yaml: the top 10)
              "--variant", "levers=cogr.system_prompt=short,cogr.lora.top_layers=1"]
    run_bench(script("sft_learning.py", *common, "--caps", "3", "--only", "levers"), timeout=600)
    lines = run_bench(script("sft_learning.py", *common, "--caps", "3", "6", "--only", "coevo"), timeout=600)
    assert re.fullmatch(rf"sft_val_f1_per_min_coevo={FLOAT}", lines[-3]), lines[-3]
    assert re.fullmatch(rf"sft_val_f1_per_min_levers={FLOAT}", lines[-2]), lines[-2]
    last_line(lines, rf"sft_learning_best=(coevo|levers)@[36] val_f1={FLOAT} sft_min={FLOAT}")
    record = json.loads((tmp_path / "out" / "sft_learning.json").read_text())
    # queries seen = the capped SFT queries x params/cpu.yaml's 2 epochs; every item is an item-side example
    assert sorted((r["variant"], r["cap"], r["queries_seen"], r["item_examples"]) for r in record["rows"]) == [
        ("coevo", 3, 6, 40), ("coevo", 6, 12, 40), ("levers", 3, 6, 40)]
    assert (tmp_path / "out" / "sft_learning.png").is_file()
    by_point = {(r["variant"], r["cap"]): r for r in record["rows"]}  # paired with coevo@6 over the val queries
    assert by_point["coevo", 6]["val_f1_minus_reference"] == "reference"
    assert re.fullmatch(rf"{FLOAT} \[{FLOAT}, {FLOAT}\] p=\S+ \(n=\d+\)", by_point["levers", 3]["val_f1_minus_reference"])
    assert len(by_point["levers", 3]["val_f1_per_query"]) == int(by_point["levers", 3]["val_f1_minus_reference"]
                                                                 .rsplit("n=", 1)[1].rstrip(")"))
    stamp = tmp_path / "out" / "levers-q3" / "data" / "models" / "cogr" / "sft_learning" / "stamps" / "00_sft.json"
    assert json.loads(stamp.read_text())["state"] == "done"
    # A reused point keeps its figures and the peak memory of the process that trained it.
    run_bench(script("sft_learning.py", *common, "--caps", "3", "--only", "levers"), timeout=600)
    again = {(r["variant"], r["cap"]): r for r in json.loads((tmp_path / "out" / "sft_learning.json").read_text())["rows"]}
    assert again["levers", 3]["peak_mb"] == by_point["levers", 3]["peak_mb"] > 100
    assert again["levers", 3]["val_f1_per_query"] == by_point["levers", 3]["val_f1_per_query"]
    other = subprocess.run(script("sft_learning.py", *common[:-2], "--variant", "levers=cogr.lora.top_layers=2"),
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert other.returncode != 0 and "variant levers in" in other.stderr.strip().splitlines()[-1]
    # points measured on other params overlays do not join the report
    overlays = subprocess.run(script("sft_learning.py", *common, "--params", "params/cpu.yaml",
                                     "--params", "params/cpu_without_sft_levers.yaml"),
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert overlays.returncode != 0 and "--params" in overlays.stderr.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.java
def test_efficacy(tmp_path):
    """CoGR's efficacy run on 80 sample queries: seeds, SFT and one round of 2 GRPO steps a side."""
    lines = run_bench(script("efficacy.py", "--method", "cogr", "--data", str(SAMPLE_DIR / "metatool"),
                             "--budget-min", "5", "--queries", "80", "--out", str(tmp_path / "out"),
                             "--set", "cogr.generator=tiny", "--set", "cogr.lora.top_layers=1",
                             "--set", "cogr.seed_generator=null",
                             "--set", "cogr.max_empty_share=1.0", "--set", "cogr.rounds=1",
                             "--set", "cogr.sft.epochs=1", "--set", "cogr.grpo.max_prompts_per_phase=4",
                             "--set", "cogr.grpo.num_generations=2", "--set", "cogr.grpo.batch_size=4",
                             "--set", "cogr.grpo.max_completion_length=8", "--set", "cogr.sampling.max_new_tokens=8"),
                      timeout=600)
    assert re.fullmatch(rf"cogr_gain_ci_low={FLOAT}", lines[-2]), lines[-2]
    assert (tmp_path / "out" / "curves.png").is_file()
    from coevo.config import load_params  # the run folder carries what it was trained with, --set included

    recorded = load_params([tmp_path / "out" / "data" / "models" / "cogr" / "cogr_efficacy" / "params.yaml"])
    assert (recorded.seed, recorded.data.dataset, recorded.data.vague, recorded.cogr.generator, recorded.cogr.rounds) == (
        42, "cogr_efficacy", "test_copy", "tiny", 1)
    last_line(lines, rf"cogr_vs_baseline_ci_low={FLOAT}")
    # Its MLflow run charted the phases as a flow's run does: trainer steps, then each phase's val metrics.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("efficacy-cogr").experiment_id])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/f1")) == [0, 1, 2]
    sft_loss = client.get_metric_history(run.info.run_id, "live/00_sft_query_generator/loss")
    query_reward = client.get_metric_history(run.info.run_id, "live/01_query/reward")
    assert sft_loss and query_reward and max(p.timestamp for p in sft_loss) < min(p.timestamp for p in query_reward)
    check_variants(tmp_path / "out", tmp_path)
    check_seeds(tmp_path / "out", tmp_path)


def check_seeds(run: Path, tmp_path: Path) -> None:
    """bench/seeds.py on the run's efficacy.json and a copy as seed 43 whose differences moved by a known
    amount: per-seed rows as recorded, mean and sd over the two seeds exact; mixed runs refused."""
    import json
    import statistics

    record = json.loads((run / "efficacy.json").read_text())
    assert record["seed"] == 42 and set(record["tables"]) == {"test", "vague"}
    assert record["cogr_vs_baseline_ci_low"] == record["vs_baseline"]["test"]["ci_low"]
    other = json.loads(json.dumps(record))
    other["seed"] = 43
    for table in other["tables"].values():
        for c in table["comparisons"]:
            c.update(mean=c["mean"] + 0.1, ci_low=c["ci_low"] + 0.1, ci_high=c["ci_high"] + 0.1)
    (tmp_path / "s43").mkdir()
    (tmp_path / "s43" / "efficacy.json").write_text(json.dumps(other))
    lines = run_bench(script("seeds.py", str(run), str(tmp_path / "s43"), "--out", str(tmp_path / "seeds")),
                      timeout=120)
    assert re.fullmatch(rf"cogr_seeds_vs_baseline_mean={FLOAT} sd={FLOAT} above_0=[0-2]/2", lines[-1]), lines[-1]
    written = json.loads((tmp_path / "seeds" / "seeds.json").read_text())
    first = next(c for c in record["tables"]["test"]["comparisons"]
                 if c["name"] == record["tables"]["test"]["paper_baseline"]["name"] and c["metric"] == "f1")
    test_rows = [r for r in written["rows"] if r["split"] == "test"]
    assert [r["seed"] for r in test_rows] == [42, 43] and test_rows[0]["vs_baseline"] == first["mean"]
    summary = next(s for s in written["across_seeds"] if s["split"] == "test" and s["difference"] == "vs_baseline")
    assert abs(summary["mean"] - (first["mean"] + 0.05)) < 1e-12
    assert abs(summary["sd"] - statistics.stdev([first["mean"], first["mean"] + 0.1])) < 1e-12
    assert (tmp_path / "seeds" / "seeds.png").stat().st_size > 0

    spec = importlib.util.spec_from_file_location("seeds_bench", BENCH / "seeds.py")
    seeds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seeds)
    # the seeds compare on the metric of the target line, which need not be the table's first column (GRAPE's
    # line reads recall@10, its table opens on recall@1): a record whose line names another metric is read on it
    table = record["tables"]["test"]
    on = {(c["name"], c["metric"]): c for c in table["comparisons"]}
    paper = table["paper_baseline"]["name"]
    metric = next(m for n, m in on if n == paper and m != table["headline"] and ("vs start", m) in on)
    shifted = json.loads(json.dumps(record))
    shifted["vs_baseline"]["test"]["metric"] = metric
    row = next(r for r in seeds.seed_rows(shifted) if r["split"] == "test")
    assert (row["vs_baseline"], row["gain"], row[metric]) == (
        on[paper, metric]["mean"], on["vs start", metric]["mean"], on[paper, metric]["mean_a"])
    with pytest.raises(SystemExit, match="seed 42 is given twice"):
        seeds.main([str(run), str(run / "efficacy.json")])
    other["overrides"] = [*other["overrides"], "cogr.rounds=2"]
    (tmp_path / "s43" / "efficacy.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="has overrides .*give runs that differ in their seed only"):
        seeds.main([str(run), str(tmp_path / "s43")])
    with pytest.raises(SystemExit, match="no efficacy.json"):
        seeds.main([str(run), str(tmp_path / "seeds" / "nothing")])


def check_variants(run: Path, tmp_path: Path) -> None:
    """bench/variants.py on a real efficacy folder: the run against itself differs by exactly 0; a copy
    whose chosen phase scores F1 1.0 on every test query differs by the mean of 1 - F1, query by query;
    a copy that lost a test query is refused, naming it."""
    import json

    lines = run_bench(script("variants.py", f"default={run}", f"same={run}", "--out", str(tmp_path / "v")), timeout=120)
    assert re.fullmatch(rf"val chooses: default \(val f1 {FLOAT} with \S+\)", lines[-1]), lines[-1]
    written = json.loads((tmp_path / "v" / "variants.json").read_text())
    same = written["rows"][1]
    assert [r["variant"] for r in written["rows"]] == ["default", "same"] and written["metric"] == "f1"
    assert (same["test_minus_reference"], same["test_minus_reference_p"]) == (0.0, 1.0)
    assert same["vague_minus_reference"] == 0.0 and same["n_test"] > 0 and same["n_vague"] > 0
    assert (tmp_path / "v" / "variants.png").stat().st_size > 0

    spec = importlib.util.spec_from_file_location("variants_bench", BENCH / "variants.py")
    variants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(variants)
    perfect = tmp_path / "perfect"
    shutil.copytree(run / ".coevo", perfect / ".coevo")
    (stamp,) = perfect.glob(".coevo/steps/cogr/*/cogr-final.json")
    record = json.loads(stamp.read_text())
    best = next(r for r in record["result"]["rows"] if r["phase"] == record["result"]["best_phase"])
    scores = best["per_query"]["f1"]
    expected = sum(1.0 - v for v in scores.values()) / len(scores)
    best["per_query"]["f1"] = dict.fromkeys(scores, 1.0)
    stamp.write_text(json.dumps(record))
    assert variants.main([f"default={run}", f"perfect={perfect}", "--out", str(tmp_path / "p")]) == 0
    row = json.loads((tmp_path / "p" / "variants.json").read_text())["rows"][1]
    assert row["test_f1"] == 1.0 and abs(row["test_minus_reference"] - expected) < 1e-12
    assert row["vague_minus_reference"] == 0.0  # its vague stamp is untouched
    # the start phase (SFT) compares separately: moved only where val chose the start itself
    start_moved = record["result"]["best_phase"] == record["result"]["start_phase"]
    assert abs(row["test_start_minus_reference"] - (expected if start_moved else 0.0)) < 1e-12

    (vague,) = perfect.glob(".coevo/steps/cogr/*/cogr-final-vague.json")
    vague.write_text(json.dumps({**json.loads(vague.read_text()), "state": "running"}))  # as a killed run leaves it
    assert variants.main([f"default={run}", f"perfect={perfect}", "--out", str(tmp_path / "p")]) == 0
    assert "vague_f1" not in json.loads((tmp_path / "p" / "variants.json").read_text())["rows"][1]

    dropped = sorted(scores)[0]
    del best["per_query"]["f1"][dropped]
    stamp.write_text(json.dumps(record))
    with pytest.raises(SystemExit, match=rf"perfect and default on test: .*1 only in b \('{re.escape(dropped)}'"):
        variants.main([f"default={run}", f"perfect={perfect}", "--out", str(tmp_path / "p")])
    with pytest.raises(SystemExit, match="'default' is not NAME=FOLDER"):
        variants.main(["default", f"perfect={perfect}"])
    with pytest.raises(SystemExit, match="holds no finished efficacy run"):
        variants.main([f"default={run}", f"empty={tmp_path / 'v'}"])


# ------------------------------------------------------------------ MLflow UI screenshot
def _store_with_runs(tmp_path: Path, runs: int = 2, open_last: bool = False) -> tuple[str, list[str]]:
    """A store with ``runs`` finished runs of experiment cogr (the last one still RUNNING with ``open_last``)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("cogr", artifact_location=(tmp_path / "mlruns").as_uri())
    ids = []
    for i in range(runs):
        run = client.create_run(experiment, run_name=f"run-{i}")
        client.log_metric(run.info.run_id, "test/f1", 0.1 * i)
        client.log_table(run.info.run_id, data={"label": ["BM25 (test)", "best phase (test)"], "f1": [0.5, 0.1 * i]},
                         artifact_file="tables/results.json")
        if not (open_last and i == runs - 1):
            client.set_terminated(run.info.run_id)
        ids.append(run.info.run_id)
    return uri, ids


def test_mlflow_screenshot_page(tmp_path):
    """The page the screenshot opens (no browser needed): the latest runs' comparison, or the run list."""
    spec = importlib.util.spec_from_file_location("mlflow_screenshot_bench", BENCH / "mlflow_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    uri, ids = _store_with_runs(tmp_path)
    compare = module.page(uri, "cogr", 4, "compare")
    assert compare.startswith("#/compare-runs?runs=") and compare.endswith("&workflowType=machine_learning")
    assert all(run_id in compare for run_id in ids)
    assert re.fullmatch(r"#/experiments/\d+\?workflowType=machine_learning", module.page(uri, "cogr", 4, "runs"))
    assert re.fullmatch(r"#/experiments/\d+/runs\?compareRunsMode=CHART&workflowType=machine_learning",
                        module.page(uri, "cogr", 4, "charts"))
    assert re.fullmatch(r"#/experiments/\d+/runs\?compareRunsMode=ARTIFACT&workflowType=machine_learning",
                        module.page(uri, "cogr", 4, "tables"))
    assert module.page(uri, "cogr", 4, "run").endswith(f"/runs/{ids[-1]}?workflowType=machine_learning")
    assert module.page(uri, "cogr", 4, "run-metrics").endswith(f"/runs/{ids[-1]}/model-metrics?workflowType=machine_learning")
    assert module.page(uri, "cogr", 4, "models", model="coevo cogr") == "#/models/coevo%20cogr"
    with pytest.raises(SystemExit, match="no registered model"):
        module.page(uri, "cogr", 4, "models")
    with pytest.raises(SystemExit, match="no experiment 'grape'"):
        module.page(uri, "grape", 4, "compare")


@pytest.mark.slow
@pytest.mark.skipif(not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")),
                    reason="no Chromium on this machine (Debian: apt-get install -y chromium)")
def test_mlflow_screenshot(tmp_path):
    uri, _ = _store_with_runs(tmp_path)
    out = tmp_path / "shot.png"
    lines = run_bench(script("mlflow_screenshot.py", "--tracking-uri", uri, "--experiment", "cogr", "--runs", "2",
                             "--out", str(out), "--size", "800,600", "--wait-ms", "2000"), timeout=300)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/#/compare-runs\?runs=.+", lines[-2]), lines[-2]
    last_line(lines, rf"saved {re.escape(str(out))}")


@pytest.mark.slow
@pytest.mark.skipif(not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")),
                    reason="no Chromium on this machine (Debian: apt-get install -y chromium)")
def test_mlflow_page_check(tmp_path):
    """--expect reads the page as a user sees it: a run still open shows as Running on its page,
    and a text the page does not show fails the check by name (exit 1, the PNG still saved)."""
    uri, _ = _store_with_runs(tmp_path, open_last=True)
    out = tmp_path / "run.png"
    lines = run_bench(script("mlflow_screenshot.py", "--tracking-uri", uri, "--view", "run", "--out", str(out),
                             "--size", "1000,700", "--wait-ms", "30000", "--expect", "run-1", "--expect", "Running"),
                      timeout=300)
    assert lines[-2] == "shows: 'run-1', 'Running'", lines
    missing = subprocess.run(script("mlflow_screenshot.py", "--tracking-uri", uri, "--view", "run", "--out",
                                    str(out), "--size", "1000,700", "--wait-ms", "5000", "--expect", "no such text"),
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert missing.stderr.strip().endswith("the page does not show: 'no such text'"), missing.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The runs side by side, a chart per metric, narrowed by the chart search as a user types it.
    charts = run_bench(script("mlflow_screenshot.py", "--tracking-uri", uri, "--view", "charts", "--search", "test/",
                              "--out", str(out), "--size", "1000,700", "--wait-ms", "60000", "--expect", "test/f1"),
                       timeout=300)
    assert charts[-2] == "shows: 'test/f1'", charts
    # Their logged tables side by side, a row per label of the first column.
    tables = run_bench(script("mlflow_screenshot.py", "--tracking-uri", uri, "--view", "tables", "--out", str(out),
                              "--size", "1000,700", "--wait-ms", "60000", "--expect", "tables/results.json",
                              "--expect", "best phase (test)"), timeout=300)
    assert tables[-2] == "shows: 'tables/results.json', 'best phase (test)'", tables


# ------------------------------------------------------------------ the README's demo quote
@pytest.mark.slow
@pytest.mark.java
@pytest.mark.full  # full tier: the demo's pipeline runs in test_terminal's `coevo run` and test_init's wheel run
def test_demo_quote(tmp_path):
    """The quote from a fresh clone of HEAD with the tiny generator: header with numerics and peak memory."""
    out = tmp_path / "demo.txt"
    lines = run_bench(script("demo_quote.py", "--out", str(out), "--set", "cogr.generator=tiny",
                             "--set", "cogr.seed_generator=null", "--set", "cogr.max_empty_share=1.0",
                             "--set", "cogr.sft.epochs=1", "--set", "cogr.grpo.max_prompts_per_phase=4",
                             # 4 prompts x 2 = 8 completions: one step of demo.yaml's 4 accumulated passes of 2
                             "--set", "cogr.grpo.num_generations=2", "--set", "cogr.grpo.batch_size=2",
                             "--set", "cogr.grpo.max_completion_length=8", "--set", "cogr.sampling.max_new_tokens=8"),
                      timeout=900, env={"TMPDIR": str(tmp_path)})
    quote = out.read_text().splitlines()
    assert quote[0].startswith("# `coevo demo` from a fresh clone of ") and quote[0].endswith("bench/demo_quote.py")
    assert re.fullmatch(r"# numerics of every phase: (bf16|fp32) on [\w+]+(, ONEDNN_MAX_CPU_ISA=\w+)? \(torch [\w.+]+\)",
                        quote[2]), quote[2]
    assert re.match(rf"# wall \d+s; peak resident memory per process: {FLOAT} GB ", quote[3]), quote[3]
    assert re.match(rf"# the demo process's peak per step: prepare data {FLOAT} GB; ", quote[4]), quote[4]
    assert re.search(rf"; SFT {FLOAT} GB; ", quote[4]), quote[4]
    assert not [line for line in quote if line != line.rstrip()], "trailing blanks in the quote"
    assert any(line.startswith("coevo demo: CoGR on data/sample/metatool with smollm2-135m on CPU, ") for line in quote)
    assert any("best phase" in line for line in quote), "no results table in the quote"
    last_line(lines, rf"demo_wall_s={FLOAT} peak_rss_gb={FLOAT} numerics=(bf16|fp32)/\w+")
