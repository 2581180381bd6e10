"""Keyword normalisation and parsing of a generator's raw output into a keyword list.

CoGR matches queries and items by *exact* keyword overlap, so every keyword on both sides
passes through :func:`normalize_keyword` (NFKC, lower case, inner whitespace collapsed,
punctuation trimmed at both ends). A phrase stays one keyword ("family tree").

:func:`parse_keywords` is deliberately tolerant of what small instruction models write
around a comma-separated list (a "Keywords:" prefix, numbering, bullets, quotes, one
keyword per line, a trailing explanation) but never hides a failure: output with nothing
usable in it comes back as ``ok=False`` with a reason, not as an empty list.

``strict=True`` is the rule the CoGR rewards use (reward -1 for anything else): the output
must be a keyword list and nothing but one. Accepted, as in the tolerant mode: separators
(comma, semicolon, ideographic comma, pipe, tab, newline), one bare label in front
(``Keywords:``, ``Tags -``), bullets or numbering, quotes, a code fence, a trailing full
stop, a closed ``<think>...</think>`` block in front (a reasoning model's format; skipped,
its length is bounded by the token budget). Refused, each with its reason in ``error``:

- a chat preamble: the output opens with a chat opener ("Sure!", "Certainly,", "Of course",
  "Okay.", "Here is/are ...", "I'd/I'll/I can ...", "As an AI ...", "Below is ...");
- prose anywhere: a segment of more than :data:`MAX_WORDS_PER_KEYWORD` words, a segment
  opening like a sentence ("This tool ...", "These keywords ...", "Note: ..."), or a
  sentence break followed by such prose ("a, b. These keywords cover ...");
- an unfinished ``<think>`` block.

The tolerant mode (indexing, evaluation, Algorithm 1 seeds) reads the same outputs kindly:
it drops the preamble and the trailing explanation and keeps the keywords between them.
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
# A bare label in front of the list ("Keywords:", "Final search terms -"): allowed in both modes.
_LABEL = re.compile(
    r"^\s*(?:the\s+)?(?:final\s+)?(?:search\s+)?"
    r"(?:keywords?|key\s*words?|keyword\s+list|key\s*phrases?|tags?|terms?|output|answer)"
    r"\s*(?:\([^)\n]*\))?\s*[:：=\-]\s*",
    re.IGNORECASE,
)
# A chat preamble opening the output: "Sure! Here are the keywords:", "Certainly.", "Here is
# the list:", "I'd suggest: ...". Single-word openers count only when punctuation follows
# them (or they are the whole line), so that a keyword such as "ok google" stays a keyword.
_CHAT_OPENER = re.compile(
    r"^\s*(?:(?:sure|certainly|of\s+course|okay|ok|absolutely|alright|all\s+right|great|hello|hi|yes|"
    r"no\s+problem|happy\s+to\s+help)\s*(?:[!.,:;—–-]|$)"
    r"|here(?:'s|’s|\s+is|\s+are)\b|i(?:'d|’d|'ll|’ll|'m|’m|\s+would|\s+will|\s+can|\s+have|\s+think|\s+suggest)\b"
    r"|as\s+an\s+ai\b|below\s+(?:is|are)\b)",
    re.IGNORECASE,
)
# Where a preamble ends: its colon ("Sure! Here are the keywords: a, b").
_PREAMBLE_END = re.compile(r"^[^:：\n]*[:：]\s*")
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL | re.IGNORECASE)
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

    ``ok`` is False when no usable keyword was found or, in strict mode, when the output is
    not a keyword list; ``error`` then says why and ``keywords`` is empty.
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


def parse_keywords(text: str, *, strict: bool = False) -> ParsedKeywords:
    """Parse raw generator output into normalised, de-duplicated keywords (order kept).

    Accepted shapes: ``a, b, c``; ``Keywords: a, b``; numbered or bulleted lines, one
    keyword (or a comma list) per line; quoted keywords. Separators: comma, semicolon,
    ideographic comma, pipe, tab, newline. Tolerant mode (default): a chat preamble and an
    explanation after the list (a line or sentence of prose) are dropped. ``strict=True``:
    either makes the output "not a keyword list" (``ok=False``; see the module docstring).
    """
    if not isinstance(text, str):
        return ParsedKeywords((), False, f"expected a string, got {type(text).__name__}")
    if not text.strip():
        return ParsedKeywords((), False, "empty output")

    def refuse(reason: str) -> ParsedKeywords:
        return ParsedKeywords((), False, f"not a keyword list: {reason}")

    text = unicodedata.normalize("NFKC", text)
    think = _THINK.match(text)
    if think is not None:
        text = text[think.end():]
    elif text.lstrip()[:7].lower() == "<think>":
        if strict:
            return refuse("unfinished <think> block")
        text = text.lstrip()[7:]
    keywords: list[str] = []
    seen: set[str] = set()
    lines = text.splitlines()
    first_content = True
    for line in lines:
        if _CODE_FENCE.match(line):
            continue
        if not line.strip():
            continue
        if first_content:
            first_content = False
            opener = _CHAT_OPENER.match(line)
            if opener is not None:
                if strict:
                    return refuse(f"chat preamble {line.strip()[:40]!r}")
                # The preamble runs to its colon, else to the first separator, else the line's end.
                end = _PREAMBLE_END.match(line) or _SEPARATORS.search(line)
                if end is None:
                    continue
                line = line[end.end():]
            else:
                line = _LABEL.sub("", line, count=1)
        line = _BULLET.sub("", line, count=1)
        if not line.strip():
            continue
        # Prose after the list has started ends the list; prose before it is skipped. (Strict
        # mode judges each segment instead, so that "i 95, traffic" stays a list.)
        if not strict and keywords and _PROSE_START.match(line):
            break
        stop = False
        for raw in _SEPARATORS.split(line):
            # A sentence break needs . ! or ?: skip the regex for the usual plain keyword.
            brk = _SENTENCE_BREAK.search(raw) if ("." in raw or "!" in raw or "?" in raw) else None
            if brk is not None and _looks_like_prose(raw[brk.end():]):
                # "x. These keywords ..." keeps x and stops at the explanation; an
                # abbreviation ("u.s. history") is not a sentence break.
                if strict:
                    return refuse(f"prose {raw[brk.end():].strip()[:40]!r}")
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
                if strict:
                    return refuse(f"prose {segment[:40]!r}")
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
