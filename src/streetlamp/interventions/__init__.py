"""Interventions on heads and circuits: one patching engine (engine.py), head ablation,
importance and pruning (heads.py), activation / path / attribution patching (patching.py),
causal mediation (mediation.py). Definitions: docs/heads-and-circuits.md."""
