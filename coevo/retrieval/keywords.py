"""Keyword normalisation and parsing of a generator's raw output into a keyword list.

CoGR matches queries and items by *exact* keyword overlap, so every keyword on both sides
passes through :func:`normalize_keyword` (NFKC, lower case, inner whitespace collapsed,
punctuation trimmed at both ends). A phrase stays one keyword ("family tree").

:func:`parse_keywords` is deliberately tolerant of what small instruction models write
around a comma-separated list (a "Keywords:" prefix, numbering, bullets, quotes, one
keyword per line, a trailing explanation) but never hides a failure: output with nothing
usable in it comes back as ``ok=False`` with a reason, not as an empty list.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

# Trailing characters kept although Unicode calls them punctuation: they carry meaning
# at the end of a term ("c#", "100%").
_KEEP_TRAILING = frozenset("#%")
# Symbols that markdown-happy models wrap keywords in; trimmed like punctuation.
_EXTRA_TRIM = frozenset("`~|^<>=")

_WHITESPACE = re.compile(r"\s+")
_PREFIX = re.compile(
    r"^\s*(?:here\s+(?:are|is)\b[^:\n]*|(?:the\s+)?(?:final\s+)?(?:search\s+)?"
    r"(?:keywords?|key\s*words?|keyword\s+list|key\s*phrases?|tags?|terms?|output|answer))"
    r"\s*(?:\([^)\n]*\))?\s*[:：=\-]\s*",
    re.IGNORECASE,
)
_BULLET = re.compile(r"^\s*(?:[-*•·‣◦▪►]+|\(?\d{1,3}\s*[.)\]:]|\d{1,3}\s+-)\s*")
_SEPARATORS = re.compile(r"[,;，；、|\t]")
# A sentence break inside a segment ("ancestry. These keywords ..."): the rest is prose.
_SENTENCE_BREAK = re.compile(r"[.!?]\s+(?=\S)")
# Start of an explanation: a labelled note, or a sentence opener followed by >= 2 words
# (so that short keywords such as "i 95" or "this week" stay keywords).
_PROSE_START = re.compile(
    r"^\s*(?:(?:explanation|note|notes|reason|reasoning)\s*:|"
    r"(?:these|this|because|hope|the\s+above|the\s+keywords?|here\s+(?:are|is)|let\s+me|i)\s+\S+\s+\S+)",
    re.IGNORECASE,
)
_PROSE_INITIALS = frozenset("tenbhilr")  # first letters of the _PROSE_START words
_CODE_FENCE = re.compile(r"^\s*```[\w-]*\s*$")

# A "keyword" longer than this many words is a sentence, not a keyword.
MAX_WORDS_PER_KEYWORD = 6


def _is_trimmable(ch: str, *, trailing: bool) -> bool:
    if ch.isspace() or ch in _EXTRA_TRIM:
        return True
    if trailing and ch in _KEEP_TRAILING:
        return False
    return unicodedata.category(ch).startswith("P")


# The same trimming rules for ASCII text, as str.strip character sets (the hot path).
_ASCII_TRIM_LEAD = "".join(
    chr(c) for c in range(128) if _is_trimmable(chr(c), trailing=False)
)
_ASCII_TRIM_TRAIL = "".join(ch for ch in _ASCII_TRIM_LEAD if ch not in _KEEP_TRAILING)


@functools.lru_cache(maxsize=1 << 18)
def normalize_keyword(s: str) -> str:
    """NFKC, lower case, collapse inner whitespace, trim punctuation at both ends.

    Idempotent: ``normalize_keyword(normalize_keyword(s)) == normalize_keyword(s)``.
    Returns "" when nothing but punctuation and whitespace is left.
    """
    if s.isascii():
        # ASCII is NFKC-stable: only case, trimming and whitespace remain.
        text = s.lower().lstrip(_ASCII_TRIM_LEAD).rstrip(_ASCII_TRIM_TRAIL)
        return " ".join(text.split()) if not text.isalnum() else text
    text = unicodedata.normalize("NFKC", s).lower()
    # Lower-casing can produce characters NFKC would rewrite again (rare: e.g. U+0130).
    text = unicodedata.normalize("NFKC", text)
    start, end = 0, len(text)
    while start < end and _is_trimmable(text[start], trailing=False):
        start += 1
    while end > start and _is_trimmable(text[end - 1], trailing=True):
        end -= 1
    return _WHITESPACE.sub(" ", text[start:end])


@dataclass(frozen=True)
class ParsedKeywords:
    """Result of parsing one generator output.

    ``ok`` is False exactly when no usable keyword was found; ``error`` then says why.
    """

    keywords: tuple[str, ...]
    ok: bool
    error: str | None = None

    def __len__(self) -> int:
        return len(self.keywords)


def _looks_like_prose(segment: str) -> bool:
    # Cheap pre-checks first: this runs for every keyword of every GRPO completion.
    if segment.count(" ") >= MAX_WORDS_PER_KEYWORD and len(segment.split()) > MAX_WORDS_PER_KEYWORD:
        return True
    first = segment.lstrip()[:1].lower()
    return bool(first) and first in _PROSE_INITIALS and bool(_PROSE_START.match(segment))


def parse_keywords(text: str) -> ParsedKeywords:
    """Parse raw generator output into normalised, de-duplicated keywords (order kept).

    Accepted shapes: ``a, b, c``; ``Keywords: a, b``; numbered or bulleted lines, one
    keyword (or a comma list) per line; quoted keywords; a trailing explanation after the
    list (a line or sentence of prose), which is dropped. Separators: comma, semicolon,
    ideographic comma, pipe, tab, newline.
    """
    if not isinstance(text, str):
        return ParsedKeywords((), False, f"expected a string, got {type(text).__name__}")
    if not text.strip():
        return ParsedKeywords((), False, "empty output")

    keywords: list[str] = []
    seen: set[str] = set()
    lines = unicodedata.normalize("NFKC", text).splitlines()
    first_content = True
    for line in lines:
        if _CODE_FENCE.match(line):
            continue
        if not line.strip():
            continue
        if first_content:
            line = _PREFIX.sub("", line, count=1)
            first_content = False
        line = _BULLET.sub("", line, count=1)
        if not line.strip():
            continue
        # Prose after the list has started ends the list; prose before it is skipped.
        if _PROSE_START.match(line) and keywords:
            break
        stop = False
        for raw in _SEPARATORS.split(line):
            # A sentence break needs . ! or ?: skip the regex for the usual plain keyword.
            brk = _SENTENCE_BREAK.search(raw) if ("." in raw or "!" in raw or "?" in raw) else None
            if brk is not None and _looks_like_prose(raw[brk.end():]):
                # "x. These keywords ..." keeps x and stops at the explanation; an
                # abbreviation ("u.s. history") is not a sentence break.
                raw, stop = raw[: brk.start()], True
            segment = raw.strip()
            if not segment:
                if stop:
                    break
                continue
            # Inline pre-check of _looks_like_prose (segment is stripped and non-empty).
            if (
                segment.count(" ") >= MAX_WORDS_PER_KEYWORD or segment[0].lower() in _PROSE_INITIALS
            ) and _looks_like_prose(segment):
                if keywords:
                    stop = True
                    break
                continue
            keyword = normalize_keyword(segment)
            if keyword and keyword not in seen:
                seen.add(keyword)
                keywords.append(keyword)
            if stop:
                break
        if stop:
            break

    if not keywords:
        return ParsedKeywords((), False, "no keywords found (only prose or punctuation)")
    return ParsedKeywords(tuple(keywords), True, None)
