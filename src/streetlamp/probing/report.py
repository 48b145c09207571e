"""The probe run folder: manifest (with the per-layer table in ``manifest["tables"]``), raw arrays,
``probe.png`` (selectivity and amnesic effect per layer; the capacity sweep), ``summary.md``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..store.run_folder import RunFolder
from .probes import ProbeSpec


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 4)
    return v


def tables(rows: list[dict], amnesic: list[dict], sweep: list[dict], mdl: dict[str, tuple]) -> list[dict]:
    """The per-layer tables: present (probes, control, selectivity, MDL) beside used (amnesic)."""
    out = []
    cols = ["site", "probe", "task_accuracy", "control_accuracy", "selectivity", "train_accuracy"]
    out.append(
        {
            "title": "present: probe accuracy on held-out texts, control task, selectivity",
            "columns": cols,
            "rows": [[_fmt(r[c]) for c in cols] for r in rows],
        }
    )
    if mdl:
        out.append(
            {
                "title": "present: MDL online code (linear probe; bits; compression = uniform / online)",
                "columns": ["site", "codelength_task", "codelength_control", "compression_task", "compression_control"],
                "rows": [
                    [s, _fmt(t.codelength), _fmt(c.codelength), _fmt(t.compression), _fmt(c.compression)]
                    for s, (t, c) in mdl.items()
                ],
            }
        )
    if amnesic:
        cols = [
            "site",
            "rank",
            "kl",
            "random_kl",
            "used_kl",
            "agree",
            "random_agree",
            "accuracy",
            "random_accuracy",
            "original_accuracy",
            "recover_accuracy",
        ]
        out.append(
            {
                "title": "used: amnesic probing (LEACE vs random directions of the same rank; KL in nats of the "
                "output distribution on held-out texts)",
                "columns": cols,
                "rows": [[_fmt(r[c]) for c in cols] for r in amnesic],
            }
        )
    if sweep:
        cols = [
            "site",
            "kind",
            "value",
            "probe",
            "task_accuracy",
            "control_accuracy",
            "selectivity",
            "train_accuracy",
            "control_train_accuracy",
        ]
        out.append({"title": "capacity sweep", "columns": cols, "rows": [[_fmt(r[c]) for c in cols] for r in sweep]})
    return out


def plot(
    path: Path,
    rows: list[dict],
    amnesic: list[dict],
    sweep: list[dict],
    sites: list[str],
    probes: list[str],
    title: str,
    majority: float,
    ceiling: float | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = 2 + bool(sweep)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.0))
    x = np.arange(len(sites))
    labels = ["emb" if s == "embed" else s.split(".")[1] for s in sites]
    ax = axes[0]
    for j, p in enumerate(probes):
        get = lambda key: [
            next(
                r[key]
                for r in rows  # noqa: E731
                if r["site"] == s and r["probe"] == p
            )
            for s in sites
        ]
        c = f"C{j}"
        ax.plot(x, get("task_accuracy"), "-o", color=c, ms=3, label=f"{p}: task")
        ax.plot(x, get("control_accuracy"), "--", color=c, label=f"{p}: control")
        ax.plot(x, get("selectivity"), ":s", color=c, ms=3, label=f"{p}: selectivity")
    ax.axhline(majority, color="grey", lw=0.8, label="majority (task)")
    ax.set_xticks(x, labels)
    ax.set_xlabel("layer (resid_post)")
    ax.set_ylabel("held-out accuracy / selectivity")
    ax.set_title("present: probes and control tasks", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[1]
    if amnesic:
        kl = [next(r for r in amnesic if r["site"] == s) for s in sites]
        ax.plot(x, [r["kl"] for r in kl], "-o", ms=3, label="LEACE erasure")
        ax.errorbar(
            x,
            [r["random_kl"] for r in kl],
            yerr=[r["random_kl_sd"] for r in kl],
            fmt="--",
            capsize=2,
            label="random directions, same rank (mean, sd)",
        )
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_ylabel("KL(original || edited), nats")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "amnesic probing not run", ha="center", transform=ax.transAxes)
    ax.set_xticks(x, labels)
    ax.set_xlabel("layer")
    ax.set_title("used: output change when the property is erased", fontsize=10)
    if sweep:
        ax = axes[2]
        v = [r["value"] for r in sweep]
        ax.plot(v, [r["task_accuracy"] for r in sweep], "-o", ms=3, label="task")
        ax.plot(v, [r["control_accuracy"] for r in sweep], "--o", ms=3, label="control")
        ax.plot(v, [r["selectivity"] for r in sweep], ":s", ms=3, label="selectivity")
        if ceiling is not None:
            ax.axhline(ceiling, color="grey", lw=0.8, label="control: perfect type memoriser")
        ax.set_xscale("log")
        ax.set_xticks(v, [f"{x:g}" for x in v])
        ax.minorticks_off()
        ax.set_xlabel(f"{sweep[0]['kind']} ({sweep[0]['site']})")
        ax.set_title("capacity sweep", fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_lines(info: dict, rows: list[dict], amnesic: list[dict], sweep: list[dict], mdl: dict) -> list[str]:
    t = info["task"]
    lines = [
        f"model {info['model']['name']}, task {t['name']} ({t['level']}-level, {len(t['classes'])} classes, "
        f"{t['n_items']} items in {t['n_texts']} texts; train/dev/test items {t['items_per_split']}); "
        f"majority baseline {info['baselines']['majority_test_accuracy']:.3f}"
    ]
    am = {r["site"]: r for r in amnesic}
    lines.append(
        f"{'site':<22}{'probe':<14}{'task':>7}{'control':>9}{'select.':>9}"
        + (f"{'MDL comp.':>11}" if mdl else "")
        + (f"{'KL leace':>10}{'KL rand':>9}{'recover':>9}" if am else "")
    )
    for r in rows:
        line = (
            f"{r['site']:<22}{r['probe']:<14}{r['task_accuracy']:>7.3f}{r['control_accuracy']:>9.3f}"
            f"{r['selectivity']:>9.3f}"
        )
        if mdl:
            line += f"{mdl[r['site']][0].compression:>11.2f}"
        if r["site"] in am:
            a = am[r["site"]]
            line += f"{a['kl']:>10.4f}{a['random_kl']:>9.4f}{a['recover_accuracy']:>9.3f}"
        lines.append(line)
    if amnesic and not math.isnan(amnesic[0]["original_accuracy"]):
        lines.append(
            "amnesic accuracy (gold labels) original {:.3f}; per site LEACE / random: ".format(
                amnesic[0]["original_accuracy"]
            )
            + ", ".join(f"{r['site']} {r['accuracy']:.3f}/{r['random_accuracy']:.3f}" for r in amnesic)
        )
    for r in sweep:
        lines.append(
            f"sweep {r['kind']}={r['value']:g} ({r['site']}): task {r['task_accuracy']:.3f} control "
            f"{r['control_accuracy']:.3f} selectivity {r['selectivity']:.3f} (train: task "
            f"{r['train_accuracy']:.3f} control {r['control_train_accuracy']:.3f})"
        )
    if sweep:
        lines.append(
            "test items whose word type occurs in training (the most a type-memorising control probe can "
            f"use): {info['baselines']['test_items_with_a_training_word_type']:.3f}; control accuracy of a perfect "
            f"type memoriser (majority label on unseen types): {info['baselines']['control_memoriser_test_accuracy']:.3f}"
        )
    return lines


def write_run(rf: RunFolder, res: Any, info: dict, mdl: dict, sites: list[str], specs: list[ProbeSpec]) -> None:
    probes = [p.name for p in specs]
    res.summary = summary_lines(info, res.rows, res.amnesic, res.sweep, mdl)
    get = lambda key: np.array(
        [
            [
                next(r[key] for r in res.rows if r["site"] == s and r["probe"] == p)  # noqa: E731
                for s in sites
            ]
            for p in probes
        ],
        dtype=np.float64,
    )
    with rf.staging() as w:
        for key, meaning in (
            ("task_accuracy", "held-out accuracy of the probe on the task"),
            ("control_accuracy", "held-out accuracy of the same probe on the control task"),
            ("selectivity", "task_accuracy - control_accuracy"),
            ("train_accuracy", "training accuracy on the task"),
        ):
            w.add_array(key, get(key), axes=["probe", "site"], meaning=meaning)
        if mdl:
            w.add_array(
                "mdl_codelength",
                np.array([[mdl[s][0].codelength, mdl[s][1].codelength] for s in sites]),
                axes=["site", "labels"],
                meaning="online code length in bits; labels = [task, control]",
            )
            w.add_array(
                "mdl_compression",
                np.array([[mdl[s][0].compression, mdl[s][1].compression] for s in sites]),
                axes=["site", "labels"],
                meaning="uniform code length / online code length; [task, control]",
            )
        if res.amnesic:
            for key, meaning in (
                ("kl", "mean KL(original || LEACE-erased) of the output distribution, nats"),
                ("agree", "share of held-out texts whose top-1 output is unchanged by LEACE"),
                ("accuracy", "accuracy against gold labels after LEACE (nan: no gold labels)"),
                ("recover_accuracy", "a fresh linear probe's held-out accuracy after LEACE"),
                ("rank", "rank of the LEACE edit = number of random directions removed"),
            ):
                w.add_array(
                    f"amnesic_{key}",
                    np.array([r[key] for r in res.amnesic], dtype=np.float64),
                    axes=["site"],
                    meaning=meaning,
                )
            w.add_array(
                "random_kl",
                np.array([r["random_kl_each"] for r in res.amnesic]),
                axes=["site", "seed"],
                meaning="mean KL(original || edited) after removing random directions of the same rank",
            )
        if res.sweep:
            w.add_array(
                "sweep",
                np.array(
                    [
                        [
                            r["value"],
                            r["task_accuracy"],
                            r["control_accuracy"],
                            r["selectivity"],
                            r["train_accuracy"],
                            r["control_train_accuracy"],
                        ]
                        for r in res.sweep
                    ]
                ),
                axes=["setting", "column"],
                meaning="capacity sweep: columns = [value, task_accuracy, control_accuracy, selectivity, "
                "train_accuracy, control_train_accuracy]",
            )
        plot(
            w.path / "probe.png",
            res.rows,
            res.amnesic,
            res.sweep,
            sites,
            probes,
            f"{info['model']['name']}: {info['task']['name']}",
            info["baselines"]["majority_test_accuracy"],
            info["baselines"].get("control_memoriser_test_accuracy"),
        )
        w.add_figure(
            file="probe.png",
            shows="left: task/control accuracy and selectivity per layer and probe; "
            "middle: KL of the output after LEACE vs random erasure per layer; right: capacity sweep",
        )
        (w.path / "summary.md").write_text("# probe\n\n```\n" + "\n".join(res.summary) + "\n```\n")
        amnesic_rows = [{k: v for k, v in r.items() if k != "random_kl_each"} for r in res.amnesic]
        w.write_manifest(
            {
                **info,
                "results": res.rows,
                "amnesic": amnesic_rows,
                "sweep": res.sweep,
                "mdl": {s: {"task": vars(t), "control": vars(c)} for s, (t, c) in mdl.items()},
                "tables": tables(res.rows, res.amnesic, res.sweep, mdl),
                "files": {"summary.md": "the table printed by the command", "probe.png": "the figure"},
            }
        )
