"""A fourth method plugs in without touching coevo.

tests/fixtures/plugin holds TermBoost (its params section, phases, reports and retriever in
one module, ``termboost_plugin.py``) and a dist-info whose ``coevo.methods`` entry point
registers it. Put on the path of a fresh DVC project (as pip would put an installed package
on sys.path), it runs through `coevo run`, `coevo train` and `coevo search`; it is logged,
registered and gated as an MLflow model that serves what its final evaluation measured; it
gets its own DVC stages; and its params section is checked like a built-in one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import BIN, REPO_ROOT, dvc_repo, make_project, sh

pytestmark = pytest.mark.slow

PLUGIN = REPO_ROOT / "tests" / "fixtures" / "plugin"
MODEL = "models:/coevo-termboost-toy@champion"


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_server):
    root = make_project(tmp_path_factory.mktemp("termboost_project"), with_code=True)
    for entry in PLUGIN.iterdir():
        (shutil.copytree if entry.is_dir() else shutil.copy)(entry, root / entry.name)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["termboost"] = {"top_terms": 8}  # the method's section: the only edit outside its module
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dvc_repo(root, prefect_server)  # the plugin's folder is on PYTHONPATH: its entry point is found
    return root, env


@pytest.fixture(scope="module")
def plugin_loaded(project):
    """The plugin registered in this process too (the entry point, found once its folder is on sys.path)."""
    from coevo.methods import SPECS, load_entry_points

    root, _ = project
    sys.path.insert(0, str(root))
    load_entry_points()
    assert "termboost" in SPECS
    yield root
    SPECS.pop("termboost", None)
    sys.path.remove(str(root))


def coevo(project, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    root, env = project
    return sh([str(BIN / "coevo"), *args], root, env, check=check)


def test_the_commands_offer_the_plugin_method(project):
    assert "TermBoost: BM25 over items expanded" in coevo(project, "run", "termboost", "--help").stdout
    train_help = coevo(project, "train", "termboost", "--help").stdout
    assert "expand the items with their training queries' words" in train_help and "--vllm" not in train_help


def test_its_params_section_is_checked_like_a_built_in_one(project, plugin_loaded, tmp_path):
    from coevo.config import ParamsError, load_params

    root = plugin_loaded
    params = load_params(root / "params.yaml")
    assert params.termboost.top_terms == 8
    with pytest.raises(ParamsError) as bad:
        load_params(root / "params.yaml", ["termboost.top_terms=0", "termboost.bogus=1"])
    assert "termboost.top_terms" in str(bad.value) and "termboost.bogus" in str(bad.value)
    doc = yaml.safe_load((root / "params.yaml").read_text())
    del doc["termboost"]
    without = tmp_path / "without.yaml"
    without.write_text(yaml.safe_dump(doc))
    assert getattr(load_params(without), "termboost", None) is None  # not needed unless it runs
    with pytest.raises(ParamsError, match=r"no `termboost:` section; method termboost reads its knobs there"):
        load_params(without, method="termboost")
    explained = " ".join(coevo(project, "params", "explain", "termboost.top_terms").stdout.split())
    assert "int in [1, 50]" in explained and "training queries added" in explained
    # on the command line: one line naming the key, before any work starts
    failed = coevo(project, "run", "termboost", "--set", "termboost.top_terms=0", check=False)
    assert failed.returncode != 0 and "termboost.top_terms" in failed.stderr + failed.stdout
    assert "Traceback" not in failed.stderr and not (root / "data" / "processed").exists()


def test_coevo_run_trains_evaluates_registers_and_records_it(project):
    root, env = project
    coevo(project, "run", "termboost")
    metrics = json.loads((root / "reports" / "termboost" / "metrics.json").read_text())
    phases = [row["label"] for row in metrics["val"]]
    assert phases == ["items as they are", "items + their queries' words"]
    table = metrics["evaluation"]
    assert table["method"] == "termboost" and table["n_queries"] > 0
    labels = [row["label"] for row in table["rows"]]
    assert any(label.startswith("BM25 @k*") for label in labels) and any(label.startswith("dense @k*") for label in labels)
    assert f"{table['best_phase']} (test)" in labels and table["start_phase"] == "00_start"
    headline = [d for d in table["comparisons"] if d["name"] == "vs start" and d["metric"] == "recall@10"]
    assert headline and headline[0]["n"] == table["n_queries"]  # the spec's headline, with its paired CI
    # its own DVC stages, written from its record; the run's outputs are in DVC's cache
    dvc = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert "termboost_plugin.py" in dvc["termboost-train"]["deps"]
    assert "data/indexes/termboost/toy" not in dvc["termboost-evaluate"]["outs"]  # it exports no index
    status = sh([str(BIN / "dvc"), "status"], root, env).stdout
    assert "changed" not in status, status
    again = coevo(project, "train", "termboost")
    assert "01_learn" in again.stdout + again.stderr


def test_the_registered_model_serves_what_the_final_evaluation_measured(project, plugin_loaded):
    import mlflow
    import pandas as pd

    from coevo.data.schema import Dataset
    from coevo.serving.pyfunc import load_retriever

    root = plugin_loaded
    metrics = json.loads((root / "reports" / "termboost" / "metrics.json").read_text())
    retriever = load_retriever(MODEL, tracking=f"sqlite:///{root / 'mlflow.db'}")
    assert type(retriever).__name__ == "TermBoostRetriever" and retriever.generator is None
    measured = retriever.evaluate(Dataset.load(root / "data" / "processed" / "toy"), "test").means()
    test_rows = metrics["test"]
    row = test_rows[retriever.manifest["phase"]]
    assert measured["recall@10"] == pytest.approx(row["recall@10"]) and measured["ndcg@5"] == pytest.approx(row["ndcg@5"])
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(MODEL)
    query = Dataset.load(root / "data" / "processed" / "toy").queries_in("test")["text"].iloc[0]
    predicted = model.predict(pd.DataFrame({"query": [query]}))
    assert list(predicted.columns)[:2] == ["query", "terms"]

    found = coevo(project, "search", query, "-m", MODEL, "--json")
    record = json.loads(found.stdout.strip().splitlines()[-1])
    assert record["terms"] and record["results"] == retriever.search(query)[0]["results"]
