"""The methods, each a :class:`coevo.methods.base.Method` over a run directory, and their specs.

A spec is what the rest of the project needs to know of a method without importing it (an
import pulls in its libraries): its name, its class, its params section, the retriever that
serves it, the headline metric of its champion gate, the one-line descriptions of its commands
and what it supports. Everything that used to keep a table of methods reads :data:`SPECS`
instead: the `coevo run` / `coevo train` commands, the params schema (a registered method's
section is validated like the built-in ones), the flows (a method without a `flows/<name>.py`
runs the generic one), serving (`coevo search`, the MLflow model), the registry gate and the
DVC stages. A new method is a method module and a params section; :func:`register` is its one
line of wiring (an installed package can do it through the ``coevo.methods`` entry-point group).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

_NAME = re.compile(r"[a-z][a-z0-9]*")


@dataclass(frozen=True)
class MethodSpec:
    """One method as the project's commands see it."""

    name: str
    #: "module:Class" of the :class:`~coevo.methods.base.Method` (imported on first use)
    target: str
    #: one line for `coevo run <name> --help`
    run_help: str
    #: one line for `coevo train <name> --help`
    train_help: str
    #: "module:Class" of its params section (a ``coevo.config.Section``), named ``<name>`` in params files
    params: str
    #: "module:Class" of the ``coevo.serving.search.Retriever`` that serves a finished run
    retriever: str
    #: the metric its champion gate compares on test (``registry.promote_metric`` may override it)
    headline: str
    #: its generation can run on vLLM (a GPU worker): `coevo train <name> --vllm` is offered
    supports_vllm: bool = False

    def load(self) -> type:
        """The :class:`~coevo.methods.base.Method` subclass."""
        return _load(self.target)

    def params_model(self) -> type:
        """The params section's model."""
        return _load(self.params)

    def retriever_class(self) -> type:
        """The retriever class of the method's served model."""
        return _load(self.retriever)


def _load(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


SPECS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add (or replace) a method; returns the spec. Register before the CLI is imported (its
    commands are made from SPECS when it loads): at import of the method's module, or through an
    entry point of the ``coevo.methods`` group naming that module."""
    if not _NAME.fullmatch(spec.name):
        raise ValueError(f"method name {spec.name!r}: lower-case letters and digits only (it names a params section, "
                         "a CLI command, an MLflow experiment and the model coevo-<method>-<dataset>)")
    SPECS[spec.name] = spec
    return spec


def spec_of(name: str) -> MethodSpec:
    """The spec of method ``name``; a one-line error lists the registered ones."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; expected one of {', '.join(SPECS)}") from None


def load_entry_points() -> None:
    """Import the modules named in the ``coevo.methods`` entry-point group (each registers its spec)."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="coevo.methods"):
        try:
            entry.load()
        except Exception as exc:  # noqa: BLE001 - name the plugin, not a traceback deep inside it
            raise ImportError(f"entry point {entry.name} = {entry.value} (group coevo.methods): {exc}") from exc


register(MethodSpec(
    "cogr", "coevo.methods.cogr:CoGR",
    params="coevo.config:CoGRParams", retriever="coevo.serving.search:CoGRRetriever", headline="f1",
    run_help="CoGR: Algorithm 1 SFT, alternating query/item GRPO rounds, BM25 baseline, Lucene export.",
    train_help="CoGR: Algorithm 1 SFT, then alternating query/item GRPO phases with early stopping on val.",
    supports_vllm=True))
register(MethodSpec(
    "grape", "coevo.methods.grape:Grape",
    params="coevo.config:GrapeParams", retriever="coevo.serving.search:GrapeRetriever", headline="recall@10",
    run_help="GRAPE: GRPO query rewriter against a frozen retriever, corpus-rank reward.",
    train_help="GRAPE: GRPO query rewriter against a frozen retriever (corpus-rank reward)."))
register(MethodSpec(
    "cohyde", "coevo.methods.cohyde:CoHyDE",
    params="coevo.config:CoHyDEParams", retriever="coevo.serving.search:CoHyDERetriever", headline="ndcg@5",
    run_help="CoHyDE: co-train a HyDE rewriter (DPO) and a dense encoder, per-group metrics.",
    train_help="CoHyDE: S1a encoder, S1b rewriter warm-up, then rounds of S2, S3, S4, DPO and val "
               "(five stamped phases each) with early stopping."))

load_entry_points()


class _Loaders(Mapping):
    """name -> loader of the method's class: a live view of :data:`SPECS` (``coevo.methods.base.method_class``)."""

    def __getitem__(self, name: str):
        return SPECS[name].load

    def __iter__(self):
        return iter(SPECS)

    def __len__(self) -> int:
        return len(SPECS)


METHODS = _Loaders()
