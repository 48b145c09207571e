"""The user-string parsers (streetlamp.specs): each accepts what the help says and refuses the rest
in one line naming the flag; the module imports no model, torch or registry."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streetlamp.errors import StreetlampError
from streetlamp.specs import (
    layer_spec,
    parse_data,
    parse_heads,
    parse_indices,
    parse_max_memory,
    parse_method_params,
    parse_names,
    parse_params,
    parse_rows,
    parse_split,
    parse_tasks,
    split_list,
)


def test_imports_nothing_heavy() -> None:
    code = (
        "import sys, streetlamp.specs; print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_method_params_json_and_pairs_agree() -> None:
    as_json = parse_method_params(
        '{"integrated_gradients": {"rule": "panels", "steps": 16}, "occlusion": {"group": "word"}}'
    )
    as_pairs = parse_method_params(
        "integrated_gradients.rule=panels, integrated_gradients.steps=16,occlusion.group=word"
    )
    assert (
        as_pairs == as_json == {"integrated_gradients": {"rule": "panels", "steps": 16}, "occlusion": {"group": "word"}}
    )
    assert isinstance(as_pairs["integrated_gradients"]["steps"], int)


def test_pair_values_are_json_where_they_parse() -> None:
    got = parse_method_params('m.a=16,m.b=0.5,m.c=true,m.d=null,m.e=[1, 2],m.f="x,y",m.g=panels,m.h=1e-3')
    assert got == {"m": {"a": 16, "b": 0.5, "c": True, "d": None, "e": [1, 2], "f": "x,y", "g": "panels", "h": 1e-3}}
    assert parse_method_params("m.baseline=[MASK]") == {"m": {"baseline": "[MASK]"}}  # not JSON: the string
    assert parse_method_params(None) == parse_method_params("") == {}
    assert parse_method_params({"m": {"a": 1}}) == {"m": {"a": 1}}  # the Python API's dict


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("{not json", "--method-params is not JSON"),
        ('{"occlusion": 3}', "object of objects"),
        ("[1, 2]", "object of objects"),
        ("integrated_gradients", "give JSON or METHOD.PARAM=VALUE pairs"),
        ("rule=panels", "'rule=panels': give JSON or METHOD.PARAM=VALUE pairs"),
        ("ig.rule=", "give JSON or METHOD.PARAM=VALUE"),
        ("ig.rule=panels,,ig.steps=2", "give JSON"),
        ("ig.a.b=1", "give JSON"),
        ("ig.rule=panels,ig.rule=gauss", "sets ig.rule twice"),
    ],
)
def test_method_params_refused(spec: str, msg: str) -> None:
    with pytest.raises(StreetlampError, match=None) as e:
        parse_method_params(spec)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_one_methods_params() -> None:
    assert parse_params('{"rule": "panels", "steps": 16}', "--ig-params") == {"rule": "panels", "steps": 16}
    assert parse_params("rule=panels,steps=16", "--ig-params") == {"rule": "panels", "steps": 16}
    for bad, msg in [("{x", "--ig-params is not JSON"), ("[1]", "must be a JSON object"), ("ig.rule=a", "PARAM=VALUE")]:
        with pytest.raises(StreetlampError, match=None) as e:
            parse_params(bad, "--ig-params")
        assert msg in str(e.value)


def test_max_memory() -> None:
    assert parse_max_memory("0=20GiB, cpu=30GiB,1=512MB") == {0: "20GiB", "cpu": "30GiB", 1: "512MB"}
    assert parse_max_memory(None) is None
    for bad in ("lots", "0=20", "gpu=1GiB", "=1GiB", "0=1GiB,cpu"):
        with pytest.raises(StreetlampError, match="--max-memory"):
            parse_max_memory(bad)


def test_layers_indices_rows_heads() -> None:
    assert [layer_spec(s) for s in ("last", "all", "3")] == ["last", "all", "3"]
    with pytest.raises(StreetlampError, match="--flip-layers must be last, all or a layer number"):
        layer_spec("foo", "--flip-layers")
    assert parse_indices("0,5,-1", 6, "--layers", "layer") == [0, 5]  # -1 is 5: once
    assert parse_indices(None, 3, "--heads", "head") == parse_indices("all", 3, "--heads", "head") == [0, 1, 2]
    with pytest.raises(StreetlampError, match=r"--heads 4 out of range: the model has heads 0..3"):
        parse_indices("4", 4, "--heads", "head")
    with pytest.raises(StreetlampError, match="comma-separated layer numbers"):
        parse_indices("x", 4, "--layers", "layer")
    assert parse_rows(None, 10, 7) == [7]
    assert parse_rows("last,explained,2:4,-2", 10, 5) == [2, 3, 5, 8, 9]
    assert parse_rows(":2", 10, 5) == [0, 1]
    for bad, msg in [("10", "out of range"), ("4:2", "out of range"), ("x", "takes last, explained")]:
        with pytest.raises(StreetlampError, match=msg):
            parse_rows(bad, 10, 5)
    assert parse_heads("logits", 2, 4) is None and parse_heads("1.3, 0.0", 2, 4) == [(1, 3), (0, 0)]
    with pytest.raises(StreetlampError, match="receiver 2.0 out of range"):
        parse_heads("2.0", 2, 4)
    with pytest.raises(StreetlampError, match="write LAYER.HEAD"):
        parse_heads("1-3", 2, 4)


def test_names_tasks_data_split() -> None:
    assert split_list(" a, b,,c ") == ["a", "b", "c"] == split_list(["a", " b", "", "c"])
    assert parse_tasks("all", ["k", "o"]) == parse_tasks(None, ["k", "o"]) == ["k", "o"]
    assert parse_tasks("o", ["k", "o"]) == ["o"]
    with pytest.raises(StreetlampError, match="unknown task 'x'; tasks: k, o"):
        parse_tasks("k,x", ["k", "o"])
    with pytest.raises(StreetlampError, match="no thing named"):
        parse_names(",", ["a"], what="thing")
    assert parse_data("tweets,movies,tweets", ("movies", "tweets")) == ["tweets", "movies"]
    with pytest.raises(StreetlampError, match=r"--data takes a comma-separated list of movies, tweets \(got 'imdb'\)"):
        parse_data("imdb", ("movies", "tweets"))
    assert parse_split("0.6,0.2,0.2") == (0.6, 0.2, 0.2) == parse_split([0.6, 0.2, 0.2])
    for bad in ("0.5,0.5", "a,b,c", "0.1,0.2,0.3,0.4"):
        with pytest.raises(StreetlampError, match="--split is three fractions"):
            parse_split(bad)


def test_pairs_reach_the_run(tmp_path, capsys) -> None:
    """``--method-params occlusion.replacement=unk`` is the JSON form's run: the same manifest record."""
    import json

    from streetlamp.cli import main
    from streetlamp.models.tiny import save_tiny

    bert = save_tiny("bert", tmp_path / "bert", seed=1)
    base = ["explain", "the movie was not good", "--model", str(bert), "--methods", "occlusion"]
    assert main([*base, "--method-params", "occlusion.replacement=unk", "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--method-params", '{"occlusion": {"replacement": "unk"}}', "--out", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / x / "manifest.json").read_text()) for x in "ab")
    assert a["parameters"]["methods"] == b["parameters"]["methods"]
    assert a["parameters"]["methods"]["occlusion"]["replacement"] == "unk" and "[UNK]" in capsys.readouterr().out
    assert main([*base, "--method-params", "shap.n_samples=8", "--out", str(tmp_path / "c")]) == 2
    assert "not among the methods of this run" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_probe_layers_and_sweep() -> None:
    from streetlamp.specs import parse_layers, parse_sweep

    assert parse_layers("all", 3) == ["embed", "0", "1", "2"]
    assert parse_layers("embed,2-3,1,2", 4) == ["embed", "2", "3", "1"]  # each once, in the order given
    for bad, msg in [("x", "use all, embed, layer numbers or ranges"), ("5", "layer 5 out of range"), ("", "--layers")]:
        with pytest.raises(StreetlampError, match=msg):
            parse_layers(bad, 4)
    assert parse_sweep("none") is None and parse_sweep(None) is None
    assert parse_sweep("hidden:4,16") == ("hidden", [4.0, 16.0]) and parse_sweep("dropout:0.1") == ("dropout", [0.1])
    for bad, msg in [("depth:2", "--sweep is KIND"), ("hidden:a", "must be numbers"), ("rank:0.5", "whole numbers")]:
        with pytest.raises(StreetlampError, match=msg):
            parse_sweep(bad)
