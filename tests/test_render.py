"""Tool rendering in the five CoHyDE formats."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from coevo.data.render import FORMATS, render_all, render_random, render_tool

ROW = {
    "item_id": "suivi-colis::Latest",
    "title": "suivi-colis Latest",
    "text": "The current state of the parcel.",
    "category": "Logistics",
    "tool_name": "suivi-colis",
    "api_name": "Latest",
    "api_description": "The current state of the parcel.",
    "tool_description": "Track parcels sent by La Poste.",
    "parameters": json.dumps([{"name": "colisId", "type": "string", "description": "parcel id", "required": True}]),
}


def test_five_formats_in_order():
    assert FORMATS == ("title", "title_api", "title_api_tool", "title_api_desc", "full")
    texts = render_all(ROW)
    assert texts[0] == "suivi-colis"
    assert texts[1] == "suivi-colis: Latest"
    assert texts[2] == "suivi-colis: Latest. Track parcels sent by La Poste."
    assert texts[3] == "suivi-colis: Latest. The current state of the parcel."
    full = texts[4].splitlines()
    assert full == [
        "Category: Logistics",
        "Tool: suivi-colis",
        "Tool description: Track parcels sent by La Poste.",
        "API: Latest",
        "API description: The current state of the parcel.",
        "Parameters: colisId (string, required): parcel id",
    ]
    assert len(set(texts)) == 5


def test_empty_tool_description_keeps_names_and_nan_is_empty():
    row = pd.Series({**ROW, "tool_description": float("nan"), "parameters": ""})
    assert render_tool(row, "title_api_tool") == "suivi-colis: Latest"
    assert "Tool description" not in render_tool(row, "full")
    assert "Parameters" not in render_tool(row, "full")


def test_required_optional_layout_and_fallback_to_title_text():
    row = {"item_id": "x", "title": "Weather", "text": "Forecasts", "parameters": json.dumps(
        {"required": [{"name": "city", "type": "str"}], "optional": [{"name": "days"}]})}
    assert render_tool(row, "title_api_desc") == "Weather. Forecasts"
    assert render_tool(row, "full").splitlines()[-1] == "Parameters: city (str, required); days (optional)"


def test_bad_input_names_the_item():
    with pytest.raises(ValueError, match="unknown tool format 'json'"):
        render_tool(ROW, "json")
    with pytest.raises(ValueError, match="suivi-colis::Latest.*parameters.*not valid JSON"):
        render_tool({**ROW, "parameters": "{oops"}, "full")
    with pytest.raises(ValueError, match="item 'z'.*tool_name"):
        render_tool({"item_id": "z", "title": " "}, "title")


def test_random_format_is_seeded_and_covers_all():
    seen_a = [render_random(ROW, random.Random(7)) for _ in range(3)]
    assert len(set(seen_a)) == 1  # same seed, same draw
    rng = random.Random(0)
    assert set(render_random(ROW, rng) for _ in range(200)) == set(render_all(ROW))
