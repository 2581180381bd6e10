"""Keyword normalisation and tolerant parsing of generator output."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
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


# -- strict mode: the rule the CoGR rewards use (anything refused here gets reward -1) ---------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("family tree, genealogy, ancestry", ("family tree", "genealogy", "ancestry")),
        ("Keywords: Family Tree, genealogy", ("family tree", "genealogy")),
        ("weather, forecast, temperature.", ("weather", "forecast", "temperature")),
        ("1. weather\n2. forecast", ("weather", "forecast")),
        ("- flights\n- hotels", ("flights", "hotels")),
        ("```\npdf, ocr\n```", ("pdf", "ocr")),
        ("<think>\n\n</think>\n\nflight, hotel", ("flight", "hotel")),
        ("u.s. history, c#, node.js", ("u.s. history", "c#", "node.js")),
        ("i 95, traffic, ok google", ("i 95", "traffic", "ok google")),
    ],
)
def test_strict_parse_accepts_plain_keyword_lists(text: str, expected: tuple[str, ...]) -> None:
    assert parse_keywords(text, strict=True) == ParsedKeywords(expected, True, None)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Sure! Here is my explanation", "chat preamble"),
        ("Sure! Here are the keywords: a, b, c", "chat preamble"),
        ("Certainly, weather, forecast", "chat preamble"),
        ("Here are the keywords: pdf, ocr", "chat preamble"),
        ("I'd suggest: pdf, ocr", "chat preamble"),
        ("a, b, c. These keywords capture the intent of the query.", "prose"),
        ("a, b\n\nExplanation: these cover the main topics of the item", "prose"),
        ("a, b, and here is a long sentence that explains the list", "prose"),
        ("This item is a tool that helps people to find things online.", "prose"),
        ("<think>the user wants a weather tool so", "unfinished <think>"),
        ("", "empty"),
    ],
)
def test_strict_parse_refuses_what_is_not_a_keyword_list(text: str, reason: str) -> None:
    parsed = parse_keywords(text, strict=True)
    assert parsed.ok is False and parsed.keywords == ()
    assert reason in parsed.error


def test_tolerant_parse_drops_a_chat_preamble() -> None:
    """Indexing reads the same outputs kindly: the preamble goes, the list stays; prose alone
    is no list ("Sure! Here is my explanation" was once parsed as the keyword "sure")."""
    assert parse_keywords("Sure! Here are the keywords: a, b").keywords == ("a", "b")
    assert parse_keywords("Certainly, weather, forecast").keywords == ("weather", "forecast")
    assert parse_keywords("Sure! Here is my explanation").ok is False


_CHAT_WORDS = {"sure", "certainly", "okay", "ok", "absolutely", "alright", "great", "hello", "hi", "yes", "below", "as"}


@settings(max_examples=200, deadline=None)
@given(st.lists(_KEYWORD, min_size=1, max_size=12))
def test_strict_parse_round_trips_a_comma_list(keywords: list[str]) -> None:
    # A list that opens with a chat opener ("sure, ...", "ok, ...") is a preamble by design.
    assume(keywords[0].split()[0] not in _CHAT_WORDS)
    parsed = parse_keywords(", ".join(keywords), strict=True)
    assert parsed.ok, parsed.error
    assert parsed.keywords == tuple(dict.fromkeys(keywords))
