"""Vague queries: a query with its relevant items' own vocabulary taken out.

The CoHyDE paper's largest gains are on vague queries, and GRAPE's wins over the raw query are
where the frozen retriever meets a shifted query. Both need queries that do not say what the
item says. The paper asks an LLM to rewrite queries colloquially. This module does it offline
with a fixed rule that needs no model and no seed:

- A query word is *item vocabulary* when it, or its first :data:`STEM` letters (a crude stem:
  "weather" / "weathers", "translate" / "translation"), occurs among the words of the
  query's relevant items (title and text, CamelCase and snake_case titles split into words).
- Stopwords are never removed, so what is left still reads as a request ("Can you ... for me?").
- The vague text is the query with every item-vocabulary word removed. A query left without
  any content word (only stopwords) has no vague version: its intent was entirely in the
  item's words. Such queries are dropped and counted (``meta.vague``).

``data.vague`` says where the rule applies when a data set is prepared:

- ``test_copy`` adds a ``vague`` split: a copy of every test query (id ``<id>~vague``, same
  qrels) with the vague text. ``evaluation.split: vague`` reports the final table on it.
- ``train_copy`` does what ``test_copy`` does and also adds a vague copy of every train and val
  query to its own split (same id rule, same qrels): a method, and the baselines that train
  (CoHyDE's S1a), see both kinds of query in training and in the val choice, while test keeps
  the standard queries and the ``vague`` split their copies.
- ``all_queries`` replaces every query's text (train, val and test): the shift setting, in
  which a method trains and is measured on vague queries alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import pandas as pd

from coevo.data.schema import Dataset

VAGUE_SPLIT = "vague"
VAGUE_SUFFIX = "~vague"
MODES = ("none", "test_copy", "train_copy", "all_queries")
STEM = 5

WORD = re.compile(r"[A-Za-z0-9]+")
CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
STOPWORDS = frozenset("""
a about above after again all am an and any are as at be because been before being below between both but by
can could did do does doing down during each few for from further get got had has have having he her here hers
him his how i if in into is it its itself just like me more most my myself need no nor not now of off on once
only or other our ours out over own please same she should so some such than that the their theirs them then
there these they this those through to too under until up very want was we were what when where which while
who whom why will with would you your yours yourself help find give show tell make know let use using also
""".split())


def words(text: str) -> list[str]:
    """Lower-case words of ``text``; CamelCase runs are split ("WeatherPlugin" -> weather, plugin)."""
    out = []
    for token in WORD.findall(text):
        out += [part.lower() for part in CAMEL.findall(token)] or [token.lower()]
    return out


def _stem(word: str) -> str:
    return word[:STEM]


def item_vocabulary(texts: Iterable[str]) -> frozenset[str]:
    """The words and stems of the items' texts (stopwords left out)."""
    vocab: set[str] = set()
    for text in texts:
        for word in words(text):
            if word not in STOPWORDS:
                vocab.update((word, _stem(word)))
    return frozenset(vocab)


def vague_text(query: str, vocabulary: frozenset[str]) -> str | None:
    """``query`` without the words of ``vocabulary`` (see the module notes); None when no content word is left."""
    def keep(match: re.Match[str]) -> bool:
        parts = [p.lower() for p in CAMEL.findall(match.group())] or [match.group().lower()]
        return not any(p not in STOPWORDS and (p in vocabulary or _stem(p) in vocabulary) for p in parts)

    pieces, last, kept_content = [], 0, False
    for match in WORD.finditer(query):
        if keep(match):
            pieces.append(query[last:match.end()])
            kept_content |= match.group().lower() not in STOPWORDS
        else:
            pieces.append(query[last:match.start()])
        last = match.end()
    pieces.append(query[last:])
    text = re.sub(r"\s+([,.?!;:])", r"\1", re.sub(r"\s{2,}", " ", "".join(pieces))).strip(" ,;:")
    return text if kept_content and text else None


def _vague_texts(dataset: Dataset, query_ids: Iterable[str]) -> dict[str, str | None]:
    items = dataset.items.set_index("item_id")
    relevant = dataset.relevant()
    text_of = dict(zip(dataset.queries["query_id"], dataset.queries["text"]))
    out: dict[str, str | None] = {}
    for qid in query_ids:
        texts = [f"{items.at[i, 'title']} {items.at[i, 'text']}" for i in relevant.get(qid, {}) if i in items.index]
        out[qid] = vague_text(str(text_of[qid]), item_vocabulary(texts)) if texts else None
    return out


def with_vague(dataset: Dataset, mode: str) -> Dataset:
    """``dataset`` with the vague rule applied as ``mode`` says (``none`` returns it unchanged)."""
    if mode not in MODES:
        raise ValueError(f"data.vague: {mode!r} is not one of {' | '.join(MODES)}")
    if mode == "none":
        return dataset
    queries, qrels = dataset.queries, dataset.qrels
    if mode in ("test_copy", "train_copy"):
        # test copies go to their own split; train and val copies (train_copy) stay in theirs
        into = {"test": VAGUE_SPLIT} | ({"train": "train", "val": "val"} if mode == "train_copy" else {})
        source = queries[queries["split"].isin(list(into))]
        texts = _vague_texts(dataset, source["query_id"])
        kept = source[source["query_id"].map(lambda q: texts[q] is not None)].copy()
        kept["text"] = kept["query_id"].map(texts)
        kept["split"] = kept["split"].map(into)
        new_id = {q: f"{q}{VAGUE_SUFFIX}" for q in kept["query_id"]}
        copied = qrels[qrels["query_id"].isin(list(new_id))].copy()
        copied["query_id"] = copied["query_id"].map(new_id)
        kept["query_id"] = kept["query_id"].map(new_id)
        new_queries = pd.concat([queries, kept], ignore_index=True)
        new_qrels = pd.concat([qrels, copied], ignore_index=True)
        n_test = int((source["split"] == "test").sum())
        n_vague = int((kept["split"] == VAGUE_SPLIT).sum())
        stats = {"mode": mode, "queries": n_test, "kept": n_vague, "dropped": n_test - n_vague}
        if mode == "train_copy":
            stats["copies_per_split"] = {s: int((kept["split"] == s).sum()) for s in ("train", "val")}
    else:
        texts = _vague_texts(dataset, queries["query_id"])
        keep = queries["query_id"].map(lambda q: texts[q] is not None)
        new_queries = queries[keep].copy()
        new_queries["text"] = new_queries["query_id"].map(texts)
        new_qrels = qrels[qrels["query_id"].isin(set(new_queries["query_id"]))]
        stats = {"mode": mode, "queries": len(queries), "kept": int(keep.sum()), "dropped": int((~keep).sum()),
                 "kept_per_split": {str(s): int(n) for s, n in new_queries["split"].value_counts().sort_index().items()}}
    return Dataset(items=dataset.items, queries=new_queries, qrels=new_qrels, name=dataset.name,
                   source=dataset.source, seed=dataset.seed, grades=dataset.grades,
                   meta={**dataset.meta, "vague": {**stats, "rule": f"item vocabulary removed (stem {STEM})"}})


def examples(dataset: Dataset, n: int = 3) -> list[Mapping[str, str]]:
    """Up to ``n`` (original, vague) pairs of a data set prepared with ``test_copy``."""
    vague = dataset.queries[dataset.queries["split"] == VAGUE_SPLIT].head(n)
    text_of = dict(zip(dataset.queries["query_id"], dataset.queries["text"]))
    return [{"query": text_of[q[: -len(VAGUE_SUFFIX)]], "vague": t} for q, t in zip(vague["query_id"], vague["text"])]
