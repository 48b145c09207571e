"""``--features DICT`` on explain, patch, heads, lens (CLI) and the Python API: the feature set is read, checked and
attached before any folder exists, every manifest records it as ``model.features``, ``patch --sites features,
features_error`` patches the feature sites as the engine computes them, and a bad dictionary is one line, exit 2,
no folder (issue 38)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

import streetlamp
from streetlamp.cli import main
from streetlamp.commands import COMMANDS
from streetlamp.interventions import engine
from streetlamp.interventions import patching as P
from streetlamp.models.dictionaries import load_features, save_features
from streetlamp.models.features import FeatureSet, feature_site
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny
from streetlamp.store.files import load_arrays
from tests.models.test_features import random_dictionary

CLEAN = "when mary and john went to the store john gave a drink to"
CORRUPT = "when mary and john went to the store mary gave a drink to"
TAKES = {"explain", "patch", "heads", "atlas", "lens", "serve"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("feat")
    ckpt = save_tiny("llama", root / "llama", seed=1)
    a = load(str(ckpt))
    d = a.d_model
    dicts = {(0, "resid_pre"): random_dictionary(0, "resid_pre", d, 2 * d, seed=1)}
    dicts[(1, "mlp")] = random_dictionary(1, "mlp", d, 2 * d, "topk", seed=2)
    save_features(FeatureSet({k: v.to(torch.float32) for k, v in dicts.items()}, source="random"), root / "dict")
    return ckpt, root / "dict"


def test_the_option_is_shared_where_asked() -> None:
    taking = {c.name for c in COMMANDS if "features" in c.shared.options()}
    assert taking == TAKES


def recorded(out: Path, dict_dir: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    f = m["model"]["features"]
    assert f["source"] == str(dict_dir) and f["format"] == "streetlamp"
    assert [(x["layer"], x["site"]) for x in f["dictionaries"]] == [(0, "resid_pre"), (1, "mlp")]
    return m


def test_cli_commands_record_the_set(setup: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, dict_dir = setup
    base = ["--model", str(ckpt), "--features", str(dict_dir)]
    runs = {
        "explain": ["explain", "the movie was not good", "--layer", "1", "--head", "0"],
        "heads": ["heads", "the movie was not good"],
        "lens": ["lens", "the movie was not good"],
    }
    for name, argv in runs.items():
        out = tmp_path / name
        assert main([*argv, *base, "--out", str(out)]) == 0, name
        recorded(out, dict_dir)


def test_patch_feature_sites_as_the_engine_says(setup: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, dict_dir = setup
    out = tmp_path / "p"
    argv = ["patch", "--model", str(ckpt), "--features", str(dict_dir), "--clean", CLEAN, "--corrupt", CORRUPT]
    assert main([*argv, "--sites", "features,features_error,heads", "--out", str(out)]) == 0
    m = recorded(out, dict_dir)
    table = pd.read_csv(out / "features.csv")
    assert list(table.columns) == list(P.FEATURE_COLUMNS) and len(table) > 0
    assert m["features_patched"]["table"]["rows"] == len(table)
    err = load_arrays(out / "arrays.safetensors")["patch.features_error"]
    assert err.shape[0] == 2 and "heads" in m["parameters"]["kinds"]
    # the engine, independently: patch the clean activation of each listed feature into the corrupted run
    a = load(str(ckpt))
    a.attach_features(load_features(dict_dir, a))
    answer, wrong = m["parameters"]["answer"]["index"], m["parameters"]["wrong"]["index"]
    pair = P.make_pair(a, CLEAN, CORRUPT, answer, wrong)
    for row in table.head(4).itertuples():
        site = feature_site(row.layer, row.site)
        clean = a.forward(pair.clean, record=[site]).cache[site]
        logits = engine.run(a, pair.corrupt, [engine.Intervention(site, engine.patch(clean), head=row.feature)]).logits
        want = float(pair.normalise(P.logit_diff(logits, answer, wrong))[0])
        assert abs(want - row.restored) <= 1e-5 * max(1.0, abs(want)), (row, want)
    assert table["restored"].abs().max() > 1e-4  # some feature matters
    # the error term of layer 1's transcoder, at the last position, also through the engine
    site = feature_site(1, "mlp", True)
    clean = a.forward(pair.clean, record=[site]).cache[site]
    pos = pair.clean.lengths[0] - 1
    logits = engine.run(a, pair.corrupt, [engine.Intervention(site, engine.patch(clean), pos=pos)]).logits
    want = float(pair.normalise(P.logit_diff(logits, answer, wrong))[0])
    assert abs(want - float(err[1, pos])) <= 1e-5 * max(1.0, abs(want))


def test_api_records_the_set(setup: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, dict_dir = setup
    res = streetlamp.patch(
        clean=CLEAN, corrupt=CORRUPT, model=str(ckpt), features=str(dict_dir), sites="features", out=tmp_path / "api"
    )
    recorded(Path(res.out), dict_dir)
    assert (Path(res.out) / "features.csv").exists()


def test_bad_dictionary_is_one_line_exit_2_no_folder(
    setup: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    ckpt, dict_dir = setup
    wide = tmp_path / "wide"
    save_features(FeatureSet({(0, "resid_pre"): random_dictionary(0, "resid_pre", 7, 9)}), wide)
    (tmp_path / "w.pt").write_bytes(b"\x80\x02")
    cases = [
        (["--features", str(wide)], "another model"),
        (["--features", str(tmp_path / "w.pt")], "pickle"),
        (["--features", str(tmp_path / "none")], "not a folder"),
        (["--sites", "features"], "give --features DICT"),
    ]
    for extra, msg in cases:
        out = tmp_path / "o"
        rc = main(["patch", "--model", str(ckpt), "--clean", CLEAN, "--corrupt", CORRUPT, *extra, "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and msg in err and len(err.splitlines()) == 1, (extra, err)
        assert not out.exists()
    (tmp_path / "d.txt").write_text("the movie was good\nthe acting was bad\n")
    with pytest.raises(streetlamp.StreetlampError, match="engine ray"):
        streetlamp.atlas(
            model=str(ckpt), features=str(dict_dir), out=tmp_path / "atlas", engine="ray", data=str(tmp_path / "d.txt")
        )
    assert not (tmp_path / "atlas").exists()
