"""Attribution methods, one module per family; see :mod:`streetlamp.methods.registry`."""

from .base import Method
from .registry import REGISTRY, get_method, list_methods

__all__ = ["Method", "REGISTRY", "get_method", "list_methods"]
