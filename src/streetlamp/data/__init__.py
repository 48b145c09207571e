"""Datasets for evaluation: bundled names (``movies``, ``tweets``, ``drugs``), CSV/JSONL files
with text and label columns, and ERASER-format folders with human rationales."""

from .loaders import BUNDLED, Dataset, Example, load_dataset, sample_indices

__all__ = ["BUNDLED", "Dataset", "Example", "load_dataset", "sample_indices"]
