"""Every command's run folder keeps its shape: the top-level keys of manifest.json, pinned per
command (the keys of the run folders before the single run writer, plus ``format_version``; the
evaluate run store also gained ``streetlamp``), and the one header written the same way."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from streetlamp.cli import main
from streetlamp.models.tiny import WORDS, save_tiny
from tests.helpers.dictionaries import tiny_dictionary, tiny_transcoders

HEADER = {"streetlamp", "format_version", "created", "command", "versions"}
KEYS = {
    "explain": HEADER
    | {
        "arrays",
        "colour_scales",
        "explained_position",
        "figures",
        "masks",
        "methods",
        "model",
        "parameters",
        "prediction",
        "seed",
        "special_positions",
        "target",
        "text",
        "token_labels",
        "tokens",
        "truncated",
    },
    "explain-generation": HEADER
    | {
        "arrays",
        "continuation",
        "figures",
        "generated",
        "generated_ids",
        "gradient_evaluations",
        "model",
        "parameters",
        "per_token",
        "prompt",
        "prompt_tokens",
        "seconds",
        "stopped_at",
        "seed",
        "token_labels",
        "tokens",
    },
    "heads": HEADER | {"arrays", "claim", "figures", "model", "notes", "parameters", "ranked", "seed"},
    "prune": HEADER | {"arrays", "figures", "majority_baseline", "model", "notes", "parameters", "seed"},
    "patch": HEADER | {"arrays", "figures", "logit_diff", "model", "parameters", "seed", "summary"},
    "mediate": HEADER | {"arrays", "figures", "model", "parameters", "seed"},
    "evaluate": HEADER | {"model_info", "removal_rule", "replacement_token", "settings", "skipped_too_long"},
    "benchmark": HEADER | {"files", "method_params", "methods", "n_examples", "quantity", "seed", "tasks"},
    "lens": HEADER | {"arrays", "figures", "lens_view", "model", "parameters", "seed", "summary", "tables"},
    "lens-fit": HEADER | {"arrays", "files", "model", "parameters", "seed", "summary", "tables"},
    "features-fit": HEADER
    | {"columns", "corpus", "files", "model", "parameters", "seed", "settings", "summary", "tables", "training"},
    "circuit": HEADER
    | {"arrays", "circuit_view", "figures", "files", "methods", "model", "parameters", "seed", "summary", "tables"}
    | {"task"},
    "atlas": HEADER | {"ablation", "arrays", "atlas", "files", "model_info", "n_cut_to_max_tokens", "settings"},
    "experts": HEADER
    | {"arrays", "effect", "forwards", "model", "n_texts", "n_tokens", "parameters", "removal", "streetlight"}
    | {"files", "tables", "top_k", "removed_throughout"},
    "features-audit": HEADER
    | {"arrays", "attribution", "edits", "error", "feature_set", "metric", "model", "parameters", "seed", "selection"}
    | {"files", "summary", "tables", "task"},
    "cite": HEADER
    | {"answer", "arrays", "contextcite", "methods", "model", "n_tokens", "parameters", "question", "seed", "sources"}
    | {"files", "template", "tokens"},
    "graph": HEADER
    | {"arrays", "features", "files", "graph", "graph_view", "model", "parameters", "prompt", "replacement_model"}
    | {"scores", "tokens"},
    "features": HEADER
    | {"arrays", "corpus", "dashboard", "feature_set", "files", "logits", "model", "parameters", "seed", "selection"}
    | {"statistics", "tables", "text"},
}


# commands that write a folder whose top-level keys are not pinned yet: their own tests read the keys they use
NOT_PINNED = {
    "replicate": "tests/evaluation/test_replicate.py",
    "probe": "tests/probing/test_probing.py",
    "cot": "tests/cot/test_cot_run.py",
    "cite-bench": "tests/commands/test_cite.py",
}


def test_every_command_that_writes_is_pinned() -> None:
    """The registry decides which commands write a folder; a new one must be pinned here or listed as not."""
    from streetlamp.commands import COMMANDS

    assert {c.name for c in COMMANDS if c.writes is not None} == set(KEYS) | set(NOT_PINNED)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("manifests")
    data = t / "d.csv"
    data.write_text(
        "text,label\n"
        + "\n".join(f"{WORDS[i]} {WORDS[i + 1]} {WORDS[i + 2]},{['neg', 'neu', 'pos'][i % 3]}" for i in range(8))
        + "\n"
    )
    pairs = t / "pairs.csv"
    pairs.write_text("clean,corrupt,answer,wrong\nthe movie was good,the film was bad, good, bad\n")
    sources = t / "sources.txt"
    sources.write_text("the movie was good. mary went to the store. john hated the plot.")
    return {
        "bert": save_tiny("bert", t / "bert", seed=1),
        "gpt2": save_tiny("gpt2", t / "gpt2", seed=1),
        "llama": save_tiny("llama", t / "llama", seed=1),
        "mixtral": save_tiny("mixtral", t / "mixtral", seed=1),
        "features": tiny_transcoders(t / "features"),
        "data": data,
        "pairs": pairs,
        "dictionary": tiny_dictionary(t / "dict"),
        "sources": sources,
    }


def argv(command: str, s: dict[str, Path]) -> list[str]:
    return {
        "explain": ["explain", "the movie was not good", "--model", str(s["bert"]), "--methods", "attention,occlusion"],
        "explain-generation": [
            "explain-generation",
            "the movie was",
            "--model",
            str(s["llama"]),
            "--new-tokens",
            "2",
            "--ig-params",
            '{"max_steps": 64}',
        ],
        "heads": ["heads", "--data", str(s["data"]), "--no-attribution", "--model", str(s["bert"])],
        "prune": [
            "prune",
            "--data",
            str(s["data"]),
            "--order",
            "attention,random",
            "--seeds",
            "1",
            "--step",
            "6",
            "--model",
            str(s["bert"]),
        ],
        "patch": [
            "patch",
            "--model",
            str(s["gpt2"]),
            "--clean",
            "when mary and john went",
            "--corrupt",
            "when john and mary went",
            "--sites",
            "heads",
        ],
        "evaluate": [
            "evaluate",
            "--model",
            str(s["bert"]),
            "--data",
            str(s["data"]),
            "--methods",
            "attention",
            "--adv-steps",
            "2",
            "--permutations",
            "2",
            "--limit",
            "2",
        ],
        "benchmark": ["benchmark", "--tasks", "keyword", "--methods", "attention", "--n-examples", "2"],
        "lens": [
            "lens",
            "when mary and john went",
            "--model",
            str(s["llama"]),
            "--head",
            "1.0",
            "--types-length",
            "4",
            "--types-seqs",
            "1",
        ],
        "lens-fit": ["lens-fit", "--model", str(s["llama"]), "--lens", "tuned", "--data", str(s["data"])]
        + ["--seq-len", "4", "--heldout", "1", "--steps", "2"],
        "features-fit": ["features-fit", "--model", str(s["llama"]), "--kind", "transcoder", "--data", str(s["data"])]
        + ["--width", "8", "--tokens", "20", "--seq-len", "4", "--heldout", "1", "--batch-seqs", "2"],
        "circuit": ["circuit", "--model", str(s["llama"]), "--task", str(s["pairs"]), "--methods", "eap"]
        + ["--sizes", "0.1,1", "--bootstrap", "5"],
        "atlas": ["atlas", "--model", str(s["llama"]), "--data", str(s["data"]), "--limit", "3", "--top-k", "1"],
        "experts": ["experts", "--model", str(s["mixtral"]), "--data", str(s["data"]), "--limit", "2"]
        + ["--max-tokens", "4", "--bootstrap", "10"],
        "features-audit": ["features-audit", "--model", str(s["llama"]), "--features", str(s["dictionary"])]
        + ["--task", str(s["pairs"]), "--top", "4", "--edits", "patch,zero,mean,steer", "--error", "both"],
        "cite": ["cite", "--model", str(s["llama"]), "--context", str(s["sources"]), "--question", "what is good"]
        + [
            "--answer",
            "the movie",
            "--ablations",
            "4",
            "--held-out",
            "2",
            "--attntrace-samples",
            "2",
            "--ig-steps",
            "2",
        ],
        "graph": ["graph", "when mary and john went", "--model", str(s["llama"]), "--features", str(s["features"])]
        + ["--top", "2"],
        "features": [
            "features",
            "when mary and john went",
            "--model",
            str(s["llama"]),
            "--features",
            str(s["features"]),
        ]
        + ["--data", str(s["data"]), "--sequences", "4", "--top", "2"],
    }[command]


def check_header(m: dict, command: str) -> None:
    assert m["streetlamp"] == command and m["format_version"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m["created"])
    assert isinstance(m["command"], list) and {"torch", "numpy"} <= set(m["versions"])


@pytest.mark.parametrize("command", [c for c in KEYS if c != "mediate"])
def test_manifest_keys(command: str, setup: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert main(argv(command, setup) + ["--out", str(out)]) == 0, capsys.readouterr().err
    m = json.loads((out / "manifest.json").read_text())
    assert set(m) == KEYS[command]
    check_header(m, command)
    for _name, d in m.get("arrays", {}).items():
        assert set(d) >= {"axes", "meaning", "file", "key", "shape", "dtype"} and len(d["axes"]) == len(d["shape"])
    for f in m.get("figures", []):
        assert (out / f["file"]).is_file() and f["shows"]
    # the report's generic view renders manifest["tables"]: a list of {title, columns, rows} (file descriptions
    # go under "files"); each named file exists in the folder
    tables = m.get("tables", [])
    assert isinstance(tables, list), f"{command}: manifest['tables'] must be a list of tables, not {type(tables)}"
    for t in tables:
        assert {"title", "columns", "rows"} <= set(t) and all(len(r) == len(t["columns"]) for r in t["rows"]), t
    for name in m.get("files", {}) if isinstance(m.get("files"), dict) else []:
        assert (out / name).exists(), f"{command}: manifest['files'] names {name}, not in the folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging folder left


def test_mediate_manifest_keys(setup: dict[str, Path], tmp_path: Path) -> None:
    from streetlamp.commands.patch import MediateSettings
    from streetlamp.commands.patch.run import run_mediate
    from streetlamp.interventions.mediation import Prompt
    from streetlamp.models.loading import load

    prompts = [Prompt("the nurse said that", "the doctor said that", " she", " he")]
    run_mediate(load(setup["gpt2"]), MediateSettings(), tmp_path / "m", prompts=prompts, progress=False)
    m = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert set(m) == KEYS["mediate"]
    check_header(m, "mediate")
    assert m["arrays"]["te"]["axes"] == [] and m["arrays"]["head_nie"]["axes"] == ["layer", "head"]
    from streetlamp.store.files import load_arrays

    assert load_arrays(tmp_path / "m" / "arrays.safetensors")["te"].shape == ()  # as the manifest says
