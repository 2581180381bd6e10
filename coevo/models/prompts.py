"""Chat messages: CoGR's keyword prompts and reading a completion back as text.

Each builder returns chat messages; the generator applies the model's chat template.
Descriptions are cut to ``max_description_chars`` so prompts stay short on CPU (GRAPE and
CoHyDE keep their prompts in their modules). :func:`completion_text` is the one place that
turns a TRL completion (plain or conversational) into the text a reward scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Messages = list[dict[str, str]]

QUERY_SYSTEM = (
    "You expand search queries into keywords. Answer with one line: a comma-separated list of "
    "short keywords or key phrases. No explanation, no numbering."
)
ITEM_SYSTEM = (
    "You index items for search. Answer with one line: a comma-separated list of short keywords "
    "or key phrases describing the item. No explanation, no numbering."
)
# One line each (cogr.system_prompt = short): every SFT and GRPO step pays for a system prompt's
# tokens, and a fine-tuned model learns the answer's form from its targets (36 -> 10 SmolLM2 tokens).
QUERY_SYSTEM_SHORT = "List search keywords for the query, comma-separated."
ITEM_SYSTEM_SHORT = "List search keywords for the item, comma-separated."
SYSTEM_PROMPTS = {"full": (QUERY_SYSTEM, ITEM_SYSTEM), "short": (QUERY_SYSTEM_SHORT, ITEM_SYSTEM_SHORT)}
MAX_DESCRIPTION_CHARS = 400


def query_messages(query: str, system: str = QUERY_SYSTEM) -> Messages:
    """Query side: expand a user query into a comma-separated keyword list."""
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Query: {query.strip()}\nKeywords:"},
    ]


def item_messages(title: str, description: str = "", *, max_description_chars: int = MAX_DESCRIPTION_CHARS,
                  system: str = ITEM_SYSTEM) -> Messages:
    """Item side: extract keywords from an item's title and description, list only."""
    description = " ".join((description or "").split())
    if len(description) > max_description_chars:
        description = description[:max_description_chars].rsplit(" ", 1)[0] + " ..."
    body = f"Title: {title.strip()}"
    if description:
        body += f"\nDescription: {description}"
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"{body}\nKeywords:"},
    ]


def keyword_completion(keywords: Sequence[str]) -> Messages:
    """The assistant turn that SFT teaches: the keywords joined by ', '."""
    return [{"role": "assistant", "content": ", ".join(keywords)}]


def _message_text(content: Any) -> str:
    """A message's ``content``: a string, None (a tool-call-only turn), or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # multimodal parts: [{"type": "text", "text": ...}, {"type": "image"}]
        return "".join(
            str(part.get("text") or "") if isinstance(part, Mapping) else str(part)
            for part in content
            if not isinstance(part, Mapping) or part.get("type", "text") == "text"
        )
    return str(content)


def completion_text(completion: Any) -> str:
    """The text a reward scores in one TRL completion.

    TRL passes a reward function either a plain string (standard prompts) or, for
    conversational prompts, a list of messages: normally one
    ``{"role": "assistant", "content": ...}``; with tools, the assistant's tool-call turns
    and the ``{"role": "tool", ...}`` results, then the final assistant turn (which may be
    missing when generation was cut). The choice made here:

    - a string is returned as is (no stripping: parsers decide about whitespace);
    - a message list gives the content of its LAST assistant message (a message without a
      role counts as the model's): the model's final answer. Tool results are not the
      model's text and earlier turns are not its answer, so neither is scored, and
      contents are never concatenated across messages;
    - no assistant message, an empty list, or ``content`` None (a tool-call-only turn)
      give ``""``, which every parser treats as malformed (minimum reward);
    - ``content`` given as a list of parts (multimodal chat) gives its text parts joined;
    - one message mapping is read like a one-message list;
    - anything else (None, bytes, numbers, a list of non-messages) raises TypeError: a
      wiring mistake must fail loudly, not score every completion as malformed.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        completion = [completion]
    if isinstance(completion, Sequence) and not isinstance(completion, (bytes, bytearray)):
        if not all(isinstance(message, Mapping) for message in completion):
            kinds = sorted({type(m).__name__ for m in completion if not isinstance(m, Mapping)})
            raise TypeError(f"completion_text: a conversational completion holds messages (dicts), got {', '.join(kinds)}")
        for message in reversed(completion):
            if message.get("role", "assistant") == "assistant":
                return _message_text(message.get("content"))
        return ""
    raise TypeError(f"completion_text: cannot read a completion of type {type(completion).__name__}")
