"""Probing: what a representation holds (probes, control tasks, MDL) and whether it is used (amnesic)."""
