"""The three methods, each a :class:`coevo.methods.base.Method` over a run directory."""

from __future__ import annotations


def _cogr():
    from coevo.methods.cogr import CoGR

    return CoGR


def _grape():
    from coevo.methods.grape import Grape

    return Grape


def _cohyde():
    from coevo.methods.cohyde import CoHyDE

    return CoHyDE


# name -> loader of the class (lazy: importing a method pulls in its libraries)
METHODS = {"cogr": _cogr, "grape": _grape, "cohyde": _cohyde}
