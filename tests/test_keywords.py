"""Keyword normalisation and tolerant parsing of generator output."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevo.retrieval.keywords import ParsedKeywords, normalize_keyword, parse_keywords


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Family  Tree", "family tree"),
        ("  \"genealogy\"  ", "genealogy"),
        ("ＡＰＩ　Ｋｅｙ", "api key"),  # full-width letters and space (NFKC)
        ("**flights**", "flights"),
        ("`hotel`", "hotel"),
        ("(weather).", "weather"),
        ("c#", "c#"),
        ("C++", "c++"),
        ("node.js", "node.js"),
        ("100%", "100%"),
        ("e-mail", "e-mail"),
        ("Ｃａｆé\tau\nlait", "café au lait"),
        ("...", ""),
        ("", ""),
    ],
)
def test_normalize_keyword(raw: str, expected: str) -> None:
    assert normalize_keyword(raw) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_normalize_is_idempotent(raw: str) -> None:
    once = normalize_keyword(raw)
    assert normalize_keyword(once) == once
    assert once == once.strip()
    assert "  " not in once


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("family tree, genealogy, ancestry", ("family tree", "genealogy", "ancestry")),
        ("Keywords: Family Tree, genealogy", ("family tree", "genealogy")),
        ("keywords - a; b; c", ("a", "b", "c")),
        ("1. weather\n2. forecast\n3) rain", ("weather", "forecast", "rain")),
        ("- flights\n* hotels\n• car rental", ("flights", "hotels", "car rental")),
        ('"stock price", \'market data\', “finance”', ("stock price", "market data", "finance")),
        ("a, b\nc, d", ("a", "b", "c", "d")),
        ("a, b, c. These keywords capture the intent of the query.", ("a", "b", "c")),
        ("a, b\n\nExplanation: these cover the main topics of the item", ("a", "b")),
        ("a, b, and here is a long sentence that explains the list", ("a", "b")),
        ("Here are the keywords: pdf, ocr", ("pdf", "ocr")),
        ("```\npdf, ocr\n```", ("pdf", "ocr")),
        ("A, a, A., b, a", ("a", "b")),  # de-duplicated after normalisation, order kept
        ("u.s. history, c#, node.js", ("u.s. history", "c#", "node.js")),
        ("tree,, ,genealogy,", ("tree", "genealogy")),
    ],
)
def test_parse_keywords(text: str, expected: tuple[str, ...]) -> None:
    parsed = parse_keywords(text)
    assert parsed == ParsedKeywords(expected, True, None)
    assert len(parsed) == len(expected)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("   \n\t ", "empty"),
        ("..., ;;; !!", "no keywords"),
        ("This item is a tool that helps people to find things online.", "no keywords"),
        (None, "expected a string"),
    ],
)
def test_parse_failures_are_explicit(text, reason: str) -> None:
    parsed = parse_keywords(text)
    assert parsed.ok is False
    assert parsed.keywords == ()
    assert parsed.error is not None and reason in parsed.error


# Phrases opening like a sentence ("i ...", "this ...", "these ...") with >= 3 words are read
# as an explanation by design, so the generator avoids those openers.
_OPENERS = {"i", "this", "these", "because", "hope", "the", "here", "let"}
_KEYWORD = st.from_regex(r"[a-z][a-z0-9]{0,6}( [a-z0-9]{1,5}){0,2}", fullmatch=True).filter(
    lambda k: k.split()[0] not in _OPENERS
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_KEYWORD, min_size=1, max_size=12))
def test_parse_round_trips_a_comma_list(keywords: list[str]) -> None:
    parsed = parse_keywords(", ".join(keywords))
    assert parsed.ok
    assert parsed.keywords == tuple(dict.fromkeys(keywords))
