"""The circuit engine: an edge graph of heads and MLPs, edge scores (EAP, EAP-IG, exact patching),
circuits and their faithfulness with bootstrap intervals. Definitions: METHODS.md §9; the API:
docs/circuits.md."""
