"""``--engine ray``: the same chunks on Ray actors, one model per actor; the driver writes the store.

Each actor loads the model once (``streetlamp.load(model)``, so ``model`` must be an embedded name or
a checkpoint folder every node can read) and runs ``work(adapter, chunk, settings)`` on whole chunks:
by default :func:`evaluate_chunk`, the function ``evaluate``'s local engine runs (``cot`` passes its
own chunk function, a module-level function so that Ray can ship it by reference). Results are
written by the driver as they arrive (``write(chunk_index, result)``; by default
``store.write_chunk(c, rows, arrays)``), so resumption and atomicity are the local engine's. ``address``: an existing cluster (``ray://host:10001`` or ``auto``);
without it a local instance is started. On a GPU cluster pass ``--device cuda``: each actor then
reserves one GPU (``num_gpus=1``), so ``--workers`` actors use that many GPUs.

Each Ray session is recorded in the manifest before its first chunk runs: ``manifest["engine"]`` is a
list with one entry per session that computed chunks (a run resumed on another cluster adds one),
see :func:`engine_record`. A local run has no ``engine`` key. The token of a cluster with token
authentication (``RAY_AUTH_TOKEN``) is never recorded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from ..errors import StreetlampError
from ..evaluation.pipeline import ChunkExample, EvalSettings
from ..extras import require
from ..store import RunStore

CONNECT_TIMEOUT_S = 10.0  # how long an unanswered cluster address is waited on


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` to probe for ``ray://host[:port]`` (Ray Client, port 10001 by default) or
    ``host:port`` (the cluster's GCS; an IPv6 host in brackets); None when there is no port to probe
    (``auto``, or a bare host: Ray decides)."""
    client = address.startswith("ray://")
    m = re.fullmatch(r"(\[[^\]]+\]|[^:\[\]]+)(?::(\d+))?", address.removeprefix("ray://"))
    if address == "auto" or m is None:
        return None
    host, port = m.group(1).strip("[]"), m.group(2) or ("10001" if client else None)
    if port is None or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def connect(address: str | None, workers: int | None = None, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Join the cluster at ``address`` (or start a local instance when None), or fail in one line naming the
    address within ``timeout`` seconds: a ``ray://`` address without Ray Client's package (grpc), an
    address nothing answers at (refused, or silent for ``timeout``), or one Ray itself refuses. Called by
    every command that runs on Ray before it makes its run folder; :func:`run_on_ray` calls it again
    (a no-op once connected)."""
    require("ray")
    import ray

    if ray.is_initialized():
        return
    if not address:
        ray.init(num_cpus=workers or os.cpu_count(), include_dashboard=False, log_to_driver=False)
        return
    if address.startswith("ray://"):
        import importlib.util

        if importlib.util.find_spec("grpc") is None:
            raise StreetlampError(f"Ray address {address} needs Ray Client: pip install 'ray[client]'")
    where = _host_port(address)
    if where is not None:
        import socket

        try:
            socket.create_connection(where, timeout=timeout).close()
        except OSError as e:
            why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
            raise StreetlampError(
                f"cannot reach a Ray cluster at {address} ({why}; waited at most {timeout:g} s)"
            ) from None
    try:
        ray.init(address=address, log_to_driver=False)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, ValueError, RuntimeError, ...
        why = " ".join(str(e).split())[:200]
        raise StreetlampError(f"cannot connect to the Ray cluster at {address} ({type(e).__name__}: {why})") from None


class _Worker:
    def __init__(self, model: str, device: str, threads: int, dtype: str = "float32") -> None:
        import torch

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        torch.set_num_threads(threads)
        from ..models.loading import load

        self.adapter = load(model)
        if device != "cpu" or dtype != "float32":
            self.adapter.to(device, dtype)

    def run(self, chunk: list[Any], settings: Any, work: Callable[[Any, list[Any], Any], Any] | None = None) -> Any:
        if work is None:
            from ..evaluation.pipeline import evaluate_chunk

            work = evaluate_chunk
        return work(self.adapter, chunk, settings)


def engine_record(ray: Any, address: str | None, workers: int, device: str, chunks: list[int]) -> dict[str, Any]:
    """What a Ray session ran on: the address asked for and the cluster's own (GCS) address, the actors
    started, the live nodes and the cluster's CPUs/GPUs, Ray's version, the chunks given to it."""
    from ..store.run_folder import utc_now

    try:
        gcs = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - an older Ray without it: the address asked for is still recorded
        gcs = None
    res = ray.cluster_resources()
    return {
        "name": "ray",
        "address": address or "local instance",
        "gcs_address": gcs,
        "workers": workers,
        "device": device,
        "nodes": sum(1 for x in ray.nodes() if x.get("Alive")),
        "cluster_resources": {k: float(res[k]) for k in ("CPU", "GPU") if k in res},
        "ray_version": getattr(ray, "__version__", "?"),
        "chunks": chunks,
        "started": utc_now(),
    }


def run_on_ray(
    model: str,
    device: str,
    settings: EvalSettings | Any,  # what ``work`` takes: EvalSettings for evaluate_chunk
    chunks: dict[int, list[ChunkExample]] | dict[int, list[Any]],
    store: RunStore,
    bar: Any,
    address: str | None = None,
    workers: int | None = None,
    work: Callable[[Any, list[Any], Any], Any] | None = None,
    write: Callable[[int, Any], None] | None = None,
    dtype: str = "float32",
) -> None:
    """``dtype``: the weights' dtype every actor places its model in (the driver's ``--dtype``)."""
    require("ray")
    import ray

    if not chunks:
        return
    connect(address, workers)
    gpu = device.startswith("cuda")
    n = max(1, min(len(chunks), workers or int(ray.cluster_resources().get("GPU" if gpu else "CPU", 1))))
    # ray types the actor class as ActorClass | type and its methods as plain callables (no .remote)
    cls: Any = ray.remote(num_gpus=1, num_cpus=1)(_Worker) if gpu else ray.remote(num_cpus=1)(_Worker)
    actors = [cls.remote(model, "cuda" if gpu else "cpu", 1, dtype) for _ in range(n)]
    record = engine_record(ray, address, n, "cuda" if gpu else "cpu", sorted(chunks))
    store.update_manifest({"engine": [*store.manifest().get("engine", []), record]})
    try:
        pending, queue = {}, list(chunks)
        for a in actors:
            if queue:
                c = queue.pop(0)
                pending[a.run.remote(chunks[c], settings, work)] = (c, a)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            c, a = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayTaskError as e:  # bad input found on an actor: its one line, not a traceback
                if isinstance(getattr(e, "cause", None), StreetlampError):
                    raise e.cause from None
                raise
            if write is None:
                store.write_chunk(c, *result)
            else:
                write(c, result)
            bar.update(len(chunks[c]))
            if queue:
                nc = queue.pop(0)
                pending[a.run.remote(chunks[nc], settings, work)] = (nc, a)
    finally:
        for a in actors:
            ray.kill(a)
