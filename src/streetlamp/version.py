"""The package's version, on the lowest floor (the report stamps it; ``streetlamp.__version__`` re-exports it)."""

__version__ = "0.1.0"
