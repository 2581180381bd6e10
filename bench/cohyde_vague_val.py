"""Why a CoHyDE round does or does not beat S1a on vague queries: val-only diagnostics of a trained run.

CoHyDE's paper claims its largest gain over S1a (the encoder fine-tuned alone on raw queries) on
vague queries. When a run misses that, this says where: in the rewriter (does its description name
a right tool?) or in the encoder (what would it reach if the description were right?). For the run
of FOLDER (a ``bench/efficacy.py --out`` folder, or any project folder with one CoHyDE run), on the
val queries and on their vague copies (``data.vague``'s rule, built here; a ``train_copy`` run's own
val copies when it has them), NDCG@5 of:

- ``s1a``: S1a's encoder on the query (the paper's baseline)
- ``round, query alone``: the round's encoder on the query, no description
- ``round``: the round as it searches (its encoder on ``cohyde.encode``'s text of the greedy description)
- ``mix w=<w>``: the query's embedding plus w x the query-and-description embedding (GRAPE's mix)
- ``hyde mean``: the mean of the greedy and ``--samples`` sampled descriptions' embeddings (HyDE's hedge)
- ``oracle``: the round's encoder on the query followed by its most relevant tool's text as the index
  renders it: what a rewriter that always named the right tool would reach

each with its paired difference from ``s1a`` (95% bootstrap CI, n), and the share of queries whose
greedy description names a relevant tool (the tool's name, else its title, appears in it). It reads
val only: the choice of a setting stays on val. It loads the round's checkpoints as they are on disk
(a run trained by older code included); nothing in the run changes, generations use a temporary folder.

Last line: ``cohyde_vague_named=<share> round_minus_s1a=<x> oracle_minus_s1a=<x>`` on the vague copies.

Usage::

    python bench/cohyde_vague_val.py runs/cohyde_s42                  # the round val chose
    python bench/cohyde_vague_val.py runs/cohyde_s42 --round round_2 --samples 0
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The terminal shows the script's progress and table, not transformers' deprecation notes to its callers.
warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")

KINDS = ("standard", "vague")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("folder", type=Path,
                        help="the project folder of a CoHyDE run: an efficacy --out folder (data/models/cohyde/<data set>/)")
    parser.add_argument("--round", default=None, help="the round to look at (default: the phase val chose, from the folder's efficacy.json or the run)")
    parser.add_argument("--samples", type=int, default=4,
                        help="sampled descriptions per query for the hyde mean (0: skip it), at cohyde.sample_temperature")
    parser.add_argument("--weights", type=float, nargs="*", default=[0.5, 1.0],
                        help="w of the mix rows (none: skip them)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.samples < 0:
        parser.error(f"--samples must be >= 0, got {args.samples}")
    return args


def find_run(folder: Path) -> tuple[Path, Any]:
    """(project root, params) of the one CoHyDE run under ``folder``; a one-line error otherwise."""
    from coevo.config import load_params
    from coevo.layout import RUN_PARAMS

    if not folder.is_dir():
        raise SystemExit(f"cohyde_vague_val: {folder}: no such folder")
    found = sorted(folder.glob(f"*/models/cohyde/*/{RUN_PARAMS}"))
    if len(found) != 1:
        what = "no CoHyDE run" if not found else f"{len(found)} CoHyDE runs ({', '.join(str(p.parent) for p in found)})"
        raise SystemExit(f"cohyde_vague_val: {folder}: {what} (expected one <data root>/models/cohyde/<data set>/{RUN_PARAMS})")
    # params.yaml first: a knob added after the run was trained takes its default, which keeps the old behaviour
    return folder, load_params([ROOT / "params.yaml", found[0]])


def chosen_round(folder: Path) -> str | None:
    """The phase val chose, as an efficacy run recorded it (its efficacy.json), if there is one."""
    record = folder / "efficacy.json"
    if not record.is_file():
        return None
    tables = json.loads(record.read_text()).get("tables", {})
    return next((t["best_phase"] for t in tables.values() if t.get("best_phase")), None)


def vague_copies(queries: list[dict[str, Any]], dataset) -> list[dict[str, Any]]:
    """The vague copy of each query that keeps a content word: data.vague's own rule, as on test."""
    from coevo.data.vague import VAGUE_SUFFIX, _vague_texts

    texts = _vague_texts(dataset, [q["query_id"] for q in queries])
    return [{**q, "query_id": q["query_id"] + VAGUE_SUFFIX, "text": texts[q["query_id"]]}
            for q in queries if texts[q["query_id"]] is not None]


def names_a_right_tool(description: str, relevant, items) -> bool:
    text = description.lower()
    for item_id in relevant:
        row = items[item_id]
        name = str(row.get("tool_name") or row.get("title") or "").strip().lower()
        if name and name in text:
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    json_path = args.json.resolve() if args.json else None  # relative to where the user stands
    root, params = find_run(args.folder.resolve())
    os.chdir(root)  # the run's params name paths relative to its project folder
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars; the generation bars below stay
    from coevo.compute import generate_texts
    from coevo.data.render import render_tool
    from coevo.data.vague import VAGUE_SUFFIX
    from coevo.layout import Layout
    from coevo.methods.base import PhaseNotReady
    from coevo.methods.cohyde import S1A, CoHyDE, rewriter_messages, searched_text
    from coevo.rewards.cohyde import encode_texts, ndcg_scores
    from coevo.stats import paired_difference

    layout = Layout.of(params, "cohyde")
    run = CoHyDE(layout.run_dir, params, layout.processed)
    stage = args.round or chosen_round(root) or run.best_phase()
    if not stage.startswith("round_"):
        raise SystemExit(f"cohyde_vague_val: {root}: the phase is {stage!r}, not a round (pass --round round_<r>)")
    encoder_stage, rewriter_stage = run.stages(stage)  # cohyde.eval_pairing's pair, as the run evaluates it
    try:  # the checkpoints on disk, whatever code trained them (phase stamps would re-key)
        run._require_trained(encoder_stage, rewriter_stage)
    except PhaseNotReady as exc:
        raise SystemExit(f"cohyde_vague_val: {root}: {exc}") from None
    cfg = params.cohyde
    items = run.items
    val = run._queries("val")  # the method's own val queries, in its order
    standard = [q for q in val if not q["query_id"].endswith(VAGUE_SUFFIX)]
    vague = [q for q in val if q["query_id"].endswith(VAGUE_SUFFIX)] or vague_copies(standard, run.dataset)
    if not vague:
        raise SystemExit(f"cohyde_vague_val: {layout.processed}: no val query keeps a content word once its tools' words go")
    queries = standard + vague
    kinds = {"standard": list(range(len(standard))), "vague": list(range(len(standard), len(queries)))}
    texts = [q["text"] for q in queries]
    relevant = [q["relevant"] for q in queries]
    rewriter = run.rewriter(rewriter_stage)
    with tempfile.TemporaryDirectory() as scratch:
        def generate(group: list[dict[str, Any]], n: int, temperature: float, what: str) -> list[list[str]]:
            return generate_texts(rewriter, [rewriter_messages(q["text"]) for q in group], compute=params.compute,
                                  scratch=scratch, num_return_sequences=n, temperature=temperature,
                                  max_new_tokens=cfg.max_new_tokens, seed=run.seed, progress=True, description=what)

        # CoHyDE.describe's settings (greedy, the run's seed) on the same batches as its val evaluation,
        # so the standard "round" row is the run's own val figure; the scratch stays outside the run.
        greedy = [o[0] for group in (standard, vague) for o in generate(group, 1, 0.0, f"{stage} greedy")]
        samples = generate(queries, args.samples, cfg.sample_temperature, f"{stage} samples") if args.samples else []
    best_tool = [min(rel, key=lambda i: (-rel[i], i)) for rel in relevant]  # highest grade, then id (as S1b's pairs)
    oracle = [render_tool(items[i], cfg.index_format) for i in best_tool]

    scores: dict[str, np.ndarray] = {}

    def score(name: str, index_stage: str, embeddings: np.ndarray) -> None:
        scores[name] = ndcg_scores(run.index(index_stage).rank_corpus(embeddings, 5), relevant, 5)

    encoder = run.encoder(S1A)
    score("s1a", S1A, encode_texts(encoder, texts))
    encoder = run.encoder(encoder_stage)
    query = encode_texts(encoder, texts)
    score("round, query alone", encoder_stage, query)
    searched = encode_texts(encoder, [searched_text(t, d, cfg.encode) for t, d in zip(texts, greedy)])
    score("round", encoder_stage, searched)
    joined = encode_texts(encoder, [searched_text(t, d, "query_and_description") for t, d in zip(texts, greedy)])
    for w in args.weights:
        score(f"mix w={w:g}", encoder_stage, query + w * joined)
    if samples:
        each = [encode_texts(encoder, [searched_text(t, d, cfg.encode) for t, d in zip(texts, column)])
                for column in zip(*samples)]
        score("hyde mean", encoder_stage, (searched + sum(each)) / (1 + len(each)))
    score("oracle", encoder_stage, encode_texts(encoder, [searched_text(t, o, "query_and_description")
                                                  for t, o in zip(texts, oracle)]))
    named = np.array([names_a_right_tool(d, rel, items) for d, rel in zip(greedy, relevant)], dtype=float)

    rows = []
    for kind, ix in kinds.items():
        ids = [queries[i]["query_id"] for i in ix]
        base = dict(zip(ids, scores["s1a"][ix]))
        for name, values in scores.items():
            row = {"queries": kind, "row": name, "n": len(ix), "ndcg@5": float(values[ix].mean())}
            if name != "s1a":
                diff = paired_difference(dict(zip(ids, values[ix])), base)
                row.update(minus_s1a=diff.mean, ci_low=diff.ci_low, ci_high=diff.ci_high)
            rows.append(row)
        rows.append({"queries": kind, "row": "greedy names a right tool", "n": len(ix), "share": float(named[ix].mean())})

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"CoHyDE {stage} on val ({root}; encode: {cfg.encode}), NDCG@5")
    for column in ("queries", "row", "n", "NDCG@5", "minus s1a [95% CI]"):
        table.add_column(column, justify="left" if column in ("queries", "row") else "right")
    for r in rows:
        if "share" in r:
            table.add_row(r["queries"], r["row"], str(r["n"]), f"{r['share']:.1%}", "")
            continue
        diff = f"{r['minus_s1a']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]" if "minus_s1a" in r else ""
        table.add_row(r["queries"], r["row"], str(r["n"]), f"{r['ndcg@5']:.3f}", diff)
    Console(width=140).print(table)
    for kind in KINDS:
        ix = kinds[kind][:2]
        for i in ix:
            print(f"{kind} example: {texts[i][:100]!r} -> {greedy[i][:100]!r}")
    if json_path:
        json_path.write_text(json.dumps({"folder": str(root), "round": stage, "rows": rows}, indent=1))
    on_vague = {r["row"]: r for r in rows if r["queries"] == "vague"}
    print(f"cohyde_vague_named={on_vague['greedy names a right tool']['share']:.3f} "
          f"round_minus_s1a={on_vague['round']['minus_s1a']:.4f} oracle_minus_s1a={on_vague['oracle']['minus_s1a']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
