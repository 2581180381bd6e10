"""Loaders: the committed samples and fixtures always; the full public sets when ../shared/data exists."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from coevo.data.loaders import LOADERS, load_source
from coevo.data.schema import SPLITS
from tests.conftest import REPO_ROOT, SAMPLE_DIR, shared_data

FIXTURES = REPO_ROOT / "tests" / "fixtures"


def make_image_captions(root: Path, n_images: int = 6) -> Path:
    """A Flickr8k-CN-shaped folder: captions.tsv + real (tiny) JPEGs."""
    from PIL import Image

    (root / "images").mkdir(parents=True)
    rows = ["image\tsplit\tlang\tidx\tcaption"]
    splits = ["train", "train", "train", "val", "test", ""]
    for n in range(n_images):
        name = f"{1000 + n}_abc.jpg"
        Image.new("RGB", (8, 8), (n * 40 % 256, 80, 160)).save(root / "images" / name)
        for idx in range(2):
            rows.append(f"{name}\t{splits[n % len(splits)]}\ten\t{idx}\tA dog number {n} runs , take {idx} .")
            rows.append(f"{name}\t{splits[n % len(splits)]}\tzh\t{idx}\t一只狗在跑{n}-{idx}。")
    (root / "captions.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


# ------------------------------------------------------------------------------------ happy paths
def test_all_loaders_registered():
    assert set(LOADERS) == {"metatool", "stabletoolbench", "wands", "beir", "image_captions", "prepared"}


def test_a_prepared_folder_loads_with_its_tables_and_splits_and_without_its_vague_copies(tmp_path):
    from coevo.data.vague import with_vague

    prepared = load_source("metatool", SAMPLE_DIR / "metatool", seed=3, name="mine")
    vague = with_vague(prepared, "test_copy")
    assert (vague.queries["split"] == "vague").any()
    vague.save(tmp_path / "mine")
    again = load_source("prepared", tmp_path / "mine", seed=99, val_fraction=0.5, name="again")
    for table in ("items", "queries", "qrels"):  # the folder's own splits, not a new seed's
        pd.testing.assert_frame_equal(getattr(again, table).reset_index(drop=True),
                                      getattr(prepared, table).reset_index(drop=True), check_dtype=False)
    assert again.meta["split"] == "from source" and again.meta["prepared_from"] == "mine"
    with pytest.raises(FileNotFoundError, match=r"queries\.parquet: file does not exist"):
        (tmp_path / "mine" / "queries.parquet").unlink()
        load_source("prepared", tmp_path / "mine")


def test_metatool_sample():
    ds = load_source("metatool", SAMPLE_DIR / "metatool")
    assert len(ds.items) == 40
    assert 300 <= len(ds.queries) <= 400
    assert set(ds.queries["group"]) == {"all_clean_data", "multi_tool_query_golden"}
    counts = ds.queries["split"].value_counts()
    assert counts["train"] > 200 and 80 <= counts["val"] + counts["test"] <= 130
    # multi-tool queries have both their tools as relevant items
    multi = ds.queries[ds.queries["group"] == "multi_tool_query_golden"]["query_id"]
    relevant = ds.relevant()
    assert all(len(relevant[q]) == 2 for q in multi)
    assert ds.grades == (1,)
    # every qrel names a tool of the corpus, every text is non-empty
    assert set(ds.qrels["item_id"]) <= set(ds.items["item_id"])
    assert ds.queries["text"].str.strip().ne("").all()


def test_metatool_query_listed_with_two_tools_is_one_query(tmp_path):
    src = tmp_path / "mt"
    src.mkdir()
    (src / "all_clean_data.csv").write_text(
        "Query,Tool\nBook a table for two,ToolA\nBook a table for two,ToolB\n\"Weather, tomorrow?\",ToolB\n"
    )
    (src / "plugin_des.json").write_text(json.dumps({"ToolA": "Restaurants.", "ToolB": "Weather and bookings.", "ToolC": ""}))
    ds = load_source("metatool", src)
    assert len(ds.queries) == 2
    rel = ds.relevant()
    qid = ds.queries.set_index("text").loc["Book a table for two", "query_id"]
    assert rel[qid] == {"ToolA": 1, "ToolB": 1}
    assert list(ds.items["item_id"]) == ["ToolA", "ToolB", "ToolC"]  # ToolC: never relevant, still an item
    assert ds.item_text("ToolA") == "ToolA: Restaurants." and ds.item_text("ToolC") == "ToolC"


def test_metatool_without_multi_tool_option():
    ds = load_source("metatool", SAMPLE_DIR / "metatool", include_multi_tool=False)
    assert set(ds.queries["group"]) == {"all_clean_data"}


def test_stabletoolbench_sample():
    ds = load_source("stabletoolbench", SAMPLE_DIR / "stabletoolbench")
    assert len(ds.queries) == 90
    groups = ds.queries.groupby("group")["split"].value_counts().unstack(fill_value=0)
    assert len(groups) == 6
    assert (groups["val"] > 0).all() and (groups["test"] > 0).all() and (groups["train"] > 0).all()
    for column in ("category", "tool_name", "api_name", "api_description", "tool_description", "parameters"):
        assert column in ds.items.columns
    row = ds.items.iloc[0]
    assert row["item_id"] == f"{row['tool_name']}::{row['api_name']}"
    params = json.loads(row["parameters"])
    assert set(params) == {"required", "optional"}
    assert ds.items["title"].str.strip().ne("").all()  # empty descriptions keep their names
    assert set(ds.qrels["item_id"]) <= set(ds.items["item_id"])


def test_wands_fixture():
    ds = load_source("wands", FIXTURES / "wands")
    assert ds.grades == (0, 1, 2)
    assert len(ds.items) == 12 and len(ds.queries) == 8 and len(ds.qrels) == 22
    assert dict(ds.qrels["grade"].value_counts()) == {0: 11, 2: 8, 1: 3}
    assert ds.items.set_index("item_id").loc["3", "text"] == ""
    assert pd.isna(ds.items.set_index("item_id").loc["2", "average_rating"])
    assert ds.items.set_index("item_id").loc["0", "category"] == "Beds"
    # query 5 has only Irrelevant judgements: it never lands in val/test
    assert ds.queries.set_index("query_id").loc["5", "split"] == "train"
    assert ds.relevant(min_grade=2)["1"] == {"4": 2}
    assert ds.relevant()["1"] == {"4": 2, "3": 1}


def test_beir_fixture():
    ds = load_source("beir", FIXTURES / "beir")
    assert dict(zip(ds.queries["query_id"], ds.queries["split"])) == {
        "q1": "train", "q2": "val", "q3": "test", "q4": "train", "q5": "train",
    }
    assert ds.meta["unjudged_queries_dropped"] == 1
    # An untitled document is titled by its id, never by the start of its text (BM25 would
    # count those words twice); its text is kept as is.
    d3 = ds.items.set_index("item_id").loc["d3"]
    assert d3["title"] == "d3" and d3["text"].startswith("Regular exercise lowers")
    assert ds.meta["untitled_docs"] == 1
    assert ds.grades == (0, 1, 2)
    assert ds.meta["duplicates"] == {} and ds.meta["split"] == "from source"


def test_image_captions(tmp_path):
    src = make_image_captions(tmp_path / "flickr")
    ds = load_source("image_captions", src)
    assert len(ds.items) == 6 and len(ds.queries) == 24
    assert Path(ds.items["image_path"].iloc[0]).is_file()
    assert ds.queries["query_id"].iloc[0] == "1000_abc.jpg#en#0"
    assert set(ds.queries["lang"]) == {"en", "zh"}
    assert ds.items.set_index("item_id").loc["1005_abc.jpg", "split"] == "train"  # empty split -> train
    zh = load_source("image_captions", src, lang="zh")
    assert set(zh.queries["lang"]) == {"zh"} and len(zh.queries) == 12
    with pytest.raises(ValueError, match="no captions in language 'fr'"):
        load_source("image_captions", src, lang="fr")


def test_split_is_deterministic_and_seeded():
    a = load_source("metatool", SAMPLE_DIR / "metatool", seed=1)
    b = load_source("metatool", SAMPLE_DIR / "metatool", seed=1)
    c = load_source("metatool", SAMPLE_DIR / "metatool", seed=2)
    assert a.queries["split"].tolist() == b.queries["split"].tolist()
    assert a.queries["split"].tolist() != c.queries["split"].tolist()
    assert set(a.queries["split"]) == set(SPLITS)


def test_split_fractions_and_validation():
    ds = load_source("metatool", SAMPLE_DIR / "metatool", val_fraction=0.3, test_fraction=0.0)
    assert (ds.queries["split"] == "test").sum() == 0
    assert abs((ds.queries["split"] == "val").mean() - 0.3) < 0.02
    with pytest.raises(ValueError, match="must be < 1"):
        load_source("metatool", SAMPLE_DIR / "metatool", val_fraction=0.6, test_fraction=0.5)


def test_unknown_loader_and_option():
    with pytest.raises(ValueError, match="unknown loader 'nope'"):
        load_source("nope", SAMPLE_DIR / "metatool")
    with pytest.raises(ValueError, match="unknown option"):
        load_source("metatool", SAMPLE_DIR / "metatool", colour="red")


# ------------------------------------------------------------------------------------ full public sets
@pytest.mark.shared_data
def test_metatool_full():
    ds = load_source("metatool", shared_data("metatool"))
    assert len(ds.items) == 199
    assert ds.meta["multi_tool_queries"] == 497
    assert (ds.queries["group"] == "multi_tool_query_golden").sum() == 497


@pytest.mark.shared_data
def test_stabletoolbench_full():
    ds = load_source("stabletoolbench", shared_data("stabletoolbench"))
    assert len(ds.queries) == 765
    assert len(ds.items) == 2479
    assert (ds.items["text"] == "").sum() >= 200  # ~214 APIs have no description, yet all keep a title
    assert ds.items["title"].str.strip().ne("").all()
    assert sorted(set(ds.queries["group"])) == [
        "G1_category", "G1_instruction", "G1_tool", "G2_category", "G2_instruction", "G3_instruction",
    ]


@pytest.mark.shared_data
def test_flickr8k_cn_full():
    ds = load_source("image_captions", shared_data("flickr8k_cn_1k"))
    assert len(ds.items) == 1000 and len(ds.queries) == 10000
    assert ds.items["split"].value_counts().to_dict() == {"train": 753 + 9, "val": 113, "test": 125}


# ------------------------------------------------------------------------------------ bad input
def copy_of(src: Path, tmp_path: Path) -> Path:
    dest = tmp_path / src.name
    shutil.copytree(src, dest)
    return dest


def test_nonexistent_path(tmp_path):
    for loader in LOADERS:
        with pytest.raises(FileNotFoundError, match="does not exist"):
            load_source(loader, tmp_path / "missing")


def test_missing_file(tmp_path):
    src = copy_of(SAMPLE_DIR / "metatool", tmp_path)
    (src / "plugin_des.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"plugin_des\.json: file does not exist"):
        load_source("metatool", src)
    wands = copy_of(FIXTURES / "wands", tmp_path)
    (wands / "label.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing WANDS file\(s\) label\.csv.*--download"):
        load_source("wands", wands)


def test_missing_and_extra_columns(tmp_path):
    src = copy_of(SAMPLE_DIR / "metatool", tmp_path)
    path = src / "all_clean_data.csv"
    path.write_text(path.read_text().replace("Query,Tool", "Query,Tools", 1))
    with pytest.raises(ValueError, match=r"all_clean_data\.csv: missing column\(s\) 'Tool'; unexpected column\(s\) 'Tools'"):
        load_source("metatool", src)
    wands = copy_of(FIXTURES / "wands", tmp_path)
    query = wands / "query.csv"
    query.write_text(query.read_text().replace("query_class\n", "query_class\textra\n", 1).replace("Massage Chairs\n", "Massage Chairs\tx\n"))
    with pytest.raises(ValueError, match=r"query\.csv: unexpected column\(s\) 'extra'"):
        load_source("wands", wands)


def test_row_with_too_many_fields(tmp_path):
    mt = copy_of(SAMPLE_DIR / "metatool", tmp_path)
    path = mt / "all_clean_data.csv"
    lines = path.read_text().splitlines()
    lines[4] = lines[4] + ",surplus"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"all_clean_data\.csv: malformed CSV: .*Expected 2 fields in line 5, saw 3"):
        load_source("metatool", mt)


def test_comma_separated_wands_file_hints_at_tabs(tmp_path):
    wands = copy_of(FIXTURES / "wands", tmp_path)
    query = wands / "query.csv"
    query.write_text(query.read_text().replace("\t", ","))
    with pytest.raises(ValueError, match="is the file tab separated"):
        load_source("wands", wands)


def test_duplicate_ids(tmp_path):
    """A repeated row is a duplicate: dropped and reported (count, first examples naming file and
    row), or refused with duplicates="error". The same id with other content is always an error."""
    wands = copy_of(FIXTURES / "wands", tmp_path)
    product = wands / "product.csv"
    lines = product.read_text().splitlines()
    product.write_text("\n".join(lines + [lines[3]]) + "\n")
    ds = load_source("wands", wands)
    assert len(ds.items) == 12
    assert ds.meta["duplicates"] == {"products": {"count": 1, "examples": [
        "product.csv: row 14: duplicate product_id '2' (first at row 4)"]}}
    with pytest.raises(ValueError, match=r"duplicates = error\): 1 products \(first: product\.csv: row 14: "
                                         r"duplicate product_id '2' \(first at row 4\)\)"):
        load_source("wands", wands, duplicates="error")
    product.write_text("\n".join(lines + [lines[3].replace("\t", "\tchanged ", 1)]) + "\n")
    with pytest.raises(ValueError, match=r"product\.csv: row 14: duplicate product_id '2' \(first at row 4\) with different"):
        load_source("wands", wands)
    beir = copy_of(FIXTURES / "beir", tmp_path)
    with (beir / "queries.jsonl").open("a") as f:
        f.write('{"_id": "q2", "text": "again"}\n')
    with pytest.raises(ValueError, match=r"queries\.jsonl: line 7: duplicate _id 'q2'"):
        load_source("beir", beir)


def _val_ids(ds) -> list[str]:
    return sorted(ds.queries.loc[ds.queries["split"] == "val", "query_id"])


def test_beir_duplicates_are_reported_and_val_is_carved_from_train(tmp_path):
    """Issue 11 item 6: a BEIR set without dev qrels gets a seeded val carved from train
    (val_fraction honoured); repeated judgements and documents are reported, not dropped
    without a word; the highest score of a repeated judgement is kept."""
    beir = copy_of(FIXTURES / "beir", tmp_path)
    (beir / "qrels" / "dev.tsv").unlink()
    corpus = (beir / "corpus.jsonl").read_text().splitlines()
    queries = [f'{{"_id": "t{n}", "text": "training question number {n}"}}' for n in range(20)]
    (beir / "queries.jsonl").write_text((beir / "queries.jsonl").read_text() + "\n".join(queries) + "\n")
    (beir / "corpus.jsonl").write_text("\n".join(corpus + [corpus[0]]) + "\n")
    train = (beir / "qrels" / "train.tsv").read_text() + "".join(f"t{n}\td{1 + n % 6}\t1\n" for n in range(20))
    (beir / "qrels" / "train.tsv").write_text(train + "q1\td1\t2\nq1\td1\t1\n")
    ds = load_source("beir", beir, val_fraction=0.2, seed=3)
    split = dict(zip(ds.queries["query_id"], ds.queries["split"]))
    assert split["q3"] == "test" and "q2" not in split  # q2 was judged only in the removed dev file
    val = sorted(q for q, s in split.items() if s == "val")
    assert len(val) == round(0.2 * 22)  # of the 22 train queries with a relevant document (q5 has none)
    assert "carved from train" in ds.meta["split"]
    assert val == _val_ids(load_source("beir", beir, val_fraction=0.2, seed=3))  # seeded
    assert val != _val_ids(load_source("beir", beir, val_fraction=0.2, seed=4))
    dups = ds.meta["duplicates"]
    assert dups["judgements"]["count"] == 2 and dups["documents"]["count"] == 1
    assert dups["judgements"]["examples"][0].startswith("train.tsv: row 27: ('q1', 'd1') judged again (first at train.tsv row 2")
    assert dups["documents"]["examples"] == ["corpus.jsonl: line 7: _id 'd1' again (first at line 1)"]
    assert ds.relevant()["q1"]["d1"] == 2 and len(ds.qrels) == len(ds.qrels.drop_duplicates(["query_id", "item_id"]))
    with pytest.raises(ValueError, match=r"2 judgements \(first: train\.tsv: row 27"):
        load_source("beir", beir, duplicates="error")
    # val_fraction 0 carves nothing (the methods then refuse to train without val, naming it).
    assert "val" not in set(load_source("beir", beir, val_fraction=0.0).queries["split"])


def test_metatool_duplicate_pairs_are_reported(tmp_path):
    mt = copy_of(SAMPLE_DIR / "metatool", tmp_path)
    csv_path = mt / "all_clean_data.csv"
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join(lines + [lines[1], lines[2]]) + "\n")
    ds = load_source("metatool", mt)
    assert ds.meta["duplicates"]["query-tool pairs"]["count"] == 2
    assert ds.meta["duplicates"]["query-tool pairs"]["examples"][0].startswith(f"all_clean_data.csv: row {len(lines) + 1}:")
    assert len(ds.qrels) == len(load_source("metatool", SAMPLE_DIR / "metatool").qrels)
    with pytest.raises(ValueError, match="2 query-tool pairs"):
        load_source("metatool", mt, duplicates="error")


def _wands_like(root: Path, n_queries: int = 60) -> Path:
    """A WANDS-format folder with enough queries for the paper split (every query: one Exact
    and one Partial product)."""
    root.mkdir(parents=True)
    header = "product_id\tproduct_name\tproduct_class\tcategory_hierarchy\tproduct_description\tproduct_features\trating_count\taverage_rating\treview_count"
    products = [header] + [f"{i}\tthing {i}\tThings\tA / B\tdescription {i}\tcolor:red\t1\t4.0\t1" for i in range(2 * n_queries)]
    (root / "product.csv").write_text("\n".join(products) + "\n")
    (root / "query.csv").write_text("query_id\tquery\tquery_class\n" + "".join(f"{q}\tquery {q}\tThings\n" for q in range(n_queries)))
    labels = ["id\tquery_id\tproduct_id\tlabel"]
    for q in range(n_queries):
        labels += [f"{2 * q}\t{q}\t{2 * q}\tExact", f"{2 * q + 1}\t{q}\t{2 * q + 1}\tPartial"]
    (root / "label.csv").write_text("\n".join(labels) + "\n")
    return root


def test_wands_relevance_threshold_and_paper_split(tmp_path):
    """data.min_grade: Partial (1) stays relevant at 1 and becomes 0 at 2 (Exact only), grades
    kept for NDCG. data.split_scheme=wands_430_50: 50 seeded test queries, the rest train with
    val_fraction of them held out as val."""
    src = _wands_like(tmp_path / "wands")
    exact_only = load_source("wands", src, min_grade=2)
    assert dict(exact_only.qrels["grade"].value_counts()) == {2: 60, 0: 60}
    assert all(set(r.values()) == {2} for r in exact_only.relevant().values())
    assert exact_only.meta["min_grade"] == 2
    both = load_source("wands", src)
    assert dict(both.qrels["grade"].value_counts()) == {2: 60, 1: 60}
    paper = load_source("wands", src, split_scheme="wands_430_50", val_fraction=0.1, seed=5)
    counts = paper.queries["split"].value_counts().to_dict()
    assert counts == {"test": 50, "train": 9, "val": 1}
    again = load_source("wands", src, split_scheme="wands_430_50", val_fraction=0.1, seed=5)
    assert paper.queries["split"].tolist() == again.queries["split"].tolist()
    other = load_source("wands", src, split_scheme="wands_430_50", val_fraction=0.1, seed=6)
    assert paper.queries["split"].tolist() != other.queries["split"].tolist()
    assert "wands_430_50" in paper.meta["split"]
    with pytest.raises(ValueError, match="needs more than 50 queries"):
        load_source("wands", FIXTURES / "wands", split_scheme="wands_430_50")
    with pytest.raises(ValueError, match="WANDS paper split; the loader is 'metatool'"):
        load_source("metatool", SAMPLE_DIR / "metatool", split_scheme="wands_430_50")
    with pytest.raises(ValueError, match=r"no judgement has a grade >= 3 \(data.min_grade\)"):
        load_source("wands", src, min_grade=3)


def test_empty_text(tmp_path):
    wands = copy_of(FIXTURES / "wands", tmp_path)
    query = wands / "query.csv"
    query.write_text(query.read_text().replace("dinosaur", "  "))
    with pytest.raises(ValueError, match=r"query\.csv: row 4: empty query"):
        load_source("wands", wands)
    src = copy_of(SAMPLE_DIR / "stabletoolbench", tmp_path)
    path = src / "solvable_queries" / "test_instruction" / "G1_tool.json"
    records = json.loads(path.read_text())
    records[2]["query"] = ""
    path.write_text(json.dumps(records))
    with pytest.raises(ValueError, match=r"G1_tool\.json: record 2: empty 'query'"):
        load_source("stabletoolbench", src)


def test_dangling_qrels(tmp_path):
    wands = copy_of(FIXTURES / "wands", tmp_path)
    label = wands / "label.csv"
    label.write_text(label.read_text() + "99\t3\t777\tExact\n")
    with pytest.raises(ValueError, match=r"label\.csv: row 24: product_id '777' is not in product\.csv"):
        load_source("wands", wands)
    mt = copy_of(SAMPLE_DIR / "metatool", tmp_path)
    with (mt / "all_clean_data.csv").open("a") as f:
        f.write("Some query,NoSuchTool\n")
    with pytest.raises(ValueError, match=r"row \d+: tool 'NoSuchTool' has no description in plugin_des\.json"):
        load_source("metatool", mt)
    beir = copy_of(FIXTURES / "beir", tmp_path)
    with (beir / "qrels" / "test.tsv").open("a") as f:
        f.write("q3\td404\t1\n")
    with pytest.raises(ValueError, match=r"test\.tsv: row 4: corpus-id 'd404' is not in corpus\.jsonl"):
        load_source("beir", beir)
    stb = copy_of(SAMPLE_DIR / "stabletoolbench", tmp_path)
    path = stb / "solvable_queries" / "test_instruction" / "G2_category.json"
    records = json.loads(path.read_text())
    records[0]["relevant APIs"].append(["Ghost", "Boo"])
    path.write_text(json.dumps(records))
    with pytest.raises(ValueError, match=r"G2_category\.json: record 0: 'relevant APIs'\[\d+\]: relevant API 'Ghost::Boo' is in no api_list"):
        load_source("stabletoolbench", stb)


def test_unknown_wands_label(tmp_path):
    wands = copy_of(FIXTURES / "wands", tmp_path)
    label = wands / "label.csv"
    label.write_text(label.read_text().replace("Partial", "Maybe", 1))
    with pytest.raises(ValueError, match=r"label\.csv: row 6: label 'Maybe' is not one of Exact, Partial, Irrelevant"):
        load_source("wands", wands)


def test_non_utf8_bytes(tmp_path):
    mt = copy_of(SAMPLE_DIR / "metatool", tmp_path)
    path = mt / "all_clean_data.csv"
    lines = path.read_bytes().split(b"\n")
    lines[4] = lines[4] + b" caf\xe9"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError, match=r"all_clean_data\.csv: line 5: not valid UTF-8 \(byte 0xe9"):
        load_source("metatool", mt)


def test_malformed_json_lines(tmp_path):
    beir = copy_of(FIXTURES / "beir", tmp_path)
    corpus = beir / "corpus.jsonl"
    lines = corpus.read_text().splitlines()
    lines[2] = lines[2][:-3]  # cut the closing of the third record
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"corpus\.jsonl: line 3: invalid JSON"):
        load_source("beir", beir)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "x"}\n["not", "an", "object"]\n')
    with pytest.raises(ValueError, match=r"corpus\.jsonl: line 2: expected a JSON object"):
        load_source("beir", beir)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "title": "x"}\n')
    with pytest.raises(ValueError, match=r"corpus\.jsonl: line 1: missing field\(s\) 'text'"):
        load_source("beir", beir)


def test_malformed_json_file(tmp_path):
    mt = copy_of(SAMPLE_DIR / "metatool", tmp_path)
    (mt / "plugin_des.json").write_text('{\n  "a": "b",\n  "c": \n}\n')
    with pytest.raises(ValueError, match=r"plugin_des\.json: line 4, column 1: invalid JSON"):
        load_source("metatool", mt)


def test_empty_files(tmp_path):
    mt = copy_of(SAMPLE_DIR / "metatool", tmp_path)
    (mt / "all_clean_data.csv").write_text("")
    with pytest.raises(ValueError, match=r"all_clean_data\.csv: file is empty"):
        load_source("metatool", mt)
    (mt / "all_clean_data.csv").write_text("Query,Tool\n")
    with pytest.raises(ValueError, match=r"all_clean_data\.csv: no data rows below the header"):
        load_source("metatool", mt)
    beir = copy_of(FIXTURES / "beir", tmp_path)
    (beir / "queries.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match=r"queries\.jsonl: file is empty"):
        load_source("beir", beir)


def test_image_caption_errors(tmp_path):
    src = make_image_captions(tmp_path / "flickr")
    (src / "images" / "1002_abc.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"captions\.tsv: row 10: image file .*1002_abc\.jpg does not exist"):
        load_source("image_captions", src)
    src = make_image_captions(tmp_path / "flickr2")
    tsv = src / "captions.tsv"
    tsv.write_text(tsv.read_text().replace("\ttrain\ten\t0\tA dog number 0", "\tholdout\ten\t0\tA dog number 0"))
    with pytest.raises(ValueError, match=r"captions\.tsv: row 2: split 'holdout' is not one of train, val, test"):
        load_source("image_captions", src)
    fixed = tsv.read_text().replace("holdout", "train")
    tsv.write_text(fixed + fixed.splitlines()[1] + "\n")  # the same caption row again: a duplicate
    assert load_source("image_captions", src).meta["duplicates"]["captions"]["count"] == 1
    with pytest.raises(ValueError, match=r"row 26: duplicate caption '1000_abc\.jpg#en#0'"):
        load_source("image_captions", src, duplicates="error")
    tsv.write_text(fixed + fixed.splitlines()[1].replace("runs", "sleeps") + "\n")  # same id, another text
    with pytest.raises(ValueError, match=r"row 26: duplicate caption '1000_abc\.jpg#en#0' .* with another text"):
        load_source("image_captions", src)
