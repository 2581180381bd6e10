"""The MLflow model of a trained retriever: logged from code (nothing pickled), with its
artifacts, signature and input example; `mlflow.pyfunc.load_model(uri).predict` returns what
`Retriever.search` does; bad requests raise MlflowException(INVALID_PARAMETER_VALUE); the
`runs:/` and `models:/name@alias` URIs work from `coevo search`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.test_search import DATASET, QUERIES, cli, trained

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict[str, str]:
    """A sqlite MLflow store in a temporary folder, with one experiment whose artifacts live there too."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{folder}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("serving", artifact_location=(folder / "mlruns").as_uri())
    return {"uri": uri, "experiment": experiment}


def log(store: dict[str, str], retriever) -> tuple[str, object]:
    """Log ``retriever`` in a new run of the store; (run_id, ModelInfo)."""
    import mlflow

    from coevo.serving.pyfunc import log_retriever, tracking_uri

    with tracking_uri(store["uri"]), mlflow.start_run(experiment_id=store["experiment"]) as run:
        info = log_retriever(retriever)
    return run.info.run_id, info


@pytest.fixture(scope="module")
def logged(tmp_path_factory, store):
    """{method: (retriever, run_id, ModelInfo)} for the three methods."""
    from coevo.serving.search import from_run

    out = {}
    for method in ("cogr", "grape", "cohyde"):
        run = trained(tmp_path_factory, method)
        retriever = from_run(method, run.run_dir, run.params, run.data_dir)
        out[method] = (retriever, *log(store, retriever))
    return out


def _load(store, uri):
    import mlflow

    from coevo.serving.pyfunc import tracking_uri

    with tracking_uri(store["uri"]):
        return mlflow.pyfunc.load_model(uri)


@pytest.mark.parametrize("method,generated", [("cogr", "keywords"), ("grape", "rewrite"), ("cohyde", "description")])
def test_logged_model_predicts_what_the_retriever_searches(store, logged, method, generated):
    retriever, run_id, info = logged[method]
    model = _load(store, f"runs:/{run_id}/model")
    frame = model.predict(pd.DataFrame({"query": QUERIES}), params={"k": 4})
    assert list(frame.columns) == ["query", generated, "results"]
    assert frame.to_dict(orient="records") == retriever.search(QUERIES, k=4)
    default_k = model.predict(pd.DataFrame({"query": QUERIES[:1]}))
    assert default_k.to_dict(orient="records") == retriever.search(QUERIES[:1], k=10)  # k defaults to 10

    sig = model.metadata.signature
    assert sig.inputs.input_names() == ["query"]
    assert sig.outputs.input_names() == ["query", generated, "results"]
    assert [(p.name, p.default) for p in sig.params] == [("k", 10)]
    assert model.metadata.get_input_schema() is not None
    assert info.saved_input_example_info is not None


def test_nothing_is_pickled_and_the_artifacts_are_safetensors_and_plain_files(store, logged, tmp_path):
    import mlflow
    import yaml

    from coevo.serving.pyfunc import tracking_uri

    retriever, run_id, _ = logged["cohyde"]
    with tracking_uri(store["uri"]):
        local = Path(mlflow.artifacts.download_artifacts(f"runs:/{run_id}/model", dst_path=str(tmp_path)))
    mlmodel = yaml.safe_load((local / "MLmodel").read_text())
    flavor = mlmodel["flavors"]["python_function"]
    assert flavor["loader_module"] == "mlflow.pyfunc.loaders.code_model"
    assert flavor["model_code_path"].endswith("coevo_retriever.py") and "python_model" not in flavor
    assert not [p for p in local.rglob("*") if p.suffix in (".pkl", ".pickle", ".cloudpickle")]
    assert (local / "code" / "coevo" / "serving" / "pyfunc.py").exists()  # the code it was logged with
    artifacts = {name: local / spec["path"] for name, spec in flavor["artifacts"].items()}
    assert set(artifacts) == {"manifest", "params", "items", "generator", "index", "encoder"}
    assert list(artifacts["generator"].rglob("*.safetensors")) and list(artifacts["encoder"].rglob("*.safetensors"))
    assert json.loads(artifacts["manifest"].read_text())["method"] == "cohyde"
    assert mlmodel["metadata"]["coevo"]["dataset"] == DATASET
    requirements = (local / "requirements.txt").read_text()
    assert f"mlflow=={mlflow.__version__}" in requirements and "faiss" in requirements


def test_bad_requests_raise_invalid_parameter_value(store, logged):
    from mlflow.exceptions import MlflowException

    _, run_id, _ = logged["cogr"]
    model = _load(store, f"runs:/{run_id}/model")
    cases = [
        (pd.DataFrame({"text": ["a query"]}), {}, "query"),
        (pd.DataFrame({"query": ["fine", ""]}), {}, "query 1: empty string"),
        (pd.DataFrame({"query": ["q"] * 10_000}), {}, "10000 queries in one request; at most 1000"),
        (pd.DataFrame({"query": ["fine"]}), {"k": 0}, "k must be an integer between 1 and 1000"),
    ]
    for frame, params, message in cases:
        with pytest.raises(MlflowException, match=message) as error:
            model.predict(frame, params=params or None)
        assert error.value.error_code == "INVALID_PARAMETER_VALUE"
        assert error.value.get_http_status_code() == 400


def test_coevo_search_reads_runs_and_registered_models(store, logged):
    from mlflow.tracking import MlflowClient

    from coevo.serving import registry

    retriever, run_id, info = logged["grape"]
    from coevo.serving.pyfunc import tracking_uri

    client = MlflowClient(store["uri"], registry_uri=store["uri"])
    name = registry.model_name("grape", DATASET)
    with tracking_uri(store["uri"]):  # the registry resolves a models:/<model_id> source through it
        version = registry.register_version(client, name, source=info.model_uri, run_id=run_id, model_id=info.model_id)
    client.set_registered_model_alias(name, registry.CHAMPION, version)
    expected = retriever.search(QUERIES[:1], k=3)[0]
    for uri in (f"models:/{name}@champion", f"models:/{name}@challenger", f"runs:/{run_id}"):
        result = CliRunner().invoke(cli(), ["search", "--model", uri, QUERIES[0], "--k", "3", "--json",
                                            "--tracking-uri", store["uri"]])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout.strip().splitlines()[-1]) == expected, uri
    missing = CliRunner().invoke(cli(), ["search", "--model", f"models:/{name}@nope", "q",
                                         "--tracking-uri", store["uri"]])
    assert missing.exit_code != 0 and "nope" in missing.output
