"""Orchestration: how the library's work is run, cached, tracked, recorded and published.

Imports go one way: the library (``coevo`` minus ``cli/``, ``orchestration/`` and ``serving/``)
-> ``coevo.orchestration`` -> the entry points (``coevo.cli``, a project's ``flows/`` and
``tasks/``, ``bench/``). The library never imports this package, and this package never imports
``coevo.cli`` (a flow started by a deployment has no CLI around it). Prefect, MLflow and DVC
are used here, not in the library.

- :mod:`~coevo.orchestration.pipeline`: a method's pipeline as keyed steps (prepare ->
  validate -> train -> evaluate), with the staleness rule of :mod:`coevo.steps`;
- :mod:`~coevo.orchestration.prefect_tasks`: one cached Prefect task per step (on Ray too);
- :mod:`~coevo.orchestration.tracking`: the MLflow tracker (one run per flow run);
- :mod:`~coevo.orchestration.publish`: the flow's last task, model logging, registry and champion gate;
- :mod:`~coevo.orchestration.flow`: the flow builder (:func:`~coevo.orchestration.flow.method_flow`,
  :func:`~coevo.orchestration.flow.run_pipeline`, ``coevo train``'s MLflow run);
- :mod:`~coevo.orchestration.lock`: one run per run folder;
- :mod:`~coevo.orchestration.dvc_stages` and :mod:`~coevo.orchestration.dvc_record`: dvc.yaml
  from the runs' records, and each run's record in DVC;
- :mod:`~coevo.orchestration.repro_matrix`: the expected-score matrix (``coevo repro``).

Nothing is imported here: each module pulls in its own heavy dependencies when imported.
"""
