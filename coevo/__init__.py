"""coevo: train retrievers with retrieval feedback (CoGR, GRAPE, CoHyDE) on one shared core."""

__version__ = "0.1.0"
