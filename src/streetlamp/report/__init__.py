"""Rendering: functions that consume saved arrays and write figures; they never recompute."""
