"""Corpus-wide passes (generation, embedding) in this process or on a Ray cluster.

Every corpus-wide pass of the methods goes through two functions:

- :func:`generate_texts` (CoGR item and query keywords, Algorithm 1 seeds, CoHyDE S2
  descriptions and S4 samples, GRAPE rewrites, evaluation-time generation);
- :func:`embed_texts` (GRAPE and CoHyDE corpus embeddings).

``compute.backend`` (params.yaml) chooses where they run:

- ``local`` (default): the call the methods always made, in this process
  (``Generator.generate`` / ``SentenceTransformer.encode``). No start-up cost.
- ``ray``: a Ray Data pipeline, ``map_batches`` over shards with a callable class, so a fixed
  pool of ``compute.workers`` actors (``ActorPoolStrategy``) each loads the model ONCE from a
  saved checkpoint (a folder every worker can read: the run folder on shared storage).
  The shards are whole model batches cut exactly as the local call cuts them (prompts sorted
  by token length, then ``batch_size`` at a time; texts sorted as sentence-transformers sorts
  them), and each is generated or encoded as one batch, so every prompt sees the same padding
  as in process: greedy generation and embeddings are identical on both backends (a test).
  Sampled passes (temperature > 0) draw each shard from its own seed (run seed, shard index):
  reproducible run to run on Ray, but not the same draws as the single local RNG stream.
- ``ray`` with ``compute.gpus_per_worker > 0`` and vLLM installed: generation goes through
  ``ray.data.llm`` (a vLLM engine per worker, the current LoRA adapter as a per-row LoRA
  request). vLLM's kernels differ from HF's, so outputs are close to, not equal to, the HF
  ones; this branch needs GPUs and is not exercised by the CPU test suite.

Nothing here changes a phase key: the backend decides where the work runs, not what it computes.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coevo.config import ComputeParams

if TYPE_CHECKING:
    from coevo.models.generator import Generator

log = logging.getLogger(__name__)

LOCAL, RAY = "local", "ray"
GENERATOR_META = "generator.json"  # coevo.models.generator.META_FILE (not imported: keeps this module light)


def is_ray(compute: ComputeParams | None) -> bool:
    return compute is not None and compute.backend == RAY


# ------------------------------------------------------------------------------ Ray session
def ray_init_args(compute: ComputeParams) -> tuple[str | None, dict[str, Any]]:
    """(address, ray.init kwargs) for ``compute``: the configured cluster, else $RAY_ADDRESS, else
    (address None) a local instance with exactly the CPUs and GPUs the worker pool needs."""
    address = compute.ray.address.strip() or os.environ.get("RAY_ADDRESS", "").strip() or None
    kwargs: dict[str, Any] = {"log_to_driver": False, "ignore_reinit_error": True}
    if address is None:
        kwargs.update(
            num_cpus=max(1, math.ceil(compute.workers * compute.cpus_per_worker)),
            num_gpus=math.ceil(compute.workers * compute.gpus_per_worker),
            include_dashboard=False,
        )
    return address, kwargs


def ensure_ray(compute: ComputeParams) -> float:
    """Connect to (or start) Ray unless this process already did; returns the seconds it took.

    The instance stays up for the rest of the process (later passes reuse it); a local instance
    ends with the process, or with ``ray.shutdown()``.
    """
    import ray

    if ray.is_initialized():
        return 0.0
    started = time.perf_counter()
    address, kwargs = ray_init_args(compute)
    where = f"connecting to {address}" if address else f"starting a local instance ({kwargs['num_cpus']} CPUs)"
    log.info("ray: %s", where)
    ray.init(address=address, **kwargs)
    return time.perf_counter() - started


def _quiet_ray_data() -> None:
    """No progress bars or periodic progress logs from Ray Data (coevo logs one line per pass)."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.enable_operator_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.enable_auto_log_stats = False


def _pool(compute: ComputeParams) -> dict[str, Any]:
    """map_batches arguments for a fixed pool of ``workers`` actors with their resources."""
    import ray.data

    return {
        "compute": ray.data.ActorPoolStrategy(size=compute.workers),
        "num_cpus": compute.cpus_per_worker,
        "num_gpus": compute.gpus_per_worker or None,
        "udf_modifying_row_count": False,
    }


@contextmanager
def _checkpoint(obj: Any, path: str | Path | None, scratch: str | Path | None, save: str) -> Iterator[str]:
    """A folder the workers load the model from: ``path`` when given, else ``obj`` saved under
    ``scratch`` (removed afterwards). On a cluster ``scratch`` must be on shared storage."""
    if path is not None:
        yield str(path)
        return
    if obj is None:
        raise ValueError("compute: neither a model nor a saved checkpoint was given")
    created: list[Path] = []
    if scratch is not None:
        for parent in [Path(scratch), *Path(scratch).parents]:
            if parent.exists():
                break
            created.append(parent)
        Path(scratch).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="coevo-compute-", dir=scratch))
    try:
        target = folder / "model"
        getattr(obj, save)(str(target))
        yield str(target)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for parent in created:  # leave the run folder as it was
            try:
                parent.rmdir()
            except OSError:
                break


def _threads_for_worker(cpus_per_worker: float) -> dict[str, Any]:
    from coevo.runtime import threads_from_env

    return {"threads": threads_from_env(), "cpus": cpus_per_worker}


def _apply_threads(model: Any, threads: int | None, cpus: float) -> None:
    """The project's CPU thread policy inside a worker: the driver's COEVO_THREADS when it set
    one; otherwise one thread for small models (coevo.runtime) and ``cpus_per_worker`` threads
    for large ones, so actors sharing a node never oversubscribe it."""
    from coevo.runtime import SMALL_MODEL_PARAMS, THREADS_ENV, limit_cpu_threads

    if threads is not None:
        os.environ[THREADS_ENV] = str(threads)
    if limit_cpu_threads(model) is None:
        import torch

        if not torch.cuda.is_available() and sum(p.numel() for p in model.parameters()) > SMALL_MODEL_PARAMS:
            torch.set_num_threads(max(1, int(cpus)))


# ----------------------------------------------------------------------------- generation
def generate_texts(
    generator: Generator | None,
    prompts: Sequence[Any],
    *,
    compute: ComputeParams | None = None,
    checkpoint: str | Path | None = None,
    scratch: str | Path | None = None,
    num_return_sequences: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = 48,
    batch_size: int = 16,
    seed: int | None = None,
    progress: bool = False,
    description: str = "generating",
) -> list[list[str]]:
    """``num_return_sequences`` completions per prompt, in input order (``temperature == 0``: greedy).

    ``generator``: a :class:`~coevo.models.generator.Generator` (or None when ``checkpoint``
    is given). ``checkpoint``: the folder it was saved to (``Generator.save``), which Ray
    workers load; without it the generator is saved under ``scratch`` for the pass.
    """
    if not prompts:
        return []
    settings = {"num_return_sequences": num_return_sequences, "temperature": temperature, "top_p": top_p,
                "max_new_tokens": max_new_tokens}
    if not is_ray(compute):
        if generator is None:
            from coevo.models.generator import Generator

            generator = Generator.load(checkpoint, trainable=False)
        return generator.generate(prompts, batch_size=batch_size, seed=seed, progress=progress,
                                  description=description, **settings)
    assert compute is not None
    base_seed = int(seed if seed is not None else getattr(generator, "seed", 0))
    with _checkpoint(generator, checkpoint, scratch, "save") as folder:
        if compute.gpus_per_worker > 0 and vllm_available():
            engine = _vllm_model(folder)
            if engine is not None:
                return _generate_vllm(folder, engine, prompts, compute, base_seed, **settings)
            log.info("compute: %s cannot be served by vLLM (a `tiny` model): HF workers instead", folder)
        return _generate_hf(generator, folder, prompts, compute, batch_size, base_seed, description, **settings)


def _tokenizer_of(generator: Any, folder: str):
    if generator is not None:
        return generator.tokenizer
    from transformers import AutoTokenizer

    from coevo.models.registry import prepare_tokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(Path(folder) / "tokenizer"))


def generation_shards(tokenizer: Any, prompts: Sequence[Any], batch_size: int) -> tuple[list[str], list[list[int]]]:
    """(rendered prompt texts, shards of prompt indices): the batches ``Generator.generate`` forms
    in process, i.e. prompts sorted by (token length, position), ``batch_size`` at a time."""
    texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             for p in prompts]
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: (lengths[i], i))
    return texts, [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


def shard_seed(seed: int, shard: int) -> int:
    """Seed of one shard of a sampled pass on Ray: fixed by (pass seed, shard index)."""
    return int(np.random.SeedSequence([seed, shard]).generate_state(1)[0] % (2**31 - 1))


def _rows_per_call(compute: ComputeParams, shard_size: int) -> int:
    return max(1, compute.batch_size // max(1, shard_size))


_LAST_PASS: dict[str, Any] = {}


def last_pass() -> dict[str, Any]:
    """Timing of the last Ray pass: ``wall`` seconds, ``busy`` seconds per worker process (model
    work only), ``startup`` = wall - the busiest worker (pool start, model loads, scheduling)."""
    return dict(_LAST_PASS)


def _run_pool(rows: list[dict[str, Any]], worker: type, constructor: dict[str, Any], call: dict[str, Any],
              compute: ComputeParams, shard_size: int) -> dict[int, Any]:
    """Rows (one per shard) through a fixed actor pool; {shard: output} (order restored by id)."""
    import ray.data

    ensure_ray(compute)
    _quiet_ray_data()
    started = time.perf_counter()
    blocks = min(len(rows), max(compute.workers * 4, 1))
    ds = ray.data.from_items(rows, override_num_blocks=blocks)
    ds = ds.map_batches(worker, fn_constructor_kwargs=constructor, fn_kwargs=call,
                        batch_size=_rows_per_call(compute, shard_size), **_pool(compute))
    out: dict[int, Any] = {}
    busy: dict[int, float] = {}
    for row in ds.iter_rows():
        out[int(row["shard"])] = row["output"]
        busy[int(row["worker"])] = busy.get(int(row["worker"]), 0.0) + float(row["seconds"])
    wall = time.perf_counter() - started
    _LAST_PASS.clear()
    _LAST_PASS.update(wall=wall, busy=busy, startup=max(0.0, wall - max(busy.values(), default=0.0)),
                      shards=len(rows), workers=compute.workers)
    missing = sorted(set(range(len(rows))) - set(out))
    if missing:
        raise RuntimeError(f"compute: Ray returned no output for shard(s) {missing[:5]}")
    return out


def _generate_hf(generator: Any, folder: str, prompts: Sequence[Any], compute: ComputeParams, batch_size: int,
                 seed: int, description: str, **settings: Any) -> list[list[str]]:
    texts, shards = generation_shards(_tokenizer_of(generator, folder), prompts, batch_size)
    sampled = settings["temperature"] > 0
    rows = [{"shard": k, "texts": json.dumps([texts[i] for i in shard]),
             "seed": shard_seed(seed, k) if sampled else seed} for k, shard in enumerate(shards)]
    started = time.perf_counter()
    out = _run_pool(rows, GenerateWorker, {"checkpoint": folder, **_threads_for_worker(compute.cpus_per_worker)},
                    settings, compute, batch_size)
    results: list[list[str]] = [[] for _ in prompts]
    for k, shard in enumerate(shards):
        for i, completions in zip(shard, json.loads(out[k])):
            results[i] = completions
    log.info("compute: %s: %d prompts on %d Ray workers in %.1fs", description, len(prompts), compute.workers,
             time.perf_counter() - started)
    return results


class GenerateWorker:
    """A Ray Data actor: loads the generator once, then generates whole shards (one model batch each)."""

    def __init__(self, checkpoint: str, threads: int | None, cpus: float) -> None:
        from coevo.models.generator import Generator

        self.generator = Generator.load(checkpoint, trainable=False)
        _apply_threads(self.generator.model, threads, cpus)

    def __call__(self, batch: dict[str, np.ndarray], **settings: Any) -> dict[str, np.ndarray]:
        outputs, seconds = [], []
        for payload, seed in zip(batch["texts"], batch["seed"]):
            texts = json.loads(payload)
            started = time.perf_counter()
            outputs.append(json.dumps(self.generator.generate(texts, batch_size=len(texts), seed=int(seed),
                                                              progress=False, **settings)))
            seconds.append(time.perf_counter() - started)
        return _rows_out(batch, outputs, seconds)


# ------------------------------------------------------------------------- vLLM (GPU workers)
def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _vllm_model(folder: str) -> dict[str, Any] | None:
    """What vLLM serves for a saved generator: {"model_source", "lora"} (None for `tiny`,
    whose random base exists only as a coevo checkpoint)."""
    from coevo.models.registry import TINY, resolve_model_source

    meta = json.loads((Path(folder) / GENERATOR_META).read_text(encoding="utf-8"))
    if meta["format"] == "full":
        return {"model_source": str(Path(folder) / "model"), "lora": None}
    if meta["name"] == TINY:
        return None
    return {"model_source": resolve_model_source(meta["name"], None), "lora": str(Path(folder) / "adapter"),
            "max_lora_rank": int((meta.get("lora") or {}).get("r", 16))}


def _generate_vllm(folder: str, engine: dict[str, Any], prompts: Sequence[Any], compute: ComputeParams, seed: int,
                   *, num_return_sequences: int, temperature: float, top_p: float,
                   max_new_tokens: int) -> list[list[str]]:
    """Generation through ``ray.data.llm`` (vLLM engine processor), one engine per worker.

    Prompts are rendered with the generator's own chat template here (the processor's chat
    template stage is off), each row carries its sampling params and, for LoRA generators, the
    adapter folder as ``model`` (a per-row LoRA request; the folder must be readable by every
    worker). Several completions per prompt are separate rows with their own seeds.
    """
    import ray.data
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    ensure_ray(compute)
    tokenizer = _tokenizer_of(None, folder)
    texts, _ = generation_shards(tokenizer, prompts, 1)
    engine_kwargs: dict[str, Any] = {"max_model_len": 4096}
    if engine["lora"]:
        engine_kwargs.update(enable_lora=True, max_lora_rank=engine["max_lora_rank"], max_loras=1)
    config = vLLMEngineProcessorConfig(
        model_source=engine["model_source"], engine_kwargs=engine_kwargs, concurrency=compute.workers,
        batch_size=compute.batch_size, chat_template_stage=False, tokenize_stage=True, detokenize_stage=True,
    )
    greedy = temperature <= 0
    lora = engine["lora"]

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        params = {"max_tokens": max_new_tokens, "temperature": 0.0 if greedy else temperature,
                  "top_p": 1.0 if greedy else top_p, "seed": int(row["seed"])}
        out = {"prompt": row["prompt"], "sampling_params": params}
        if lora:
            out["model"] = lora
        return out

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {"index": row["index"], "copy": row["copy"], "text": row["generated_text"]}

    processor = build_processor(config, preprocess=preprocess, postprocess=postprocess)
    rows = [{"index": i, "copy": c, "prompt": t, "seed": shard_seed(seed, i * num_return_sequences + c)}
            for i, t in enumerate(texts) for c in range(num_return_sequences)]
    results: list[list[str]] = [[""] * num_return_sequences for _ in texts]
    for row in processor(ray.data.from_items(rows)).iter_rows():
        results[int(row["index"])][int(row["copy"])] = str(row["text"]).strip()
    return results


# ------------------------------------------------------------------------------ embedding
def embed_texts(
    encoder: Any,
    texts: Sequence[str],
    *,
    compute: ComputeParams | None = None,
    checkpoint: str | Path | None = None,
    scratch: str | Path | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> np.ndarray:
    """L2-normalised float32 embeddings, one row per text (a sentence-transformers encoder).

    ``encoder``: a loaded SentenceTransformer (or None when ``checkpoint`` is given).
    ``checkpoint``: what Ray workers load: an offline alias, hub id or folder
    (``coevo.models.encoder.load_text_encoder``); without it the encoder is saved under ``scratch``.
    """
    texts = list(texts)
    if not is_ray(compute):
        if encoder is None:
            from coevo.models.encoder import load_text_encoder

            encoder = load_text_encoder(str(checkpoint))
        return _encode(encoder, texts, batch_size, progress)
    assert compute is not None
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    shards = embedding_shards(texts, batch_size)
    rows = [{"shard": k, "texts": json.dumps([texts[i] for i in shard]), "seed": 0} for k, shard in enumerate(shards)]
    started = time.perf_counter()
    with _checkpoint(encoder, checkpoint, scratch, "save") as source:
        out = _run_pool(rows, EmbedWorker, {"source": source, **_threads_for_worker(compute.cpus_per_worker)}, {},
                        compute, batch_size)
    result: np.ndarray | None = None
    for k, shard in enumerate(shards):
        block = np.frombuffer(out[k], dtype=np.float32).reshape(len(shard), -1)
        if result is None:
            result = np.empty((len(texts), block.shape[1]), dtype=np.float32)
        result[shard] = block
    assert result is not None
    log.info("compute: embedded %d texts on %d Ray workers in %.1fs", len(texts), compute.workers,
             time.perf_counter() - started)
    return result


def _encode(encoder: Any, texts: Sequence[str], batch_size: int, progress: bool) -> np.ndarray:
    emb = encoder.encode(list(texts), batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                         show_progress_bar=progress)
    return np.asarray(emb, dtype=np.float32).reshape(len(texts), -1)


def embedding_shards(texts: Sequence[str], batch_size: int) -> list[list[int]]:
    """The batches ``SentenceTransformer.encode`` forms in process: texts sorted by decreasing
    character length (the same ``np.argsort`` call), ``batch_size`` at a time."""
    order = np.argsort([-len(t) for t in texts])
    return [order[i: i + batch_size].tolist() for i in range(0, len(order), batch_size)]


class EmbedWorker:
    """A Ray Data actor: loads the encoder once, then encodes whole shards (one model batch each)."""

    def __init__(self, source: str, threads: int | None, cpus: float) -> None:
        from coevo.models.encoder import load_text_encoder

        self.encoder = load_text_encoder(source)
        _apply_threads(self.encoder, threads, cpus)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs, seconds = [], []
        for payload in batch["texts"]:
            texts = json.loads(payload)
            started = time.perf_counter()
            outputs.append(_encode(self.encoder, texts, len(texts), False).tobytes())
            seconds.append(time.perf_counter() - started)
        return _rows_out(batch, outputs, seconds)


def _rows_out(batch: dict[str, np.ndarray], outputs: list[Any], seconds: list[float]) -> dict[str, np.ndarray]:
    return {"shard": np.asarray(batch["shard"]), "output": np.asarray(outputs, dtype=object),
            "seconds": np.asarray(seconds, dtype=np.float64), "worker": np.full(len(outputs), os.getpid())}
