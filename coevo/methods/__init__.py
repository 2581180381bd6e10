"""The methods, each a :class:`coevo.methods.base.Method` over a run directory, and their specs.

A spec is what the rest of the project needs to know of a method without importing it (an
import pulls in its libraries): its name, the one-line descriptions of its commands, and what it
supports. The CLI's `coevo run` / `coevo train` commands are made from :data:`SPECS`; a method
registered with :func:`register` gets them without another edit.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass


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
    #: its generation can run on vLLM (a GPU worker): `coevo train <name> --vllm` is offered
    supports_vllm: bool = False

    def load(self) -> type:
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)


SPECS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add (or replace) a method; returns the spec."""
    SPECS[spec.name] = spec
    return spec


register(MethodSpec(
    "cogr", "coevo.methods.cogr:CoGR",
    run_help="CoGR: Algorithm 1 SFT, alternating query/item GRPO rounds, BM25 baseline, Lucene export.",
    train_help="CoGR: Algorithm 1 SFT, then alternating query/item GRPO phases with early stopping on val.",
    supports_vllm=True))
register(MethodSpec(
    "grape", "coevo.methods.grape:Grape",
    run_help="GRAPE: GRPO query rewriter against a frozen retriever, corpus-rank reward.",
    train_help="GRAPE: GRPO query rewriter against a frozen retriever (corpus-rank reward)."))
register(MethodSpec(
    "cohyde", "coevo.methods.cohyde:CoHyDE",
    run_help="CoHyDE: co-train a HyDE rewriter (DPO) and a dense encoder, per-group metrics.",
    train_help="CoHyDE: S1a encoder, S1b rewriter warm-up, then rounds of S2-S4 + DPO with early stopping."))


class _Loaders(Mapping):
    """name -> loader of the method's class: a live view of :data:`SPECS` (``coevo.methods.base.method_class``)."""

    def __getitem__(self, name: str):
        return SPECS[name].load

    def __iter__(self):
        return iter(SPECS)

    def __len__(self) -> int:
        return len(SPECS)


METHODS = _Loaders()
