"""Features: fitting sparse dictionaries on a model's own activations, their metrics and dashboards (METHODS.md §13)."""
