"""Extractive keyword seeds: an alternative G_0 for CoGR's Algorithm 1 (``cogr.seed_generator: yake``).

The paper's G_0 is an LLM. A 135M model on a CPU writes about 3 of the M keywords asked for,
mostly the item's own name, and leaves some items with none (issue 12's diagnosis). YAKE
(Campos et al., 2020) reads the item's title and description and returns its M most
characteristic key phrases, deterministically and in milliseconds, so every item gets M
seeds. Runs that use it say so (the seed summary and the efficacy table name the G_0).
"""

from __future__ import annotations

from collections.abc import Sequence

from coevo.retrieval.keywords import normalize_keyword

YAKE = "yake"
EXTRACTIVE_SEEDERS = (YAKE,)
# Key phrases of up to two words: longer YAKE phrases are mostly sentence fragments.
MAX_NGRAM = 2
# YAKE's own de-duplication threshold (Levenshtein-based); 0.7 drops near-repeats such as
# "air quality" next to "air quality forecast".
DEDUP_THRESHOLD = 0.7


def is_extractive(name: str | None) -> bool:
    return name in EXTRACTIVE_SEEDERS


def extract_keywords(titles: Sequence[str], texts: Sequence[str], m: int) -> list[list[str]]:
    """For each (title, text): its normalised title first (so no item is ever left without a
    keyword), then YAKE's best-scored key phrases of the text, up to ``m`` distinct ones."""
    import yake

    if len(titles) != len(texts):
        raise ValueError(f"extract_keywords: {len(titles)} titles but {len(texts)} texts")
    extractor = yake.KeywordExtractor(lan="en", n=MAX_NGRAM, top=2 * m, dedup_lim=DEDUP_THRESHOLD)
    out = []
    for title, text in zip(titles, texts):
        keywords = [normalize_keyword(title)]
        body = " ".join(str(text or "").split())
        if body:
            keywords += [normalize_keyword(phrase) for phrase, _score in extractor.extract_keywords(body)]
        out.append(list(dict.fromkeys(k for k in keywords if k))[:m])
    return out
