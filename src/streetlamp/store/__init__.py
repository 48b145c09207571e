"""The run store: one folder per evaluation run, resumable and readable without streetlamp."""
from .run_store import RunStore, read_metrics

__all__ = ["RunStore", "read_metrics"]
