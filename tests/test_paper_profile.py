"""params/paper.yaml, the reproduction profile: it loads as an overlay on params.yaml (every
check of coevo.config, TRL pass-through included), holds the papers' settings, plans the
papers' phases, and the README documents it with the figures it aims at. No weights needed."""

from __future__ import annotations

import pytest

from coevo.config import load_params
from coevo.methods.base import method_class
from tests.conftest import REPO_ROOT

PAPER = REPO_ROOT / "params" / "paper.yaml"


@pytest.fixture(scope="module")
def paper():
    return load_params([REPO_ROOT / "params.yaml", PAPER])


def test_cogr_paper_settings(paper):
    c = paper.cogr
    assert c.generator == "Qwen/Qwen3-1.7B"
    assert (c.n_query_keywords, c.m_item_keywords, c.k_max, c.rounds) == (15, 10, 30, 5)
    assert (c.grpo.query_epochs, c.grpo.item_epochs) == (10, 5)
    assert c.item_reward == "marginal" and c.sft_init and not c.shared_generator and not c.query_side_only
    assert c.max_train_queries is None and c.grpo.max_prompts_per_phase is None
    # The budget holds k_max + 1 keywords (>= 3 tokens each with the comma), so the K_max penalty can fire.
    assert c.grpo.max_completion_length >= 3 * (c.k_max + 1) and c.sampling.max_new_tokens >= 3 * (c.k_max + 1)
    assert c.grpo.trl["chat_template_kwargs"] == {"enable_thinking": False}
    # WANDS with the paper's 430/50 split.
    assert (paper.data.loader, paper.data.split_scheme, paper.data.min_grade) == ("wands", "wands_430_50", 2)


def test_grape_paper_settings(paper):
    g = paper.grape
    assert (g.grpo.num_generations, g.grpo.learning_rate, g.grpo.steps) == (8, 5e-7, 1500)
    assert g.grpo.batch_size == 8 * g.grpo.num_generations  # 8 queries per step
    assert (g.retriever, g.clip_model, g.clip_pretrained) == ("clip", "ViT-B-16", "openai")
    assert g.reward == "rank" and g.lora.enabled is False


def test_cohyde_paper_settings(paper):
    h = paper.cohyde
    assert "4B" in h.generator and "bge" in h.encoder.lower()
    assert (h.warmup.epochs, h.rounds, h.num_samples, h.sample_temperature, h.dpo_beta) == (8, 3, 4, 0.7, 0.1)
    assert (h.s1b_warmup, h.s3_init, h.eval_pairing) == (True, "s1a", "co_trained")


def test_paper_profile_plans_the_papers_phases(paper):
    cogr = [p.name for p in method_class("cogr").declared(paper).phases()]
    assert cogr[:2] == ["seed", "00_sft"] and len(cogr) == 2 + 2 * 5 and cogr[-1] == "10_item"
    cohyde = [p.name for p in method_class("cohyde").declared(paper).phases()]
    assert [name for name in cohyde if name.startswith("round_") and name[6:].isdigit()] == ["round_1", "round_2",
                                                                                            "round_3"]
    assert [p.name for p in method_class("grape").declared(paper).phases()][-1] == "trained"


def test_paper_profile_changes_only_what_it_means_to(paper):
    """Every key the overlay sets differs from params.yaml or restates a paper value; no key is
    unknown (load_params would refuse it) and the CPU defaults stay in params.yaml."""
    base = load_params(REPO_ROOT / "params.yaml")
    assert base.cogr.generator != paper.cogr.generator and base.cogr.rounds != paper.cogr.rounds
    assert base.seed == paper.seed and base.tracking == paper.tracking


def test_readme_documents_the_profile_and_its_targets():
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Reproduction profile", 1)[1].split("\n## ", 1)[0]
    for figure in ("params/paper.yaml", "0.682", "+4.9", "R@10", "+2.5", "NDCG@5"):
        assert figure in section
    # CoHyDE's +2.5 pp is over S1a (the encoder fine-tuned alone), not over vanilla HyDE; its
    # largest gain, +6.3 pp over S1a, is on vague queries.
    cohyde = next(line for line in section.splitlines() if line.startswith("| CoHyDE |"))
    assert "+2.5 pp NDCG@5 over S1a" in cohyde and "+6.3 pp over S1a" in cohyde and "vague" in cohyde
    assert "vanilla HyDE" not in cohyde
