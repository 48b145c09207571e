"""streetlamp serve: the API through Starlette's TestClient (token, Host, Origin, limits, busy, timeout,
errors, hostile text) and the live computations against independent ones (HF hidden states, a
re-encoded edited text, `streetlamp heads`, the head-mask path, the report's own folder loader)."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cosine

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from streetlamp.cli import main  # noqa: E402
from streetlamp.commands.serve import compute as C  # noqa: E402
from streetlamp.commands.serve.app import Limits, create_app  # noqa: E402
from streetlamp.interventions.heads import head_mask_edits  # noqa: E402
from streetlamp.models.adapter import ModelAdapter  # noqa: E402
from streetlamp.models.loading import load  # noqa: E402
from streetlamp.models.tiny import save_tiny  # noqa: E402
from streetlamp.report.viewer.folder import load_folder  # noqa: E402
from streetlamp.report.viewer.pack import unpack  # noqa: E402
from streetlamp.store.files import load_arrays  # noqa: E402

TOKEN = "t" * 20 + "0123"
BASE = "http://127.0.0.1:8765"
TEXT = "the movie was not good , but the acting was great ."
HOSTILE = "</script><img src=x onerror=alert(1)> <b>bold</b> \x00\x07\x1b[31m\u2028 good"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {f: save_tiny(f, root / f, seed=1) for f in ("bert", "gpt2")}


@pytest.fixture(scope="module")
def bert(ckpts: dict[str, Path]) -> ModelAdapter:
    return load(str(ckpts["bert"]))


@pytest.fixture(scope="module")
def gpt2(ckpts: dict[str, Path]) -> ModelAdapter:
    return load(str(ckpts["gpt2"]))


def client(adapters: dict, tmp_path: Path, **limits) -> TestClient:
    app = create_app(adapters, TOKEN, "127.0.0.1", 8765, Limits(**limits), tmp_path / "runs")
    c = TestClient(app, base_url=BASE, raise_server_exceptions=False)
    c.headers["x-streetlamp-token"] = TOKEN
    return c


@pytest.fixture()
def api(bert: ModelAdapter, gpt2: ModelAdapter, tmp_path: Path) -> TestClient:
    return client({"bert": bert, "gpt2": gpt2}, tmp_path)


# -- security ---------------------------------------------------------------------------------------
def test_token_required_everywhere(api: TestClient) -> None:
    bare = TestClient(api.app, base_url=BASE)
    for path in ("/", "/frame", "/api/info", "/static/live.js", "/api/progress/abcdefgh", "/nowhere"):
        r = bare.get(path)
        assert r.status_code == 403 and "token" in r.json()["error"]
    assert bare.post("/api/explain", json={"text": TEXT}).status_code == 403
    assert bare.get("/api/info", headers={"x-streetlamp-token": TOKEN[:-1] + "x"}).status_code == 403
    assert bare.get("/?token=wrong", follow_redirects=False).status_code == 403
    r = bare.get(f"/?token={TOKEN}", follow_redirects=False)  # first load: a cookie, the token leaves the URL
    assert r.status_code == 303 and r.headers["location"] == "/"
    assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=strict" in r.headers["set-cookie"]
    assert bare.get("/api/info").status_code == 200  # the cookie now
    assert api.get("/api/info").status_code == 200  # the header


def test_host_and_origin(api: TestClient) -> None:
    assert api.get("/api/info", headers={"host": "evil.example:8765"}).status_code == 403  # DNS rebinding
    assert api.get("/api/info", headers={"host": "127.0.0.1:9999"}).status_code == 403
    assert api.get("/api/info", headers={"host": "localhost:8765"}).status_code == 200
    assert api.post("/api/explain", json={"text": TEXT}, headers={"origin": "http://evil.example"}).status_code == 403
    assert api.get("/api/info", headers={"origin": "null"}).status_code == 403
    assert api.get("/api/info", headers={"sec-fetch-site": "cross-site"}).status_code == 403
    assert api.get("/api/info", headers={"sec-fetch-site": "same-site"}).status_code == 403
    r = api.get("/api/info", headers={"origin": BASE, "sec-fetch-site": "same-origin"})
    assert r.status_code == 200


def test_page_csp_and_static(api: TestClient) -> None:
    r = api.get("/")
    csp = r.headers["content-security-policy"]
    assert "connect-src 'self'" in csp and "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert '<meta http-equiv="Content-Security-Policy"' in r.text and "<script>" not in r.text  # no inline script
    assert "frame-ancestors 'none'" in csp and r.headers["x-frame-options"] == "DENY" and "frame-src 'self'" in csp
    f = api.get("/frame")  # a minimal pair's side: framed by this server's page only, same scripts, no inline one
    assert (
        "frame-ancestors 'self'" in f.headers["content-security-policy"]
        and f.headers["x-frame-options"] == "SAMEORIGIN"
    )
    assert '<script src="/static/explain.js">' in f.text and "<script>" not in f.text
    assert api.get("/static/viewer.js").status_code == 200 and api.get("/static/live.css").status_code == 200
    for bad in ("/static/..%2Fapp.py", "/static/app.py", "/static/nope.js", "/api/../serve/app.py"):
        assert api.get(bad).status_code in (403, 404)


# -- limits and errors --------------------------------------------------------------------------------
def test_bad_requests_get_one_sentence(api: TestClient) -> None:
    cases = [(b"{bad", "not valid JSON"), (b"[1,2]", "JSON object"), (b"\xff\xfe", "not valid JSON")]
    for body, want in cases:
        r = api.post("/api/explain", content=body)
        assert r.status_code == 400 and want in r.json()["error"]
    for body, want in [
        ({"text": ""}, "empty"),
        ({"text": 5}, "string"),
        ({"text": TEXT, "model": "nope"}, "unknown model"),
        ({"text": TEXT, "methods": ["bogus"]}, "unknown method"),
        ({"text": TEXT, "truncate": "yes"}, "truncate"),
        ({}, "must be a string"),
    ]:
        r = api.post("/api/explain", json=body)
        assert r.status_code == 400 and want in r.json()["error"], (body, r.json())
    for body, want in [
        ({"text": TEXT, "position": 0, "op": "remove"}, "special token"),
        ({"text": TEXT, "position": 99, "op": "remove"}, "position"),
        ({"text": TEXT, "position": "1", "op": "remove"}, "position"),
        ({"text": TEXT, "position": 1, "op": "explode"}, "op must"),
        ({"text": TEXT, "position": 1, "op": "replace", "replacement": "not good"}, "2 tokens"),
    ]:
        r = api.post("/api/edit", json=body)
        assert r.status_code == 400 and want in r.json()["error"], (body, r.json())
    for heads, want in [
        ([], "non-empty"),
        ([[0, 9]], "head 9 out of range"),
        ([[7, 0]], "layer 7"),
        ([[0, 0], [0, 0]], "twice"),
        ([["0", 1]], "integers"),
        ("0,1", "list"),
    ]:
        r = api.post("/api/ablate", json={"text": TEXT, "heads": heads})
        assert r.status_code == 400 and want in r.json()["error"], (heads, r.json())
    r = api.post("/api/ablate", json={"text": TEXT, "heads": [[0, 0]], "ablation": "resample"})
    assert r.status_code == 400 and "zero' or 'mean" in r.json()["error"]
    assert api.post("/api/save", json={"id": "nope"}).status_code == 400
    assert api.get("/api/explain").status_code == 405 and "error" in api.get("/api/explain").json()
    assert api.get("/api/info").status_code == 200  # still serving


def test_size_limits(bert: ModelAdapter, tmp_path: Path) -> None:
    c = client({"bert": bert}, tmp_path, max_body=4096, max_chars=1000)
    r = c.post("/api/explain", content=json.dumps({"text": "good " * 2000}).encode())
    assert r.status_code == 413 and "too large" in r.json()["error"]
    r = c.post("/api/explain", json={"text": "good " * 300})
    assert r.status_code == 400 and "at most 1,000 characters" in r.json()["error"]


def test_hostile_text(api: TestClient, bert: ModelAdapter) -> None:
    long = ("good " * 2000)[:10_000]
    r = api.post("/api/explain", json={"text": long})
    assert r.status_code == 400
    assert r.json() == {
        "error": f"the text has {len(bert.tokenizer(long)['input_ids'])} tokens but {bert.name} takes "
        f"at most {bert.max_positions}: shorten it or tick 'truncate'"
    }
    r = api.post("/api/explain", json={"text": long, "truncate": True})
    assert r.status_code == 200 and r.json()["view"]["model"]["manifest"]["truncated"] is True
    r = api.post("/api/explain", json={"text": HOSTILE})
    assert r.status_code == 200
    assert r.json()["view"]["model"]["manifest"]["text"] == HOSTILE  # kept exactly; the page renders it as text
    r = api.post("/api/explain", json={"text": "\x00\x01\x1b"})  # one unknown word for the tiny tokenizer
    assert r.status_code == 200 and r.json()["view"]["model"]["manifest"]["text"] == "\x00\x01\x1b"
    r = api.post("/api/explain", json={"text": "\t\n  \r"})
    assert r.status_code == 400 and r.json() == {"error": "the text is empty: type at least one non-space character"}


def _block(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    started, release = threading.Event(), threading.Event()

    def slow(adapter, text, *, truncate=False, methods=None, stage=C._noop):
        stage("blocked on purpose")
        started.set()
        release.wait(30)
        stage("after the wait")
        return C.Live("explain", {"kind": "explain", "ok": True}, lambda folder: None)

    monkeypatch.setattr(C, "explain_text", slow)
    return started, release


def test_busy_queue_and_progress(bert: ModelAdapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = _block(monkeypatch)
    with client({"bert": bert}, tmp_path, queue=1) as c:
        out: list = []
        ts = [
            threading.Thread(
                target=lambda j=j: out.append(c.post("/api/explain", json={"text": TEXT, "job": f"job-{j}-abcdef"}))
            )
            for j in range(2)
        ]
        ts[0].start()
        assert started.wait(30)
        p = c.get("/api/progress/job-0-abcdef").json()
        assert p["state"] == "running" and p["stage"] == "blocked on purpose"
        ts[1].start()
        for _ in range(300):  # the second request waits in the queue
            if c.get("/api/progress/job-1-abcdef").status_code == 200:
                break
            time.sleep(0.02)
        assert c.get("/api/progress/job-1-abcdef").json()["state"] == "queued"
        r = c.post("/api/explain", json={"text": TEXT})
        assert r.status_code == 503 and r.json()["error"].startswith("busy: bert is computing and 1 request(s)")
        release.set()
        for t in ts:
            t.join(30)
        assert sorted(r.status_code for r in out) == [200, 200]
        assert c.get("/api/progress/job-1-abcdef").json()["state"] == "done"


def test_timeout_then_still_serving(bert: ModelAdapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = _block(monkeypatch)
    with client({"bert": bert}, tmp_path, timeout=0.5) as c:
        r = c.post("/api/explain", json={"text": TEXT, "job": "slow-job-1"})
        assert r.status_code == 504 and "timed out after 0.5 s" in r.json()["error"]
        release.set()
        for _ in range(200):  # the thread notices the cancel at its next step, then the model is free
            if c.post("/api/ablate", json={"text": TEXT, "heads": [[0, 0]]}).status_code == 200:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the model stayed busy after a timed-out request")


def test_internal_error_is_one_sentence(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise RuntimeError("kaput\nsecond line")

    monkeypatch.setattr(C, "minimal_pair", boom)
    r = api.post("/api/pair", json={"text_a": TEXT, "text_b": TEXT})
    assert (
        r.status_code == 500 and r.json()["error"] == "internal error (RuntimeError: kaput); the server keeps running"
    )
    assert api.get("/api/info").status_code == 200


# -- the computations, checked independently ----------------------------------------------------------
def test_explain_payload_is_the_reports(api: TestClient, bert: ModelAdapter, tmp_path: Path) -> None:
    r = api.post("/api/explain", json={"text": TEXT, "model": "bert", "job": "explain-job-1"}).json()
    model, blobs = r["view"]["model"], r["view"]["blobs"]
    assert model["view"] == "explain" and set(model["arrays"]) >= {"attention", "allowed", "occlusion.tokens"}
    out = tmp_path / "cli"
    assert (
        main(["explain", TEXT, "--model", str(bert.source or bert.name), "--methods", "occlusion", "--out", str(out)])
        == 0
    )
    ref = load_arrays(out / "arrays.safetensors")
    for k in ("attention", "occlusion.tokens", "probs"):
        got = unpack(model["arrays"][k], blobs)
        np.testing.assert_allclose(got, ref[k], rtol=0, atol=model["arrays"][k]["max_error"] + 1e-6)
    assert r["prediction"]["prob"] == pytest.approx(float(ref["probs"].max()), abs=1e-6)
    p = api.get("/api/progress/explain-job-1").json()
    assert p["state"] == "done" and [s for _, s in p["stages"]] == [
        "recording attention",
        "occlusion",
        "packing the view",
    ]
    s = api.post("/api/save", json={"id": r["id"]}).json()
    folder = Path(s["folder"])
    assert Path(s["report"]).is_file() and main(["report", str(folder)]) == 0
    m2, packed = load_folder(folder)
    assert m2["manifest"]["text"] == TEXT and m2["manifest"]["streetlamp"] == "explain"
    np.testing.assert_array_equal(
        unpack(m2["arrays"]["attention"], packed.blobs), unpack(model["arrays"]["attention"], blobs)
    )


def test_edit_against_reencoded_text_and_hf_hidden_states(api: TestClient, bert: ModelAdapter) -> None:
    words = TEXT.split()
    for op, rep, pos in (("remove", None, 4), ("replace", "bad", 5)):
        r = api.post("/api/edit", json={"text": TEXT, "position": pos, "op": op, "replacement": rep}).json()
        e = r["edit"]
        new = words[: pos - 1] + ([] if op == "remove" else [rep]) + words[pos:]  # position counts [CLS]
        inp = bert.tokenizer(" ".join(new), return_tensors="pt")
        old = bert.tokenizer(TEXT, return_tensors="pt")
        with torch.no_grad():
            o1 = bert.hf_model(**inp, output_hidden_states=True, output_attentions=True)
            o0 = bert.hf_model(**old, output_hidden_states=True, output_attentions=True)
        p1 = torch.softmax(o1.logits[0].double(), -1).numpy()
        p0 = torch.softmax(o0.logits[0].double(), -1).numpy()
        k = int(p0.argmax())
        assert e["after"]["index"] == int(p1.argmax()) and e["after"]["prob"] == pytest.approx(p1.max(), abs=1e-6)
        assert e["after"]["explained"]["prob"] == pytest.approx(p1[k], abs=1e-6)
        assert e["change"] == pytest.approx(p1[k] - p0[k], abs=1e-6)
        assert e["edited_ids"] == inp["input_ids"][0].tolist()
        for layer, row in enumerate(e["layers"]):
            h0, h1 = o0.hidden_states[layer][0].double().numpy(), o1.hidden_states[layer][0].double().numpy()
            assert row["explained_distance"] == pytest.approx(cosine(h0[0], h1[0]), abs=1e-5)
            if op == "replace":
                assert row["token_distance"] == pytest.approx(cosine(h0[pos], h1[pos]), abs=1e-5)
            else:
                assert row["token_distance"] is None
            if layer:
                a = o0.attentions[layer - 1][0, :, 0, pos].double().numpy()
                assert row["attention_mean"] == pytest.approx(a.mean(), abs=1e-6)
                assert row["attention_max"] == pytest.approx(a.max(), abs=1e-6)
        # every layer's attention of the edited input is in the view
        att = unpack(r["view"]["model"]["arrays"]["attention"], r["view"]["blobs"])
        ref = torch.stack(o1.attentions)[:, 0].numpy()
        np.testing.assert_allclose(att, ref, atol=r["view"]["model"]["arrays"]["attention"]["max_error"] + 1e-6)


def test_edit_chain_against_original(api: TestClient, bert: ModelAdapter) -> None:
    """Remove "not", then replace "good" (now at position 4) by "bad": the second edit applies on top of the
    first; every comparison is with the original text (HF's hidden states and attentions, re-encoded texts)."""
    edits = [{"position": 4, "op": "remove"}, {"position": 4, "op": "replace", "replacement": "bad"}]
    r = api.post("/api/edit", json={"text": TEXT, "edits": edits}).json()
    e = r["edit"]
    first, final = TEXT.replace("not ", ""), TEXT.replace("not good", "bad")
    old, mid, inp = (bert.tokenizer(t, return_tensors="pt") for t in (TEXT, first, final))
    with torch.no_grad():
        o0, om, o1 = (bert.hf_model(**x, output_hidden_states=True, output_attentions=True) for x in (old, mid, inp))
    p0, pm, p1 = (torch.softmax(o.logits[0].double(), -1).numpy() for o in (o0, om, o1))
    k = int(p0.argmax())
    assert e["edited_ids"] == inp["input_ids"][0].tolist()
    assert [x["description"] for x in e["edits"]] == ["token 4 'not' removed", "token 4 'good' replaced by 'bad'"]
    assert e["edits"][0]["after"]["explained"]["prob"] == pytest.approx(pm[k], abs=1e-6)
    assert e["edits"][1]["after"]["explained"]["prob"] == pytest.approx(p1[k], abs=1e-6)
    assert e["after"]["prob"] == pytest.approx(p1.max(), abs=1e-6) and e["change"] == pytest.approx(
        p1[k] - p0[k], abs=1e-6
    )
    assert e["before"]["explained"]["prob"] == pytest.approx(p0[k], abs=1e-6)
    assert e["original_position"] == 5 and e["origin"] == [0, 1, 2, 3] + list(range(5, old["input_ids"].shape[1]))
    for layer, row in enumerate(e["layers"]):  # against the original text, not the first edit's
        h0, h1 = o0.hidden_states[layer][0].double().numpy(), o1.hidden_states[layer][0].double().numpy()
        assert row["explained_distance"] == pytest.approx(cosine(h0[0], h1[0]), abs=1e-5)
        assert row["token_distance"] == pytest.approx(cosine(h0[5], h1[4]), abs=1e-5)  # "good" was at 5
        if layer:
            a = o0.attentions[layer - 1][0, :, 0, 5].double().numpy()
            assert row["attention_mean"] == pytest.approx(a.mean(), abs=1e-6)
    # positions count the tokens the earlier edits left; special tokens and emptying the text are refused
    n = len(e["edited_ids"])
    bad = [
        ([{"position": 4, "op": "remove"}, {"position": n, "op": "remove"}], "edit 2: position must be a token index"),
        ([{"position": 1, "op": "replace", "replacement": "[MASK]"}, {"position": 0, "op": "remove"}], "special token"),
        ([{"position": 1, "op": "remove"}, {"position": 1, "op": "remove"}], "no token of the text"),
        ([{"position": 1, "op": "remove"}] * 65, "at most 64 edits"),
        ([], "non-empty list"),
    ]
    for chain, want in bad:
        text = "good movie" if "no token" in want else TEXT
        r = api.post("/api/edit", json={"text": text, "edits": chain})
        assert r.status_code == 400 and want in r.json()["error"], (chain, r.json())
    # a replaced token ([MASK], special) can be edited again: it is a token of the text
    chain = [{"position": 1, "op": "replace", "replacement": "[MASK]"}, {"position": 1, "op": "remove"}]
    e2 = api.post("/api/edit", json={"text": TEXT, "edits": chain}).json()["edit"]
    assert e2["edited_ids"] == bert.tokenizer(TEXT.replace("the movie", "movie", 1))["input_ids"]


def test_progress_reaches_the_listener(bert: ModelAdapter, tmp_path: Path) -> None:
    """Occlusion reports each batch of perturbed rows; a listener that raises stops it at the next batch."""
    from streetlamp import progress
    from streetlamp.methods.registry import get_method
    from streetlamp.models.adapter import Target

    inp = bert.encode(TEXT)
    n = inp.lengths[0]
    seen: list[tuple[str, int, int]] = []
    with progress.listening(lambda *a: seen.append(a)):
        get_method("occlusion").attribute(bert, inp, target=Target(), batch_size=3 * n)
    rows = n - 2  # every token but [CLS] and [SEP], three rows per forward pass
    assert seen == [("occlusion", d, rows) for d in [0, *range(3, rows, 3), rows]]

    class Stop(Exception):
        pass

    def stop(what: str, done: int, total: int) -> None:
        if done >= 3:
            raise Stop()
        seen.append((what, done, total))

    seen.clear()
    with pytest.raises(Stop), progress.listening(stop):
        get_method("occlusion").attribute(bert, inp, target=Target(), batch_size=3 * n)
    assert seen == [("occlusion", 0, rows)]
    seen.clear()  # integrated gradients counts its batches of path points
    with progress.listening(lambda *a: seen.append(a)):
        get_method("integrated_gradients", steps=8).attribute(bert, inp, target=Target(), batch_size=2 * n)
    total = seen[0][2]
    assert total >= 2 and seen == [("IG steps", d, total) for d in range(total + 1)]
    with progress.listening(lambda *a: None), progress.bar(100, "listened", disable=False) as b:
        assert b.bar.disable  # the listener shows it: no console bar as well
    with progress.bar(100, "alone", file=io.StringIO(), disable=False) as b:
        assert not b.bar.disable
    with client({"bert": bert}, tmp_path) as c:  # the progress record says the last step
        c.post("/api/explain", json={"text": TEXT, "job": "progress-job-1"})
        p = c.get("/api/progress/progress-job-1").json()
        assert p["state"] == "done" and p["step"] is None and p["stage"] == "done"


def test_ablation_equals_streetlamp_heads(api: TestClient, bert: ModelAdapter, tmp_path: Path) -> None:
    for ablation in ("zero", "mean"):
        out = tmp_path / f"heads-{ablation}"
        assert (
            main(["heads", TEXT, "--model", bert.source or bert.name, "--ablation", ablation, "--out", str(out)]) == 0
        )
        ref = load_arrays(out / "arrays.safetensors")["ablation"]
        heads = [[0, 1], [1, 3], [1, 0]]
        r = api.post("/api/ablate", json={"text": TEXT, "model": "bert", "heads": heads, "ablation": ablation}).json()
        for row in r["heads"]:
            assert row["effect"] == pytest.approx(float(ref[row["layer"], row["head"]]), abs=1e-5)
    # several heads at once (zero) = the head-mask path with those heads' multipliers at 0
    r = api.post("/api/ablate", json={"text": TEXT, "heads": heads, "ablation": "zero"}).json()
    xi = torch.ones(bert.n_layers, bert.n_heads)
    for l, h in heads:
        xi[l, h] = 0
    inp = bert.encode(TEXT)
    with torch.no_grad():
        p = torch.softmax(bert.forward(inp, edit=head_mask_edits(bert, xi)).logits[0].double(), -1)
        p0 = torch.softmax(bert.forward(inp).logits[0].double(), -1)
    k = int(p0.argmax())
    assert r["joint"]["prob"] == pytest.approx(float(p[k]), abs=1e-6)
    assert r["joint"]["effect"] == pytest.approx(float(p[k] - p0[k]), abs=1e-6)
    from streetlamp.interventions.heads import attention_mass

    mass, _ = attention_mass(bert, inp)
    assert [row["attention_mass"] for row in r["heads"]] == pytest.approx([float(mass[0, l, h]) for l, h in heads])
    s = api.post("/api/save", json={"id": r["id"]}).json()
    assert main(["report", s["folder"]]) == 0


def test_pair_and_causal_lm(api: TestClient, gpt2: ModelAdapter) -> None:
    a, b = "the movie was not good", "the movie was not bad"
    r = api.post("/api/pair", json={"model": "gpt2", "text_a": a, "text_b": b}).json()
    ia, ib = gpt2.encode(a), gpt2.encode(b)
    with torch.no_grad():
        oa = gpt2.hf_model(input_ids=ia.input_ids, output_attentions=True)
        ob = gpt2.hf_model(input_ids=ib.input_ids, output_attentions=True)
    pa = torch.softmax(oa.logits[0, -1].double(), -1)
    pb = torch.softmax(ob.logits[0, -1].double(), -1)
    k = int(pa.argmax())
    assert r["change"] == pytest.approx(float(pb[k] - pa[k]), abs=1e-6)
    assert r["differing"] == [4] and r["explained_position"] == 4
    da = torch.stack(oa.attentions)[:, 0, :, -1].double().numpy()
    db = torch.stack(ob.attentions)[:, 0, :, -1].double().numpy()
    np.testing.assert_allclose(np.array(r["row_tv"]), 0.5 * np.abs(db - da).sum(-1), atol=1e-6)
    np.testing.assert_allclose(np.array(r["on_differing"]), db[..., 4] - da[..., 4], atol=1e-6)
    top = set(torch.argsort(-pa)[:10].tolist()) | set(torch.argsort(-pb)[:10].tolist())  # a causal LM: top 10s
    assert {o["index"] for o in r["outputs"]} == top
    for o in r["outputs"]:
        i = o["index"]
        want = (float(pa[i]), float(pb[i]), float(pb[i] - pa[i]))
        assert (o["p_a"], o["p_b"], o["diff"]) == pytest.approx(want, abs=1e-6)
    assert [abs(o["diff"]) for o in r["outputs"]] == sorted((abs(o["diff"]) for o in r["outputs"]), reverse=True)
    for side, text, o in (("a", a, oa), ("b", b, ob)):  # each side's explain view, as the report draws it
        view = r[side]["view"]
        assert view["model"]["view"] == "explain" and view["model"]["manifest"]["text"] == text
        att = unpack(view["model"]["arrays"]["attention"], view["blobs"])
        ref = torch.stack(o.attentions)[:, 0].numpy()
        np.testing.assert_allclose(att, ref, atol=view["model"]["arrays"]["attention"]["max_error"] + 1e-6)
    r2 = api.post("/api/pair", json={"model": "gpt2", "text_a": a, "text_b": a + " ."}).json()
    assert r2["same_length"] is False and "same number of tokens" in r2["note"]
    # a causal LM's edit: removing the last token moves the explained position to the new last token
    e = api.post("/api/edit", json={"model": "gpt2", "text": a, "position": 4, "op": "remove"}).json()["edit"]
    assert e["explained_position"] == [4, 3]
    with torch.no_grad():
        o = gpt2.hf_model(input_ids=gpt2.encode("the movie was not").input_ids)
    assert e["after"]["prob"] == pytest.approx(float(torch.softmax(o.logits[0, -1].double(), -1).max()), abs=1e-6)


def test_cli_refuses_remote_and_taken_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--host", "10.1.2.3"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["serve", "--host", "0.0.0.0", "--allow-remote"]) == 2
    assert "wildcard" in capsys.readouterr().err
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert main(["serve", "--port", str(s.getsockname()[1]), "--model", "nowhere-model"]) == 2
        assert "cannot listen" in capsys.readouterr().err
