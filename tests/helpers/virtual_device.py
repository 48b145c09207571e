"""A second device on the CPU: catch a tensor made on the wrong device without a GPU (issue 35, item 10).

On a GPU, a tensor created without ``device=`` lands on the CPU and the first operation that meets the
model's activations fails ("Expected all tensors to be on the same device"); on a CPU-only machine the
same code runs, because both are the CPU. :class:`VirtualDevice` is a torch function mode that keeps
the distinction torch no longer sees: every tensor carries a tag, *device* or *host*, and

* the model placed with ``.to("cpu:0")`` (:data:`VDEV`; outside this mode plain CPU memory) is on the
  device, and so is anything created with ``device=`` the device, moved there with ``.to``, or computed
  from a device tensor; ``tensor.device`` reads ``cpu:0`` for those (so ``device=x.device`` follows them);
* a factory call (``zeros``, ``ones``, ``arange``, ``tensor``, ``as_tensor``, ``from_numpy``, ``eye``,
  ``full``, ``rand*`` ... torch's own list of device constructors) without ``device=``, ``.cpu()`` and
  ``.to("cpu")`` make host tensors, as they would beside a GPU;
* an operation that meets a device tensor and a host tensor of at least one dimension raises the
  error CUDA raises (host scalars mix, as on CUDA; indexing and copies between devices are allowed, as
  on CUDA), and ``.numpy()`` / ``np.asarray`` of a device tensor raises as it does for a CUDA tensor.

Tensors the mode never saw made (autograd's gradients, tensors loaded by C++ code) carry no tag and
never raise: the mode can miss a bug there, never invent one. Use::

    with VirtualDevice():
        main(["circuit", ..., "--device", "cpu:0"])
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._device as _device
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

VDEV = torch.device("cpu", 0)  # the virtual device: CPU memory, a device of its own for this mode
TAG = "_streetlamp_on_vdev"
_FACTORIES = _device._device_constructors()
_MOVES = {torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda}
# calls that may meet both devices on CUDA too: copies between devices, and indexing with host indices
_MIXING_ALLOWED = {
    torch.Tensor.copy_,
    torch.Tensor.__getitem__,
    torch.Tensor.__setitem__,
    torch.Tensor.data.__set__,  # type: ignore[attr-defined]
    torch.Tensor.grad.__set__,  # type: ignore[attr-defined]
}
_TO_NUMPY = {torch.Tensor.numpy, torch.Tensor.__array__}


class WrongDevice(RuntimeError):
    """What CUDA raises when two devices meet (a RuntimeError, as there)."""


def on_vdev(t: torch.Tensor) -> bool | None:
    """True: on the virtual device; False: on the host; None: never seen made."""
    return getattr(t, TAG, None)


def mark(t: Any, on: bool | None) -> Any:
    if isinstance(t, torch.Tensor) and on is not None:
        try:
            setattr(t, TAG, on)
        except (AttributeError, RuntimeError):  # a tensor without __dict__ (rare): stays untagged
            pass
    return t


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among the arguments, one list or tuple deep (``cat``'s list; cheaper than a pytree walk)."""
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _host_factory(f: Any) -> Any:
    def made_on_host(*args: Any, **kwargs: Any) -> Any:
        return mark(f(*args, **kwargs), False)

    return made_on_host


def _is_vdev(device: Any) -> bool:
    d = torch.device(device) if isinstance(device, (str, int, torch.device)) else None
    return d is not None and (d.type == "cuda" or (d.type == "cpu" and d.index == 0))


def _name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


class VirtualDevice(TorchFunctionMode):
    """Tag tensors device/host and raise where a GPU would (the module docstring says how)."""

    _PATCHED = ("from_numpy", "frombuffer")  # factories that torch does not route through a mode

    def __init__(self) -> None:
        super().__init__()
        self.device_calls = 0  # calls that met a tensor on the device (a test checks the model went there)

    def __enter__(self) -> VirtualDevice:
        self._saved = {n: getattr(torch, n) for n in self._PATCHED}
        for n, f in self._saved.items():
            setattr(torch, n, _host_factory(f))
        self._deepcopy = torch.nn.Parameter.__deepcopy__  # a parameter's copy (a model's deepcopy) stays put

        def deepcopy(param: Any, memo: dict) -> Any:
            return mark(self._deepcopy(param, memo), on_vdev(param))

        torch.nn.Parameter.__deepcopy__ = deepcopy  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for n, f in self._saved.items():
            setattr(torch, n, f)
        torch.nn.Parameter.__deepcopy__ = self._deepcopy  # type: ignore[method-assign]

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func == torch.Tensor.device.__get__:  # type: ignore[attr-defined]
            return VDEV if on_vdev(args[0]) else func(*args, **kwargs)
        if func in _TO_NUMPY and on_vdev(args[0]):
            raise TypeError(
                f"can't convert {VDEV} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
                "memory first (the virtual device of tests/helpers/virtual_device.py, standing in for a GPU)"
            )
        if func in _FACTORIES:
            return self._factory(func, args, kwargs)
        if func in _MOVES:
            return self._move(func, args, kwargs)
        tensors = _tensors(args, kwargs)
        tags = [on_vdev(t) for t in tensors]
        dev = any(tag is True for tag in tags)
        host = [t for t, tag in zip(tensors, tags) if tag is False]
        self.device_calls += dev
        if dev and func not in _MIXING_ALLOWED and any(t.dim() > 0 for t in host):
            shapes = [tuple(t.shape) for t in host if t.dim() > 0]
            raise WrongDevice(
                f"Expected all tensors to be on the same device, but found at least two devices, {VDEV} (virtual) "
                f"and cpu! ({_name(func)}: host tensor(s) of shape {shapes} made without the model's device)"
            )
        out = func(*args, **kwargs)
        if func == torch.Tensor.data.__set__:  # type: ignore[attr-defined]  # param.data = moved (Module.to)
            mark(args[0], on_vdev(args[1]))
        elif tensors and (dev or host):
            seen = {id(t) for t in tensors}  # an in-place result keeps its own tag
            tree_map(lambda t: mark(t, dev) if isinstance(t, torch.Tensor) and id(t) not in seen else t, out)
        return out

    def _factory(self, func: Any, args: tuple, kwargs: dict) -> Any:
        out = func(*args, **kwargs)
        device = kwargs.get("device")
        if device is not None:
            tag = _is_vdev(device)
        elif func in (torch.as_tensor, torch.asarray, torch.tensor) and args and isinstance(args[0], torch.Tensor):
            tag = bool(on_vdev(args[0]))  # a tensor stays where it is
        else:
            tag = False  # no device given: the host, as beside a GPU
        return tree_map(lambda t: mark(t, tag), out)

    def _move(self, func: Any, args: tuple, kwargs: dict) -> Any:
        src = args[0]
        if func is torch.Tensor.cpu:
            tag: bool | None = False
        elif func is torch.Tensor.cuda:
            tag, func, args, kwargs = True, torch.Tensor.to, (src, VDEV), {}
        else:
            target = kwargs.get("device")
            other = kwargs.get("other")
            for a in args[1:]:
                if isinstance(a, torch.Tensor):
                    other = a
                elif isinstance(a, (str, torch.device)) and not isinstance(a, torch.dtype):
                    target = a
            if target is not None:
                tag = _is_vdev(target)
                if torch.device(target).type == "cuda":  # a GPU asked for on the CPU: the virtual one
                    kwargs = {**kwargs, "device": VDEV} if "device" in kwargs else kwargs
                    args = tuple(VDEV if a is target else a for a in args)
            elif other is not None:
                tag = on_vdev(other)
            else:
                tag = on_vdev(src)  # a dtype change stays where it is
        out = func(*args, **kwargs)
        if out is src and tag is not None and on_vdev(src) is not tag:
            out = src.view_as(src)  # .to() returns the tensor itself when nothing moves: tag a new alias
        return mark(out, tag)
