#!/usr/bin/env bash
# GPU worker check (target: at most 8 minutes on one modern GPU): every method's phases on a
# randomly initialised model of Qwen3-0.6B shape (no weights are available offline; the SmolLM2
# tokenizer stands in for Qwen's, the vocabulary keeps Qwen3's 151,936 rows so the lm-head cost
# is real), one verdict line per method (bench/gpu_check.py): CoGR (seeds, SFT, a query and an
# item GRPO phase), GRAPE (a few GRPO steps against the frozen MiniLM index), CoHyDE (S1a, S1b,
# vanilla HyDE, one round of S2-S4 + DPO). vLLM generates for the methods that declare it when
# it is installed. The numbers measure speed only: a random model writes nothing useful.
#
#   bash bench/gpu_check.sh                 # uses .venv/bin/python, work files under /tmp
#   PYTHON=python WORK=/scratch/x bash bench/gpu_check.sh
#   GPU_CHECK_DRY=1 bash bench/gpu_check.sh # CPU rehearsal: same steps, a toy shape, a few minutes
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

coevo() { "$PYTHON" -c 'import sys; from coevo.cli import app; sys.argv[0] = "coevo"; app()' "$@"; }
coevo data prepare metatool --source data/sample/metatool --out "$WORK/data" >/dev/null
coevo data prepare stabletoolbench --source data/sample/stabletoolbench --out "$WORK/data-stabletoolbench" >/dev/null

status=0
"$PYTHON" bench/gpu_check.py --work "$WORK" $([ "$GPU_CHECK_DRY" = 1 ] && echo --dry) || status=$?
echo "gpu_check: done in $(( $(date +%s) - start ))s; work files in $WORK"
exit $status
