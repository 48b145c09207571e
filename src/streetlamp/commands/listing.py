"""The commands without a model of their own: ``models``, ``methods``, ``report`` and ``serve`` (which
loads its models itself, one per ``--model``); ``attention-row`` is explain's (``commands/explain``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StreetlampError
from ..settings import NONE, NoSettings, Shared, option
from .base import Command, Lines


def run_models(adapter: None, s: NoSettings, out: None, opts: Any) -> Lines:
    from ..models.loading import DEFAULT_MODEL, EMBEDDED

    text = [
        f"{name:<18} {e.kind:<11} {e.description}{' (default)' if name == DEFAULT_MODEL else ''}"
        for name, e in EMBEDDED.items()
    ]
    text.append("or a path to a local Hugging Face checkpoint folder (bert, roberta, distilbert, gpt2, llama families)")
    return Lines(text)


def run_methods(adapter: None, s: NoSettings, out: None, opts: Any) -> Lines:
    from ..methods.registry import REGISTRY

    text = []
    for name, cls in REGISTRY.items():
        text.append(f"{name:<22} {cls.family:<14} {cls.description}")
        params = cls().params()
        if params:
            text.append(f"{'':<37} parameters: " + ", ".join(f"{k}={v!r}" for k, v in params.items()))
    text.append(
        '\nset parameters with --method-params \'{"METHOD": {"PARAM": VALUE}}\' or METHOD.PARAM=VALUE '
        "(explain, evaluate)"
    )
    return Lines(text)


@dataclass
class ReportSettings:
    dir: str = option("", positional=True, help="a run folder written by any streetlamp command")
    open: bool = option(False, help="open the report in the default browser")

    def check(self) -> None:
        pass


def run_report(adapter: None, s: ReportSettings, out: None, opts: Any) -> Lines:
    from ..report.viewer import write_report

    path = write_report(Path(s.dir))
    if s.open:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())
    return Lines([str(path)])


@dataclass
class ServeSettings:
    models: list[str] | None = option(
        None,
        flag="--model",
        action="append",
        help="embedded name or checkpoint folder; repeat for several (default minilm-sentiment)",
    )
    host: str = option("127.0.0.1", help="address to bind (default 127.0.0.1; others need --allow-remote)")
    port: int = option(8765)
    allow_remote: bool = option(False, help="allow a --host other than 127.0.0.1/localhost")
    runs: str = option("runs/serve", help="where 'save as run folder' writes (default runs/serve)")
    timeout: float = option(300.0, help="seconds one request may take (default 300)")
    queue: int = option(8, help="requests that may wait per model (default 8)")

    def check(self) -> None:
        from .serve import check_address

        check_address(self.host, self.port, self.allow_remote)  # before loading any model


def run_serve(adapter: None, s: ServeSettings, out: None, opts: Any) -> Lines:
    from ..models.loading import DEFAULT_MODEL, load
    from ..models.seq2seq import require_one_stack
    from .base import attach_features
    from .serve import serve

    if opts.features is not None and len(s.models or []) > 1:
        raise StreetlampError("serve --features splices one feature set into one model: give one --model")
    adapters = {}
    for name in s.models or [DEFAULT_MODEL]:
        a = load(name)
        require_one_stack(a, "serve")
        adapters[a.name] = a.to(opts.device, opts.dtype)
        attach_features(a, opts)
    serve(adapters, s.host, s.port, s.allow_remote, s.runs, s.timeout, s.queue)
    return Lines()


def _no_model(**kw: Any) -> dict[str, Any]:
    return {"needs_model": False, "writes": None, "shared": NONE, **kw}


MODELS = Command("models", "list the embedded models", NoSettings, run_models, **_no_model())
METHODS = Command("methods", "list the registered attribution methods", NoSettings, run_methods, **_no_model())
REPORT = Command(
    "report",
    "(re)build DIR/report.html from a run folder's manifest and arrays alone",
    ReportSettings,
    run_report,
    **_no_model(),
)
SERVE = Command(
    "serve",
    "a local web app on the report's front end: remove a token, ablate a head, live",
    ServeSettings,
    run_serve,
    extra="serve",
    **_no_model(
        shared=Shared(
            takes_model=False, out=None, overwrite=False, seed=False, batch_size=False, placement=False, features=True
        )
    ),
)
