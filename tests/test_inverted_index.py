"""Keyword inverted index: set retrieval, both directions, persistence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevo.retrieval.inverted_index import InvertedIndex, gather_rows, unique_positions
from coevo.retrieval.keywords import normalize_keyword

ITEMS = {
    "i1": ["Family Tree", "genealogy"],
    "i2": ["weather", "rain", "weather"],  # duplicate keyword counts once
    "i3": [],  # listed, never retrieved
    "i4": ["tree", "  Rain. "],
}


def test_retrieve_every_doc_sharing_a_keyword() -> None:
    index = InvertedIndex.from_keyword_sets(ITEMS)
    assert index.retrieve(["family tree"]) == {"i1"}  # a phrase is one keyword
    assert index.retrieve(["tree"]) == {"i4"}
    assert index.retrieve(["RAIN"]) == {"i2", "i4"}  # normalised on both sides
    assert index.retrieve(["genealogy", "rain", "unknown"]) == {"i1", "i2", "i4"}
    assert index.retrieve([]) == set()
    assert index.retrieve(["nothing"]) == set()


def test_accessors() -> None:
    index = InvertedIndex.from_keyword_sets(ITEMS)
    assert index.doc_ids == ("i1", "i2", "i3", "i4")
    assert len(index) == 4 and "i3" in index and "x" not in index
    assert index.keywords_of("i1") == ("family tree", "genealogy")
    assert index.keywords_of("i2") == ("rain", "weather")
    assert index.keywords_of("i3") == ()
    with pytest.raises(KeyError, match="'nope' is not in the index"):
        index.keywords_of("nope")
    with pytest.raises(TypeError):
        index.retrieve("rain")
    with pytest.raises(TypeError, match="i9"):
        InvertedIndex.from_keyword_sets({"i9": "rain, tree"})


def test_query_direction_keyword_to_queries() -> None:
    queries = InvertedIndex.from_keyword_sets({"q1": ["rain", "umbrella"], "q2": ["family tree"], "q3": ["rain"]})
    # Q(S_i): the queries an item keyword set reaches, as the item-side reward needs.
    assert queries.retrieve(InvertedIndex.from_keyword_sets(ITEMS).keywords_of("i4")) == {"q1", "q3"}
    ids = queries.keyword_ids(["rain", "family tree", "zzz"])
    assert sorted(queries.doc_ids[p] for p in queries.retrieve_positions(ids)) == ["q1", "q2", "q3"]


def test_save_load_round_trip_plain_sorted_json_lines(tmp_path: Path) -> None:
    index = InvertedIndex.from_keyword_sets({"b": ["z", "a"], "a": ["m"], "c": []})
    path = index.save(tmp_path / "sub" / "index.jsonl")
    lines = path.read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"id": "a", "keywords": ["m"]},
        {"id": "b", "keywords": ["a", "z"]},
        {"id": "c", "keywords": []},
    ]
    assert sorted(p.name for p in path.parent.iterdir()) == ["index.jsonl"]  # no temp file left
    loaded = InvertedIndex.load(path)
    assert loaded.keyword_sets() == index.keyword_sets()
    assert loaded.retrieve(["a", "m"]) == {"a", "b"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"id": "a", "keywords": ["x"]}\nnot json\n', "line 2: invalid JSON"),
        ('{"id": "a", "keywords": "x"}\n', "line 1: expected"),
        ('{"id": "a", "keywords": ["x"]}\n{"id": "a", "keywords": []}\n', "line 2: duplicate id 'a'"),
        ('{"id": "a", "keywords": [1]}\n', "line 1: keywords of 'a' must be strings"),
    ],
)
def test_load_rejects_bad_files_naming_the_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        InvertedIndex.load(path)
    assert str(path) in str(info.value)


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        InvertedIndex.load(tmp_path / "none.jsonl")


def test_gather_rows_and_unique_positions() -> None:
    indptr = np.array([0, 2, 2, 5])
    indices = np.array([7, 8, 1, 2, 3])
    assert gather_rows(indptr, indices, np.array([2, 0, 1])).tolist() == [1, 2, 3, 7, 8]
    assert gather_rows(indptr, indices, np.array([], dtype=np.int64)).tolist() == []
    assert unique_positions(np.array([3, 1, 3, 0]), 4).tolist() == [0, 1, 3]  # mask path
    assert unique_positions(np.array([30, 1, 30]), 1000).tolist() == [1, 30]  # sort path


_KW = st.sampled_from(["a", "b", "c", "d", "e", "f g", "H", " a "])


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text("xyz", min_size=1, max_size=3), st.lists(_KW, max_size=5), max_size=8),
    st.lists(_KW, max_size=5),
)
def test_retrieve_matches_brute_force(docs: dict[str, list[str]], query: list[str]) -> None:
    index = InvertedIndex.from_keyword_sets(docs)
    wanted = {normalize_keyword(k) for k in query}
    expected = {d for d, kws in docs.items() if wanted & {normalize_keyword(k) for k in kws}}
    assert index.retrieve(query) == expected
