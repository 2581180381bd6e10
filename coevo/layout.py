"""Where each artifact of a method's pipeline lives, relative to the project root.

The run directory belongs to the method (``coevo.methods``: nothing else knows a file name
inside it), except ``params.yaml`` at its root: the resolved params it was last trained with,
so that serving a run folder needs nothing re-passed. The other paths are the pipeline's
outputs that DVC tracks and users open.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coevo.config import Params

RUN_PARAMS = "params.yaml"
RUN_PARAMS_HEADER = """\
# The params this run folder was last trained with (params.yaml + overlays + --set, resolved), written by
# coevo when its train stage starts; `coevo search -m <run folder>` and `coevo evaluate` read them.
"""


def write_run_params(run_dir: Path, params: Params) -> Path:
    """``<run_dir>/params.yaml`` := ``params`` resolved (atomic; untouched when the same).

    Every rank of a multi-process launch calls it: rank 0 alone decides and writes, and all
    ranks meet at one barrier after, so they stay in step (a collective write decided per rank
    could leave rank 0 at a barrier the others skipped).
    """
    import yaml

    from coevo import distributed
    from coevo.io import write_text

    path = Path(run_dir) / RUN_PARAMS
    text = RUN_PARAMS_HEADER + yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False, width=120)
    if distributed.is_writer() and not (path.is_file() and path.read_text() == text):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text, collective=False)
    distributed.barrier()
    return path


@dataclass(frozen=True)
class Layout:
    root: Path
    dataset: str
    method: str

    @classmethod
    def of(cls, params: Params, method: str) -> "Layout":
        return cls(Path(params.data.root), params.data.dataset, method)

    @property
    def processed(self) -> Path:
        return self.root / "processed" / self.dataset

    @property
    def validation_dir(self) -> Path:
        return Path("reports") / "validation" / self.dataset

    @property
    def validation_report(self) -> Path:
        return self.validation_dir / "validation.json"

    @property
    def run_dir(self) -> Path:
        """The method's checkpoints (one per method and data set; resumable)."""
        return self.root / "models" / self.method / self.dataset

    @property
    def index_dir(self) -> Path:
        """Exported indexes (CoGR's Lucene index of the learned keywords)."""
        return self.root / "indexes" / self.method / self.dataset

    @property
    def report_dir(self) -> Path:
        """Evaluate-stage outputs besides the metrics file: PNGs, tables, examples, step stamps."""
        return Path("reports") / self.method / self.dataset

    @property
    def metrics_file(self) -> Path:
        # CoGR is the project's headline method: its metrics sit at the root (DESIGN, dvc.yaml).
        return Path("metrics.json") if self.method == "cogr" else Path("reports") / self.method / "metrics.json"

    @property
    def plots_csv(self) -> Path:
        return Path("plots") / f"{self.method}_phases.csv"
