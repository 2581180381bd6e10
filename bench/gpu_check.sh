#!/usr/bin/env bash
# GPU worker check (< 5 minutes on one modern GPU): one short CoGR round — Algorithm 1 seeds,
# SFT of both sides, one query-side and one item-side GRPO phase, index rebuilds and
# evaluations — on a randomly initialised model of Qwen3-0.6B shape (no weights are
# available offline; the SmolLM2 tokenizer stands in for Qwen's, the vocabulary keeps
# Qwen3's 151,936 rows so the lm-head cost is real). Prints GRPO step time, completion
# tokens/s and peak GPU memory per phase. The numbers measure speed only: a random model
# writes no useful keywords.
#
#   bash bench/gpu_check.sh                 # uses .venv/bin/python, work files under /tmp
#   PYTHON=python WORK=/scratch/x bash bench/gpu_check.sh
#   GPU_CHECK_DRY=1 bash bench/gpu_check.sh # CPU rehearsal: same steps, a toy shape, seconds
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
WORK="${WORK:-$(mktemp -d /tmp/coevo-gpu-check.XXXXXX)}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$(date +%s)

export GPU_CHECK_DRY="${GPU_CHECK_DRY:-0}"
"$PYTHON" - <<'EOF'
import os, sys, torch
if os.environ["GPU_CHECK_DRY"] == "1":
    print("gpu_check: dry run on CPU (toy shape; numbers mean nothing)")
    sys.exit(0)
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible (torch.cuda.is_available() is False)")
print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, bf16 {torch.cuda.is_bf16_supported()}")
EOF

echo "gpu_check: building a random Qwen3-0.6B-shaped model in $WORK/qwen3-0.6b-random"
WORK="$WORK" "$PYTHON" - <<'EOF'
import os, torch
from pathlib import Path
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from coevo.models.registry import smollm2_checkpoint

dest = Path(os.environ["WORK"]) / "qwen3-0.6b-random"
tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint())
dry = os.environ["GPU_CHECK_DRY"] == "1"
shape = (  # Qwen/Qwen3-0.6B's published shape (a toy one for the CPU rehearsal)
    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    if dry else
    dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128)
)
config = Qwen3Config(
    vocab_size=len(tokenizer) if dry else 151936, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.pad_token_id, **shape,
)
torch.manual_seed(0)
with torch.device("cpu" if dry else "cuda"):
    model = Qwen3ForCausalLM(config).to(torch.float32 if dry else torch.bfloat16)
print(f"gpu_check: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")
model.save_pretrained(dest)
tokenizer.save_pretrained(dest)
EOF

"$PYTHON" -c 'import sys; from coevo.cli import app; sys.argv[0] = "coevo"; app()' \
  data prepare metatool --source data/sample/metatool --out "$WORK/data" >/dev/null

echo "gpu_check: one CoGR round (seed, SFT, query GRPO, item GRPO)"
WORK="$WORK" "$PYTHON" - <<'EOF'
import os, time, torch
from pathlib import Path
from coevo.config import load_params
from coevo.methods.cogr import CoGR

work = Path(os.environ["WORK"])
dry = os.environ["GPU_CHECK_DRY"] == "1"
toy = ["cogr.grpo.num_generations=2", "cogr.grpo.batch_size=4", "cogr.grpo.max_prompts_per_phase=4",
       "cogr.grpo.max_completion_length=8", "cogr.sampling.max_new_tokens=8", "cogr.max_train_queries=8"] if dry else []
params = load_params("params.yaml", [
    f"cogr.generator={work / 'qwen3-0.6b-random'}",
    "cogr.rounds=1",
    "cogr.early_stopping.patience=10",  # a random model's flat curve must not skip the item phase
    "cogr.max_empty_share=1.0",  # a random model writes no keywords: an empty index must not stop the check
    "cogr.sft.epochs=1",
    "cogr.sft.batch_size=16",
    "cogr.grpo.num_generations=8",
    "cogr.grpo.batch_size=32",
    "cogr.grpo.max_prompts_per_phase=32",
    "cogr.grpo.max_completion_length=48",
    "cogr.sampling.max_new_tokens=48",
] + toy)
cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.reset_peak_memory_stats()
started = time.perf_counter()
run = CoGR(work / "run", params, work / "data", progress=False, generation_batch_size=16 if dry else 128)


def on_phase(phase, record):
    print(f"gpu_check: {phase.name} done ({time.perf_counter() - started:.0f}s)", flush=True)


rows = run.run(on_phase=on_phase)
print(f"{'phase':<10} {'steps':>5} {'step s':>8} {'tokens/s':>9} {'peak GPU MB':>12} {'phase s':>8} {'val f1':>8}")
for row in rows:
    train = row.get("train", {})
    print(
        f"{row['name']:<10} {train.get('steps', '') or '':>5} "
        f"{(train.get('step_seconds') or 0):>8.3f} {(train.get('tokens_per_s') or 0):>9.0f} "
        f"{(train.get('peak_gpu_mb') or 0):>12.0f} {row['seconds']:>8.1f} {row['eval']['f1']:>8.4f}"
    )
assert [r["name"] for r in rows] == ["00_sft", "01_query", "02_item"], [r["name"] for r in rows]
peak = f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MB" if cuda else "n/a (CPU)"
print(f"gpu_check: whole round {time.perf_counter() - started:.0f}s, peak GPU memory {peak} (process, all phases)")
EOF
echo "gpu_check: done in $(( $(date +%s) - start ))s; work files in $WORK"
