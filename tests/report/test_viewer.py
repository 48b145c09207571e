"""report.html without a browser: packing is lossless where it says so, bad folders fail in one line and
leave no file, the embedded data cannot break out of its script element."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from streetlamp.cli import main
from streetlamp.errors import StreetlampError
from streetlamp.models.tiny import save_tiny
from streetlamp.report.viewer import FORMAT_VERSION, build_html, script_json, write_report
from streetlamp.report.viewer.pack import Packed, unpack
from streetlamp.store.files import load_arrays

HOSTILE = "</script><img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("v")
    ckpt = save_tiny("gpt2", root / "gpt2", seed=1)
    out = root / "run"
    assert (
        main(
            [
                "explain",
                "the movie was not good",
                "--model",
                str(ckpt),
                "--methods",
                "attention,occlusion",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out


def copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(run, dst)
    (dst / "report.html").unlink(missing_ok=True)
    return dst


def test_packing_round_trip() -> None:
    rng = np.random.default_rng(0)
    small = rng.normal(size=(5, 7)).astype(np.float32)
    big01 = rng.dirichlet(np.ones(200), size=(2, 3, 200)).astype(np.float32)  # 240k values in [0, 1]
    signed = rng.normal(size=(3, 200, 200)).astype(np.float64)
    p = Packed()
    p.add("small", small)
    p.add("big01", big01)
    p.add("signed", signed)
    p.add("mask", np.tri(4, dtype=bool))
    assert p.index["small"]["codec"] == "f32" and p.index["big01"]["codec"] == "u16"
    assert p.index["signed"]["codec"] == "f32" and len(p.index["big01"]["chunks"]) == 2  # one chunk per layer
    np.testing.assert_array_equal(unpack(p.index["small"], p.blobs), small)
    np.testing.assert_array_equal(unpack(p.index["signed"], p.blobs), signed.astype(np.float32))
    np.testing.assert_array_equal(unpack(p.index["mask"], p.blobs), np.tri(4))
    got = unpack(p.index["big01"], p.blobs)
    assert np.abs(got - big01).max() <= p.index["big01"]["max_error"] + 1e-7  # 0.5 / 65535
    for codec, scale in (("u12", 4095), ("u8", 255)):
        qp = Packed()
        qp.add("a", big01, codec=codec)
        assert qp.index["a"]["max_error"] == 0.5 / scale
        assert np.abs(unpack(qp.index["a"], qp.blobs) - big01).max() <= 0.5 / scale + 1e-7
    twice = Packed()  # an identical array travels once
    twice.add("a", big01)
    twice.add("b", big01.copy())
    assert twice.index["a"]["chunks"] == twice.index["b"]["chunks"] and len(twice.blobs) == 2
    assert all(re.fullmatch(r"[A-Za-z0-9+/=]*", b) for b in p.blobs)  # base64: no '<', cannot close a script


def test_script_json_cannot_close_its_element() -> None:
    s = script_json({"t": HOSTILE, "u": "a\u2028b & <!-- -->"})
    assert "<" not in s and ">" not in s and "&" not in s and "\u2028" not in s
    assert json.loads(s) == {"t": HOSTILE, "u": "a\u2028b & <!-- -->"}


def test_report_is_self_contained(run: Path) -> None:
    path = write_report(run)
    html = path.read_text()
    assert 'http-equiv="Content-Security-Policy"' in html and "default-src 'none'" in html
    # no external resource of any kind: no src/href attributes at all, no URL in the code
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", html)
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html
    assert "eval(" not in html and "new Function" not in html and "innerHTML" not in html
    a = load_arrays(run / "arrays.safetensors")
    m = json.loads(re.search(r'<script type="application/json" id="sl-model">(.*?)</script>', html, re.S).group(1))
    blobs = dict(re.findall(r'<script type="application/octet-stream" id="sl-blob-(\d+)">([^<]*)</script>', html))
    blob_list = [blobs[str(i)] for i in range(len(blobs))]
    for k, v in a.items():
        got = unpack(m["arrays"][k], blob_list)
        assert np.abs(got - v.astype(np.float64)).max() <= m["arrays"][k]["max_error"] + 1e-6, k
    assert (
        m["view"] == "explain" and m["manifest"]["tokens"] == json.loads((run / "manifest.json").read_text())["tokens"]
    )


def test_cli_report(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    dst = copy(run, tmp_path)
    assert main(["report", str(dst)]) == 0
    assert capsys.readouterr().out.strip() == str(dst / "report.html")
    assert (dst / "report.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    "damage, message",
    [
        ("no_manifest", "not a run folder (no manifest.json)"),
        ("bad_json", "is not valid JSON"),
        ("newer", f"reads up to format {FORMAT_VERSION}"),
        ("no_kind", "no 'streetlamp' command name"),
        ("no_arrays", "arrays.safetensors is missing"),
        ("corrupt_arrays", "is not a readable safetensors file"),
        ("truncated_arrays", "arrays.safetensors"),
        ("array_not_listed", "lacks the array(s) ghost"),
    ],
)
def test_bad_folders_fail_in_one_line_without_a_file(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, damage: str, message: str
) -> None:
    dst = copy(run, tmp_path)
    mpath, apath = dst / "manifest.json", dst / "arrays.safetensors"
    m = json.loads(mpath.read_text())
    if damage == "no_manifest":
        mpath.unlink()
    elif damage == "bad_json":
        mpath.write_text("{not json")
    elif damage == "newer":
        m["format_version"] = FORMAT_VERSION + 1
        mpath.write_text(json.dumps(m))
    elif damage == "no_kind":
        del m["streetlamp"]
        mpath.write_text(json.dumps(m))
    elif damage == "no_arrays":
        apath.unlink()
    elif damage == "corrupt_arrays":
        apath.write_bytes(b"\x00" * 64)
    elif damage == "truncated_arrays":
        apath.write_bytes(apath.read_bytes()[: apath.stat().st_size // 2])
    elif damage == "array_not_listed":
        m["arrays"]["ghost"] = {"file": "arrays.safetensors", "axes": ["x"]}
        mpath.write_text(json.dumps(m))
    with pytest.raises(StreetlampError, match=re.escape(message)):
        build_html(dst)
    assert main(["report", str(dst)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("streetlamp: error:") and message in err
    assert not (dst / "report.html").exists() and not list(dst.glob(".report.html.tmp-*"))


def test_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(StreetlampError, match="is not a folder"):
        write_report(tmp_path / "nowhere")


def test_generic_view_for_any_command(tmp_path: Path) -> None:
    """A command without its own view declares tables and figures; the page embeds them."""
    import base64

    folder = tmp_path / "probe"
    folder.mkdir()
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    )
    (folder / "fig.png").write_bytes(png)
    (folder / "manifest.json").write_text(
        json.dumps(
            {
                "streetlamp": "probe",
                "tables": [{"title": "accuracy", "columns": ["layer", "acc"], "rows": [[0, 0.5]]}],
                "figures": [{"file": "fig.png", "shows": "a pixel"}, {"file": "../outside.png", "shows": "refused"}],
            }
        )
    )
    with pytest.raises(StreetlampError, match="refusing '../outside.png': it leads outside the run folder"):
        build_html(folder)  # a name leading out of the folder is refused, never read (it was skipped before)
    m = json.loads((folder / "manifest.json").read_text())
    m["figures"] = m["figures"][:1]
    (folder / "manifest.json").write_text(json.dumps(m))
    html = build_html(folder)
    assert "data:image/png;base64," + base64.b64encode(png).decode() in html
    assert html.count("data:image/png;base64,") == 1


@pytest.mark.slow
def test_minilm_128_token_report_under_2mb(tmp_path: Path) -> None:
    """The issue's budget: the explain report of a 128-token text on minilm-sentiment with the default
    methods stays under 2 MB."""
    import sys

    import streetlamp
    from streetlamp.commands.explain import ExplainSettings
    from streetlamp.commands.explain.run import default_methods, explain

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from common import text_of_length

    adapter = streetlamp.load("minilm-sentiment")
    text = text_of_length(adapter, 128)
    assert len(adapter.encode(text).tokens[0]) == 128
    res = explain(adapter, ExplainSettings.from_values(text=text, methods=default_methods()), tmp_path / "e")
    path = write_report(res.out)
    assert path.stat().st_size < 2_000_000, path.stat().st_size
    m = json.loads(re.search(r'id="sl-model">(.*?)</script>', path.read_text(), re.S).group(1))
    assert m["arrays"]["attention"]["codec"] == "u12" and m["arrays"]["attention"]["max_error"] < 1.3e-4


def test_fixed_point_attention_keeps_exact_explained_rows(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the full tensor travels in 12 bits, the explained position's rows travel exactly (ranks and
    Kendall tau must not see quantisation ties)."""
    from streetlamp.report.viewer import folder as fmod
    from streetlamp.report.viewer import pack

    monkeypatch.setattr(pack, "SMALL", 0)
    monkeypatch.setattr(fmod, "SMALL", 0)
    monkeypatch.setattr(pack, "U16_BUDGET", 0)
    html = build_html(run)
    m = json.loads(re.search(r'id="sl-model">(.*?)</script>', html, re.S).group(1))
    blobs = dict(re.findall(r'id="sl-blob-(\d+)">([^<]*)</script>', html))
    blobs_l = [blobs[str(i)] for i in range(len(blobs))]
    assert m["arrays"]["attention"]["codec"] == "u12"
    att = load_arrays(run / "arrays.safetensors")["attention"]
    pos = m["manifest"]["explained_position"]["index"]
    rows = unpack(m["arrays"]["attention@explained"], blobs_l)
    np.testing.assert_array_equal(rows, att[:, :, pos, :])
    assert np.abs(unpack(m["arrays"]["attention"], blobs_l) - att).max() <= 0.5 / 4095 + 1e-7
