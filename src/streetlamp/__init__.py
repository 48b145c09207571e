"""streetlamp: what a Transformer's attention really explains.

>>> import streetlamp
>>> adapter = streetlamp.load("minilm-sentiment")
>>> inputs = adapter.encode("The movie was not good, but the acting was great.")
>>> fwd = adapter.forward(inputs, record=["layers.*.attn.pattern"])
"""

from .errors import StreetlampError
from .models.adapter import Forward, Inputs, ModelAdapter, Target
from .models.loading import DEFAULT_MODEL, EMBEDDED, load

__all__ = ["load", "ModelAdapter", "Inputs", "Target", "Forward", "StreetlampError", "EMBEDDED", "DEFAULT_MODEL"]
__version__ = "0.1.0"
