"""``streetlamp serve``: a local web app on the report's front end where a click is an intervention.

:func:`serve` loads nothing itself: it takes loaded adapters, checks the address, prints the URL with a
fresh access token and runs uvicorn. The app is :func:`streetlamp.commands.serve.app.create_app`; the
computations are plain library calls in :mod:`streetlamp.commands.serve.compute`. See docs/serve.md.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from ...errors import StreetlampError
from ...extras import require

LOCAL_HOSTS = ("127.0.0.1", "localhost")


def check_address(host: str, port: int, allow_remote: bool) -> None:
    """Refuse a non-local address unless ``allow_remote``; refuse a port that is taken, before loading;
    refuse a missing ``serve`` extra (Starlette, uvicorn) then too."""
    require("serve")
    if not 1 <= port <= 65535:
        raise StreetlampError(f"--port {port} is not a TCP port (1..65535)")
    if host not in LOCAL_HOSTS:
        if not allow_remote:
            raise StreetlampError(
                f"--host {host} would let other machines reach the models; streetlamp serve binds "
                "127.0.0.1 unless you also pass --allow-remote"
            )
        if host in ("0.0.0.0", "::", ""):
            raise StreetlampError(
                "--host must be the address browsers will use (the Host header is checked), "
                "not a wildcard such as 0.0.0.0"
            )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise StreetlampError(f"cannot listen on {host}:{port} ({e.strerror or e}); pass another --port") from None


def serve(
    adapters: dict,
    host: str = "127.0.0.1",
    port: int = 8765,
    allow_remote: bool = False,
    runs_dir: Path | str = "runs/serve",
    timeout: float = 300.0,
    queue: int = 8,
) -> None:
    require("serve")
    import uvicorn

    from .app import Limits, create_app, new_token

    check_address(host, port, allow_remote)
    # the page shows progress: methods that report through streetlamp.progress leave their console bars out
    # (TQDM_DISABLE, for the others, takes effect only where tqdm is imported after this line)
    os.environ.setdefault("TQDM_DISABLE", "1")
    if host not in LOCAL_HOSTS:
        print(
            f"streetlamp: warning: serving on {host}:{port}: anyone who can reach this address and has the token "
            "can run the models; the connection is plain HTTP (not encrypted)",
            file=sys.stderr,
        )
    token = new_token()
    app = create_app(adapters, token, host, port, Limits(timeout=timeout, queue=queue), runs_dir)
    print(f"streetlamp serve: {', '.join(adapters)} on http://{host}:{port}/")
    print(f"open this URL (it holds the access token):\n    http://{host}:{port}/?token={token}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
