"""The Python API: one function per registered command, the README's Library examples run as
written, and ``import streetlamp`` stays cheap."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import streetlamp

ROOT = Path(__file__).resolve().parents[2]


def library_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Library\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_library_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = library_blocks()
    assert len(blocks) == 2 and "streetlamp.explain(" in blocks[0]
    monkeypatch.chdir(tmp_path)
    spaces: list[dict] = []
    for code in blocks:
        spaces.append({})
        exec(compile(code, "README.md", "exec"), spaces[-1])  # noqa: S102 - our own README, as written
    res = spaces[0]["res"]
    assert (
        res.manifest["streetlamp"] == "explain" and res.manifest["methods"]["occlusion"]["replacement_token"] == "[UNK]"
    )
    assert set(res.arrays) >= {"attention", "occlusion.tokens"} and "kendall_tau" in res.tables
    assert list(res.tables["kendall_tau"].columns) == list(
        __import__("pandas").read_csv(res.out / "kendall_tau.csv").columns
    )
    assert "<iframe" in res._repr_html_() and res.out.name.startswith("streetlamp-explain-")


def test_one_function_per_command() -> None:
    from streetlamp import api, commands

    assert [n for n in streetlamp._API if n != "RunResult"] == list(api.names())
    assert set(api.names().values()) == {c for c in commands.COMMANDS if c.writes is not None}
    assert (
        streetlamp.explain_generation.__name__ == "explain_generation"
        and "new_tokens" in streetlamp.explain_generation.__doc__
    )
    with pytest.raises(TypeError, match="positional"):
        streetlamp.explain("a", "b")


def test_api_refuses_like_the_cli(tmp_path: Path) -> None:
    from streetlamp.models.tiny import save_tiny

    bert = save_tiny("bert", tmp_path / "bert", seed=1)
    for kw, msg in [
        ({"methods": ["nope"]}, "unknown method 'nope'"),
        ({"layer": 9}, "--layer 9 out of range"),
        ({"bogus": 1}, "unknown setting(s) bogus"),
        ({"method_params": "occlusion.nope=1", "methods": "occlusion"}, "bad parameters"),
    ]:
        with pytest.raises(streetlamp.StreetlampError, match=re.escape(msg)):
            streetlamp.explain("the movie", model=str(bert), out=tmp_path / "o", **kw)
        assert not (tmp_path / "o").exists()


def test_evaluate_tables(tmp_path: Path) -> None:
    from streetlamp.models.tiny import WORDS, save_tiny

    bert = save_tiny("bert", tmp_path / "bert", seed=1)
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "\n".join(f"{WORDS[i]} {WORDS[i + 1]},{['neg', 'pos'][i % 2]}" for i in range(4)))
    res = streetlamp.evaluate(
        model=str(bert), data=str(data), methods="attention", adv_steps=2, permutations=2, flip_layers="all"
    )
    assert "summary" in res.tables and set(res.tables["summary"].columns) == {"method", "metric", "mean", "median", "n"}
    assert res.n_examples == 4 and (res.out / "report.html").exists()  # the runner's result, the pipeline's report


def test_import_is_cheap() -> None:
    code = "import sys, streetlamp; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
