"""The viewer: one self-contained ``report.html`` per run folder, built from its manifest and arrays alone.

``write_report(folder)`` reads ``manifest.json`` and the folder's array files, never the model, and
writes ``folder/report.html`` atomically. The page holds its JavaScript, CSS and data inline, has a
Content-Security-Policy that forbids every network request, and renders every string from the run
as text. Which view the page opens is the manifest's ``streetlamp`` command name; a command without
a dedicated view gets the generic one (``tables``, ``figures`` and a summary of the manifest), see
docs/viewer.md.
"""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from pathlib import Path

from ...errors import StreetlampError
from ...version import __version__
from .folder import FORMAT_VERSION, load_folder, read_manifest
from .palettes import palettes

__all__ = ["FORMAT_VERSION", "build_html", "iframe_html", "read_manifest", "write_report"]

# the core first: the views register themselves in it
SCRIPTS = (
    "viewer.js",
    "explain.js",
    "views.js",
    "long.js",
    "atlas.js",
    "circuit.js",
    "lens.js",
    "features.js",
    "graph.js",
)
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
    "base-uri 'none'; form-action 'none'"
)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def script_json(obj: object) -> str:
    """JSON that cannot end its ``<script>`` element: ``<``, ``>`` and ``&`` only occur inside strings,
    where ``\\u003c`` means the same; U+2028/2029 are escaped for old JavaScript parsers."""
    s = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for a, b in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        s = s.replace(a, b)
    return s


def build_html(folder: Path) -> str:
    """The report page of a run folder as one string (raises StreetlampError on bad input)."""
    model, packed = load_folder(Path(folder))
    model["palettes"] = palettes()
    model["built_by"] = f"streetlamp {__version__}"
    js, css = "\n".join(_asset(f) for f in SCRIPTS), _asset("viewer.css")
    for name, text in (("viewer.js", js), ("viewer.css", css)):
        if "</script" in text.lower() or "</style" in text.lower():
            raise AssertionError(f"{name} must not contain a closing script/style tag")
    kind = model["view"]
    title = f"streetlamp {kind}: {Path(folder).resolve().name}"
    blobs = "\n".join(
        f'<script type="application/octet-stream" id="sl-blob-{i}">{b}</script>' for i, b in enumerate(packed.blobs)
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{css}</style>\n</head><body>\n"
        "<noscript>This report needs JavaScript (it runs offline, inside this file).</noscript>\n"
        '<div id="app" aria-live="polite">loading report...</div>\n'
        f'<script type="application/json" id="sl-model">{script_json(model)}</script>\n'
        f"{blobs}\n<script>{js}</script>\n</body></html>\n"
    )


def write_report(folder: Path) -> Path:
    """Write ``folder/report.html`` (temporary file + ``os.replace``: never a partial report)."""
    folder = Path(folder)
    page = build_html(folder)  # every check happens here, before anything is written
    out = folder / "report.html"
    tmp = folder / f".report.html.tmp-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)  # a symlink planted under this name is removed, never written through
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:
        raise StreetlampError(f"cannot write {out} ({e.strerror or e})") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def iframe_html(folder: Path, height: int = 760) -> str:
    """The report for a notebook cell: an ``<iframe srcdoc>`` so its scripts run in JupyterLab, VS Code
    and classic Jupyter alike (notebooks do not run scripts inserted as plain HTML output)."""
    page = build_html(Path(folder))
    return (
        f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width:100%;height:{int(height)}px;'
        'border:1px solid #ccc" sandbox="allow-scripts allow-downloads"></iframe>'
    )
