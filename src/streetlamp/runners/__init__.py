"""Runners: the jobs behind the CLI subcommands, as library calls."""
