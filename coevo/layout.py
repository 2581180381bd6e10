"""Where each artifact of a method's pipeline lives, relative to the project root.

The run directory belongs to the method (``coevo.methods``: nothing else knows a file name
inside it); the other paths are the pipeline's outputs that DVC tracks and users open.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coevo.config import Params


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
