"""Use a trained retriever: search it, package it as an MLflow model, gate it in the registry.

- :mod:`coevo.serving.search`: a :class:`~coevo.serving.search.Retriever` per method (CoGR,
  GRAPE, CoHyDE), built from a run directory or from the files of a logged model; ``search``
  and ``evaluate``. No MLflow.
- :mod:`coevo.serving.pyfunc`: the ``mlflow.pyfunc.PythonModel`` around a retriever (logged as
  models-from-code: nothing is pickled), its signature, input checks and logging.
- :mod:`coevo.serving.registry`: model names, versions, the ``challenger`` / ``champion``
  aliases and the champion gate, as functions over an ``MlflowClient``.

Nothing here is imported by ``coevo`` itself; the CLI (``coevo search|evaluate|promote``) and
the flows' last task (``coevo.orchestration.publish``) use it.
"""
