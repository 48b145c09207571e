"""Attribution graphs with attention explained (METHODS.md §13): the local replacement model
(:mod:`.replacement`), its edges (:mod:`.attribution`), pruning and scores (:mod:`.pruning`)."""

from __future__ import annotations

from .attribution import Graph, attribute, salient_logits
from .pruning import Pruned, graph_scores, influence, normalize, prune

__all__ = ["Graph", "Pruned", "attribute", "graph_scores", "influence", "normalize", "prune", "salient_logits"]
