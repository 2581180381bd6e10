"""Chat prompts for CoGR's two keyword generators (GRAPE and CoHyDE keep theirs in their modules).

Each builder returns chat messages; the generator applies the model's chat template.
Descriptions are cut to ``max_description_chars`` so prompts stay short on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

Messages = list[dict[str, str]]

QUERY_SYSTEM = (
    "You expand search queries into keywords. Answer with one line: a comma-separated list of "
    "short keywords or key phrases. No explanation, no numbering."
)
ITEM_SYSTEM = (
    "You index items for search. Answer with one line: a comma-separated list of short keywords "
    "or key phrases describing the item. No explanation, no numbering."
)
MAX_DESCRIPTION_CHARS = 400


def query_messages(query: str) -> Messages:
    """Query side: expand a user query into a comma-separated keyword list."""
    return [
        {"role": "system", "content": QUERY_SYSTEM},
        {"role": "user", "content": f"Query: {query.strip()}\nKeywords:"},
    ]


def item_messages(title: str, description: str = "", *, max_description_chars: int = MAX_DESCRIPTION_CHARS) -> Messages:
    """Item side: extract keywords from an item's title and description, list only."""
    description = " ".join((description or "").split())
    if len(description) > max_description_chars:
        description = description[:max_description_chars].rsplit(" ", 1)[0] + " ..."
    body = f"Title: {title.strip()}"
    if description:
        body += f"\nDescription: {description}"
    return [
        {"role": "system", "content": ITEM_SYSTEM},
        {"role": "user", "content": f"{body}\nKeywords:"},
    ]


def keyword_completion(keywords: Sequence[str]) -> Messages:
    """The assistant turn that SFT teaches: the keywords joined by ', '."""
    return [{"role": "assistant", "content": ", ".join(keywords)}]
