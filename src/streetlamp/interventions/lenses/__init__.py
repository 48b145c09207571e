"""Lenses: per-layer maps from a residual to logits (METHODS.md §11).

* :mod:`.base`: a :class:`~.base.Lens` (logit, tuned, Jacobian: one affine map per residual row, then
  the final norm and the unembedding) and its readout;
* :mod:`.store`: the lens folder (``lens.json`` + ``lens.safetensors``) and the tuned-lens package's
  folder (``config.json`` + ``params.pt``), each loaded with its checks;
* :mod:`.fit`: fitting a tuned lens (Adam on KL) and estimating a Jacobian lens (VJPs), held-out KL;
* :mod:`.check`: each lens checked against intervention, per prompt and layer.
"""
