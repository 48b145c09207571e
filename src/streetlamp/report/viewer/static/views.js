/* streetlamp report viewer: explain-generation, evaluate, heads, prune, patch, mediate, benchmark, cite. */
(function () {
  "use strict";
  const S = window.streetlamp, L = S.lib, el = L.el, fmt = L.fmt, q = L.q, MAN = L.MAN, MODEL = L.MODEL, state = L.state;
  const V = S.views;
  const desc = (name) => ((MAN.arrays || {})[name] || {});
  const safeId = (s) => String(s).replace(/[^A-Za-z0-9_-]/g, "_");
  const range = (n) => Array.from({ length: n }, (_, i) => i);

  async function headGrid(root, name, title, opts) {
    if (!L.has(name)) return null;
    const a = await L.arr(name), [nl, nh] = a.shape;
    const g = L.valueGrid("grid-" + safeId(name), a.data, nl, nh, Object.assign({ title: title || name, rowName: "layer", colName: "head", note: desc(name).meaning, cell: 26 }, opts || {}));
    root.appendChild(g); return a;
  }
  function csvTable(name) { return (MODEL.csv_tables || []).find((t) => t.file === name); }
  function tablePanel(title, t, id, note) {
    return el("div", { cls: "panel" }, el("h2", { text: title }), note ? el("div", { cls: "note", text: note }) : null,
      L.table(t.columns.map((c, j) => ({ title: c, text: t.rows.some((r) => typeof r[j] === "string") })), t.rows, { id }));
  }
  function extras(root) {
    for (const t of L.genericTables()) root.appendChild(t);
    for (const t of MODEL.csv_tables || []) root.appendChild(tablePanel(t.file, t, "csv-" + safeId(t.file), t.shows));
    const f = L.figures(); if (f) root.appendChild(f);
    const summary = {}; for (const [k, v] of Object.entries(MAN)) if (!["arrays", "tables", "figures", "versions"].includes(k)) summary[k] = v;
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Manifest" }), L.kv(summary, 1)));
  }

  // ---------- explain-generation ----------
  V["explain-generation"] = async function (root) {
    const labels = MAN.token_labels || MAN.tokens, gen = MAN.generated || [], per = MAN.per_token || [];
    const IG = "integrated_gradients", quantity = (MAN.parameters || {}).quantity || "score";
    // one [generated x input] matrix per method, named "<method>.matrix"
    const names = Object.keys(MAN.arrays || {}).filter((a) => a.endsWith(".matrix")).map((a) => a.slice(0, -".matrix".length));
    if (!names.length) names.push(IG);
    const mats = {}; for (const nm of names) mats[nm] = await L.arr(nm + ".matrix");
    const al = (await L.arr("allowed")).data, [k, n] = mats[names[0]].shape;
    let method = names.includes(state.method) ? state.method : names[0];
    const explainedText = (nm) => nm === IG ? `IG of each generated token's ${quantity} over its inputs (one shared path)`
      : `${nm} of each generated token (target: that token's ${quantity} where the method uses a target), applied to its own prefix` +
        ((((MAN.methods || {})[nm] || {}).scores) ? `; scores: ${MAN.methods[nm].scores}` : "");
    const explained = el("div", { cls: "v", id: "gen-explained", text: explainedText(method) });
    root.appendChild(L.header("streetlamp explain-generation", L.modelLine()));
    root.appendChild(el("div", { cls: "panel" }, el("div", { cls: "kv" },
      el("div", { cls: "k", text: "prompt" }), el("div", { cls: "v", id: "prompt", text: MAN.prompt || "" }),
      el("div", { cls: "k", text: "continuation" }), el("div", { cls: "v", text: `${gen.map(q).join(" ")} (${MAN.continuation || ""})` }),
      el("div", { cls: "k", text: "explained" }), explained)));
    const rescale = el("input", { type: "checkbox", id: "rescale" }); rescale.checked = state.rescale === "1";
    const sel = names.length > 1 ? el("select", { id: "gen-method", "aria-label": "method" }, names.map((nm) => el("option", { value: nm, text: nm }))) : null;
    if (sel) { sel.value = method; sel.addEventListener("change", () => { method = sel.value; state.method = method; L.writeHash(); explained.textContent = explainedText(method); draw(); }); }
    const box = el("div", {}), out = el("div", { cls: "readout", id: "gen-row" }, "hover a generated token");
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Generated token × input token attribution" }),
      sel ? el("label", {}, "method ", sel, " ") : null,
      el("label", {}, rescale, " scale each row to its own max |score| (colours only)"), box, out));
    const igFlags = per.map((p) => p && p.converged === false);
    function draw() {
      box.textContent = "";
      const m = mats[method], short = method === IG ? "IG" : method, flagged = method === IG ? igFlags : igFlags.map(() => false);
      const rowMax = range(k).map((i) => { let x = 0; for (let j = 0; j < n; j++) if (al[i * n + j]) x = Math.max(x, Math.abs(m.data[i * n + j])); return x || 1; });
      let gm = 0; for (let i = 0; i < k * n; i++) if (al[i]) gm = Math.max(gm, Math.abs(m.data[i]));
      const vals = new Float32Array(k * n);
      for (let i = 0; i < k; i++) for (let j = 0; j < n; j++) vals[i * n + j] = al[i * n + j] ? (rescale.checked ? m.data[i * n + j] / rowMax[i] * gm : m.data[i * n + j]) : NaN;
      const rowLabels = gen.map((g, i) => `${i} ${q(g)}${flagged[i] ? " (IG tolerance not reached)" : ""}`);
      const g = L.valueGrid("gen-matrix", vals, k, n, { title: `${short} (rows: generated token, columns: input token; grey hatched: not an input of that row)`, rowName: "generated", colName: "input",
        rowLabels, colLabels: labels.map((t, j) => `${j} ${q(t)}`), signed: true, cell: Math.max(6, Math.min(22, Math.floor(900 / n))),
        note: rescale.checked ? "colours: each row scaled to its own max |score| (numbers on hover are scaled too)" : "colours: one symmetric scale for the whole matrix" });
      box.appendChild(g);
      const canvas = document.getElementById("gen-matrix"); if (canvas) canvas.dataset.method = method;
      const list = el("div", { cls: "controls", id: "gen-tokens" }, "generated: ", gen.map((t, i) => {
        const s = el("span", { cls: "tok" + (flagged[i] ? " special" : ""), "data-i": i, title: flagged[i] ? "IG did not reach its tolerance for this token" : "" }, t, flagged[i] ? " ⚠" : "");
        s.addEventListener("mouseenter", () => {
          const row = range(n).filter((j) => al[i * n + j]).map((j) => [j, m.data[i * n + j]]).sort((x, y) => Math.abs(y[1]) - Math.abs(x[1]));
          out.textContent = `${q(t)} <- ` + row.slice(0, 8).map(([j, v]) => `${q(labels[j])}@${j} ${fmt(v)}`).join(", ") +
            (flagged[i] ? `  ⚠ IG tolerance not reached (relative completeness error ${fmt(per[i].relative_completeness_error)})` : "");
          out.dataset.row = i;
        });
        return s;
      }));
      box.appendChild(list);
    }
    rescale.addEventListener("change", () => { state.rescale = rescale.checked ? 1 : 0; L.writeHash(); draw(); });
    draw();
    if (igFlags.some(Boolean)) root.appendChild(el("div", { cls: "warn", id: "ig-flags", text: `IG missed its tolerance for: ${gen.filter((g, i) => igFlags[i]).map(q).join(", ")}` }));
    if (per.some((p) => p && "converged" in p)) root.appendChild(tablePanel("Per generated token (integrated gradients)", { columns: ["generated", "converged", "steps", "relative completeness error"],
      rows: per.map((p) => [p.generated, String(p.converged), p.steps, p.relative_completeness_error]) }, "per-token"));
    extras(root);
  };

  // ---------- heads ----------
  V.heads = async function (root) {
    root.appendChild(L.header("streetlamp heads", L.modelLine()));
    const P = MAN.parameters || {};
    root.appendChild(el("p", { cls: "sub", text: `${P.ablation || ""} ablation over ${P.n_texts || "?"} text(s)${P.text ? ": " + P.text : ""}` }));
    const row = el("div", { cls: "row" }); root.appendChild(row);
    const ab = await headGrid(row, "ablation", "Ablation effect ΔF per head");
    await headGrid(row, "importance", "Importance (Michel et al.)");
    await headGrid(row, "attribution", "Attention attribution (Hao et al.)");
    const mass = await headGrid(row, "attention_mass", "Attention mass on content tokens", { signed: false, hi: 1 });
    await headGrid(row, "attention_max", "Largest attention weight", { signed: false, hi: 1 });
    const [nl, nh] = ab.shape, labs = [];
    for (let l = 0; l < nl; l++) for (let h = 0; h < nh; h++) labs.push(`${l}.${h}`);
    if (mass) root.appendChild(L.scatter("mass-vs-effect", Array.from(mass.data), Array.from(ab.data).map(Math.abs), labs,
      { title: "Attention mass against ablation effect (each point a head, layer.head)", xTitle: "attention mass", yTitle: "|ablation ΔF|", xName: "mass", yName: "|ΔF|",
        note: "where the light is (mass) against what the model uses (ablation effect)" }));
    const cols = ["head", "layer", "head index", "ablation ΔF", "|ΔF|"], keys = ["importance", "attribution", "attention_mass", "attention_max"].filter(L.has);
    const vals = {}; for (const k of keys) vals[k] = (await L.arr(k)).data;
    const rows = labs.map((s, i) => [s, Math.floor(i / nh), i % nh, ab.data[i], Math.abs(ab.data[i]), ...keys.map((k) => vals[k][i])]);
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Every head (click a column to sort)" }),
      L.table([...cols, ...keys].map((c, j) => ({ title: c, text: j === 0 })), rows, { id: "heads-rank", sort: 4, desc: true })));
    if (MAN.claim) root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "The claim, in numbers" }), L.kv(MAN.claim, 1)));
    extras(root);
  };

  // ---------- prune ----------
  V.prune = async function (root) {
    root.appendChild(L.header("streetlamp prune", L.modelLine()));
    const series = [];
    for (const name of Object.keys(MODEL.arrays).filter((k) => k.startsWith("curve."))) {
      const a = await L.arr(name), s = a.shape[1];
      series.push({ name: name.slice(6), x: Array.from(a.data.subarray(0, s)), y: Array.from(a.data.subarray(s, 2 * s)) });
    }
    root.appendChild(L.lines("prune-curves", series, { title: "Held-out accuracy as heads are removed", xTitle: "heads removed", yTitle: "accuracy",
      note: MAN.majority_baseline !== undefined ? `majority-class baseline: ${fmt(MAN.majority_baseline)}` : "" }));
    root.appendChild(tablePanel("Curves", { columns: ["order", ...series[0].x.map((x) => `${x} removed`)], rows: series.map((s) => [s.name, ...s.y]) }, "prune-table"));
    const row = el("div", { cls: "row" }); root.appendChild(row);
    for (const name of Object.keys(MODEL.arrays).filter((k) => k.startsWith("score."))) await headGrid(row, name, `Head scores: ${name.slice(6)}`);
    extras(root);
  };

  // ---------- patch ----------
  V.patch = async function (root) {
    root.appendChild(L.header("streetlamp patch", L.modelLine()));
    const P = MAN.parameters || {}, toks = P.tokens || [];
    root.appendChild(el("div", { cls: "panel" }, el("div", { cls: "kv" },
      el("div", { cls: "k", text: "clean" }), el("div", { cls: "v", text: P.clean || "" }),
      el("div", { cls: "k", text: "corrupted" }), el("div", { cls: "v", text: P.corrupt || "" }),
      el("div", { cls: "k", text: "logit difference" }), el("div", { cls: "v", text: MAN.logit_diff ? `clean ${fmt(MAN.logit_diff.clean)}, corrupted ${fmt(MAN.logit_diff.corrupt)}` : "" }))));
    const row = el("div", { cls: "row" }); root.appendChild(row);
    for (const name of Object.keys(MODEL.arrays)) {
      const a = MODEL.arrays[name], ax = desc(name).axes || [];
      if (a.shape.length !== 2) continue;
      const byPos = ax[1] === "pos";
      const v = await L.arr(name);
      row.appendChild(L.valueGrid("grid-" + safeId(name), v.data, a.shape[0], a.shape[1], { title: name, rowName: ax[0] || "layer", colName: ax[1] || "",
        colLabels: byPos ? toks.map((t, j) => `${j} ${q(t)}`) : null, note: desc(name).meaning, cell: byPos ? 22 : 26 }));
    }
    for (const site of Object.keys(MODEL.arrays).filter((k) => k.startsWith("patch."))) {
      const ap = "approx." + site.slice(6); if (!L.has(ap)) continue;
      const a = await L.arr(site), b = await L.arr(ap), ax = desc(site).axes || ["layer", "x"];
      const labs = range(a.data.length).map((i) => `${Math.floor(i / a.shape[1])}.${i % a.shape[1]}`);
      root.appendChild(L.scatter("approx-" + safeId(site), Array.from(a.data), Array.from(b.data), labs, { title: `Attribution patching against real patching: ${site.slice(6)} (${ax.join(" x ")})`,
        xTitle: "real patching", yTitle: "attribution patching", xName: "patching", yName: "attribution" }));
    }
    if (MAN.summary) root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Summary" }), L.kv(MAN.summary, 1)));
    extras(root);
  };

  // ---------- mediate ----------
  V.mediate = async function (root) {
    root.appendChild(L.header("streetlamp mediate", L.modelLine()));
    if (L.has("te")) { const te = await L.arr("te"); root.appendChild(el("p", { cls: "sub", id: "te", text: `total effect TE = ${fmt(te.data[0])} (${desc("te").meaning || ""})` })); }
    const row = el("div", { cls: "row" }); root.appendChild(row);
    for (const name of ["head_nie", "head_nde", "layer_nie", "layer_nde"]) {
      if (!L.has(name)) continue; const a = await L.arr(name), ax = desc(name).axes || ["layer", "head"];
      row.appendChild(L.valueGrid("grid-" + name, a.data, a.shape[0], a.shape[1], { title: name.replace("_", " ").toUpperCase(), rowName: ax[0], colName: ax[1], note: desc(name).meaning, cell: 26 }));
    }
    const prompts = (MAN.parameters || {}).prompts || [];
    if (prompts.length && L.has("te_per_prompt")) {
      const te = (await L.arr("te_per_prompt")).data;
      root.appendChild(tablePanel("Prompts", { columns: ["null", "set", "stereotypical", "anti", "TE"], rows: prompts.map((p, i) => [p.null, p.set, p.stereo, p.anti, te[i]]) }, "prompts"));
    }
    extras(root);
  };

  // ---------- benchmark ----------
  V.benchmark = async function (root) {
    root.appendChild(L.header("streetlamp benchmark", `ground-truth tasks: ${(MAN.tasks || []).join(", ")}; methods: ${(MAN.methods || []).join(", ")}; ${MAN.n_examples || "?"} examples per task`));
    const lb = csvTable("leaderboard.csv");
    if (lb) {
      root.appendChild(tablePanel("Leaderboard (click a column to sort)", lb, "leaderboard", (MAN.files || {})["leaderboard.csv"]));
      const ci = (c) => lb.columns.indexOf(c);
      root.appendChild(L.bars("auprc-bars", lb.rows.map((r) => `${r[ci("task")]}/${r[ci("variant")]}/${r[ci("method")]}`), lb.rows.map((r) => r[ci("auprc")]),
        { title: "AUPRC of |token scores| against the planted tokens", note: "higher: the method finds the tokens the model was built to use" }));
    }
    const mt = csvTable("models.csv"); if (mt) root.appendChild(tablePanel("Models", mt, "models", (MAN.files || {})["models.csv"]));
    for (const t of L.genericTables()) root.appendChild(t);
    const f = L.figures(); if (f) root.appendChild(f);
  };

  // ---------- evaluate ----------
  V.evaluate = async function (root) {
    const E = MODEL.evaluate, set = MAN.settings || {};
    root.appendChild(L.header("streetlamp evaluate", `${(set.model || {}).name || ""} on ${(set.data || {}).name || ""}: ${E.examples.length} examples, methods ${((set.settings || {}).methods || []).join(", ")}`));
    // metric values by [method][metric] -> [values], and by example
    const by = {}, ex = E.examples.map(() => ({}));
    for (const [e, m, t, v] of E.rows) { const mm = E.methods[m], tt = E.metrics[t]; ((by[mm] = by[mm] || {})[tt] = by[mm][tt] || []).push(v); ex[e][mm + "/" + tt] = v; }
    const mean = (a) => { const f = (a || []).filter((v) => v !== null); return f.length ? f.reduce((s, v) => s + v, 0) / f.length : null; };
    const median = (a) => { const f = (a || []).filter((v) => v !== null).sort((x, y) => x - y); return f.length ? (f.length % 2 ? f[(f.length - 1) / 2] : (f[f.length / 2 - 1] + f[f.length / 2]) / 2) : null; };
    const KEY = ["aopc_comprehensiveness", "aopc_sufficiency", "deletion_area", "insertion_area", "flip_fraction", "flipped"];
    const methods = Object.keys(by).filter((m) => KEY.some((k) => by[m][k]));
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Faithfulness per method (means over examples)" }),
      el("div", { cls: "note", text: "AOPC comprehensiveness: higher = removing the top tokens hurts more (more faithful); sufficiency: lower is better; deletion area: lower; insertion area: higher" }),
      L.table([{ title: "method", text: true }, ...KEY.map((k) => ({ title: k }))], methods.map((m) => [m, ...KEY.map((k) => mean(by[m][k]))]), { id: "summary" })));
    const other = []; for (const m of Object.keys(by).sort()) for (const t of Object.keys(by[m]).sort()) if (!KEY.includes(t) && !/@/.test(t)) other.push([m, t, mean(by[m][t]), median(by[m][t]), by[m][t].filter((v) => v !== null).length]);
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Every other metric" }), L.table([{ title: "method", text: true }, { title: "metric", text: true }, { title: "mean" }, { title: "median" }, { title: "n" }], other, { id: "metrics" })));
    const PCT = [1, 5, 10, 20, 50], row = el("div", { cls: "row" }); root.appendChild(row);
    for (const kind of ["comprehensiveness", "sufficiency"]) row.appendChild(L.lines("aopc-" + kind, methods.filter((m) => by[m][kind + "@1"]).map((m) => ({ name: m, x: PCT, y: PCT.map((k) => mean(by[m][`${kind}@${k}`])) })),
      { title: `${kind} at top k%`, xTitle: kind === "comprehensiveness" ? "top k% of tokens removed" : "top k% of tokens kept", yTitle: "F(x) - F(...), mean" }));
    // deletion / insertion curves: means of the stored per-example curves
    for (const kind of ["deletion_curve", "insertion_curve"]) {
      const series = [];
      for (const m of methods) {
        const curves = []; for (const e of Object.keys(E.stored)) if (L.has(`example/${e}/${m}.${kind}`)) curves.push((await L.arr(`example/${e}/${m}.${kind}`)).data);
        if (!curves.length) continue;
        const k = curves[0].length; series.push({ name: m, x: range(k).map((i) => i / (k - 1)), y: range(k).map((i) => curves.reduce((s, c) => s + c[i], 0) / curves.length) });
      }
      if (series.length) row.appendChild(L.lines(kind, series, { title: `${kind.replace("_", " ")} (mean of ${Object.keys(E.stored).length} stored examples)`, xTitle: "fraction of ranked tokens " + (kind === "deletion_curve" ? "removed" : "kept"), yTitle: "F" }));
    }
    const fl = Object.keys(by).filter((m) => by[m].flipped);
    if (fl.length) row.appendChild(L.bars("flip-bars", fl, fl.map((m) => mean(by[m].flipped)), { title: "Decision flips: share of examples whose decision flips when the top token is removed" }));
    const pairs = Object.keys(by).filter((m) => m.includes("|") && by[m].kendall_tau);
    if (pairs.length) row.appendChild(tauStrip(pairs.map((p) => [p, by[p].kendall_tau.filter((v) => v !== null)])));
    // examples
    const exCols = ["example", "prob", "correct", "n_tokens", ...methods.map((m) => `${m} aopc_comp`)];
    const exRows = E.examples.map((e, i) => [e, ex[i]["model/prob"], ex[i]["model/correct"], ex[i]["model/n_tokens"], ...methods.map((m) => ex[i][`${m}/aopc_comprehensiveness`])]);
    const detail = el("div", { id: "example-detail" });
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Examples (click one to open its stored explanation)" }),
      E.stored_limit ? el("div", { cls: "note", text: `explanations embedded for the first ${E.stored_limit} examples only` }) : null,
      L.table(exCols.map((c, j) => ({ title: c, text: j === 0 })), exRows, { id: "examples", key: (i) => E.examples[i], onclick: (i) => openExample(E.examples[i]) }), detail));
    async function openExample(e) {
      state.ex = e; L.writeHash(); detail.textContent = "";
      document.querySelectorAll("#examples tbody tr").forEach((tr) => tr.classList.toggle("hl", tr.dataset.key === e));
      const keys = E.stored[e];
      if (!keys) { detail.appendChild(el("p", { text: `no stored arrays for ${e}` })); return; }
      detail.appendChild(el("h2", { id: "example-title", text: `Example ${e}` }));
      const ids = keys.includes("input_ids") ? (await L.arr(`example/${e}/input_ids`)).data : null;
      const toks = (E.tokens || {})[e] || null;
      const ms = keys.filter((k) => k.endsWith(".tokens")).map((k) => k.slice(0, -7));
      if (ms.length) {
        const n = (await L.arr(`example/${e}/${ms[0]}.tokens`)).shape[0], vals = new Float32Array(ms.length * n);
        for (let r = 0; r < ms.length; r++) vals.set((await L.arr(`example/${e}/${ms[r]}.tokens`)).data.subarray(0, n), r * n);
        detail.appendChild(L.valueGrid("example-scores", vals, ms.length, n, { title: "token scores per method (stored)", rowName: "method", colName: "token", rowLabels: ms,
          colLabels: range(n).map((j) => (toks ? `${j} ${L.q(toks[j])}` : ids ? `${j} (token id ${ids[j]})` : String(j))), signed: true,
          note: toks ? "tokens as the run stored them" : "this run store predates stored token text: token ids shown" }));
        if (toks) detail.appendChild(el("div", { cls: "tokens", id: "example-tokens" }, toks.map((t, j) => el("span", { cls: "tok", title: `position ${j}` }, t))));
      }
      const curves = [];
      for (const m of ms) for (const kind of ["deletion_curve", "insertion_curve"]) if (keys.includes(`${m}.${kind}`)) { const c = (await L.arr(`example/${e}/${m}.${kind}`)).data; curves.push({ name: `${m} ${kind.split("_")[0]}`, x: range(c.length).map((i) => i / (c.length - 1)), y: Array.from(c) }); }
      if (curves.length) detail.appendChild(L.lines("example-curves", curves, { title: `Deletion and insertion curves of ${e}`, xTitle: "fraction of ranked tokens", yTitle: "F" }));
    }
    if (state.ex && E.stored[state.ex]) await openExample(state.ex);
    const f = L.figures(); if (f) root.appendChild(f);
  };

  function tauStrip(pairs) {
    const W = 520, rh = 26, P = 170, Hh = pairs.length * rh + 30, c = el("canvas", { id: "tau-strip", width: W, height: Hh }), g = c.getContext("2d");
    const sx = (t) => P + (t + 1) / 2 * (W - P - 10);
    g.fillStyle = "#fff"; g.fillRect(0, 0, W, Hh); g.font = "11px sans-serif"; g.strokeStyle = "#bbb";
    g.beginPath(); g.moveTo(sx(0), 0); g.lineTo(sx(0), Hh - 20); g.stroke();
    g.fillStyle = "#222"; g.fillText("-1", sx(-1), Hh - 6); g.fillText("0", sx(0) - 3, Hh - 6); g.fillText("1", sx(1) - 6, Hh - 6);
    pairs.forEach(([name, v], i) => { g.fillStyle = "#222"; g.fillText(name.slice(0, 28), 4, 16 + i * rh); g.fillStyle = "rgba(0,114,178,0.6)";
      v.forEach((t, k) => { g.beginPath(); g.arc(sx(t), 12 + i * rh + ((k * 7) % 9) - 4, 2.5, 0, 7); g.fill(); });
      const mu = v.reduce((s, x) => s + x, 0) / (v.length || 1); g.fillStyle = "#d55e00"; g.fillRect(sx(mu) - 1, 4 + i * rh, 2, rh - 8); });
    return el("div", { cls: "panel" }, el("h2", { text: "Kendall τ between methods, per example" }), c,
      el("div", { cls: "note", text: "one dot per example; orange bar: mean" }), L.exportButtons(() => c, "tau_distributions", () => "Kendall tau between methods, per example"));
  }
  // ---------- cite ----------
  V.cite = async function (root) {
    const A = MAN.answer || {}, methods = MAN.methods || [], src = MAN.sources || {};
    root.appendChild(L.header("streetlamp cite", L.modelLine()));
    const how = A.generated ? "generated by the model" : (A.forced ? "forced: not the model's greedy answer" : "given; also the model's greedy answer");
    root.appendChild(el("div", { cls: "panel" }, el("div", { cls: "kv" },
      el("div", { cls: "k", text: "question" }), el("div", { cls: "v", id: "cite-question", text: MAN.question || "" }),
      el("div", { cls: "k", text: "answer" }), el("div", { cls: "v", id: "cite-answer", text: `${A.text || ""} (${how}); log-probability ${fmt(A.logprob)}` }),
      el("div", { cls: "k", text: "sources" }), el("div", { cls: "v", text: `${src.n || "?"} from ${src.file || "?"}, ${MAN.n_tokens || "?"} tokens in all` }))));
    if (A.forced) root.appendChild(el("div", { cls: "warn", id: "cite-forced", text: `the answer was forced: the model's greedy tokens are ${(A.greedy || []).map(q).join(" ")}` }));
    if (src.cut_note) root.appendChild(el("div", { cls: "warn", id: "cite-cut", text: src.cut_note }));
    const sc = await L.arr("scores"), n = sc.shape[1], texts = (csvTable("sources.csv") || { rows: [] }).rows.map((r) => r[1]);
    const K = 3;
    const table = el("table", { cls: "cite-grid", id: "cite-grid" });
    table.appendChild(el("tr", {}, el("th", { text: "source" }), methods.map((m) => el("th", { text: m })), el("th", { text: "text" })));
    const tops = methods.map((m, i) => {
      const v = Array.from(sc.data.subarray(i * n, (i + 1) * n)), order = range(n).sort((a, b) => (v[b] - v[a]) || (a - b));
      const lo = Math.min(...v), hi = Math.max(...v);
      return { v, rank: order.reduce((r, s, k) => (r[s] = k + 1, r), []), lo, hi };
    });
    for (let s = 0; s < n; s++) {
      const cells = methods.map((m, i) => {
        const t = tops[i], w = t.hi > t.lo ? (t.v[s] - t.lo) / (t.hi - t.lo) : 0, top = t.rank[s] <= Math.min(K, n);
        return el("td", { cls: top ? "cite-top" : "", title: `${m}: score ${fmt(t.v[s])}, rank ${t.rank[s]}`, "data-rank": t.rank[s],
          style: `background: rgba(230, 159, 0, ${(0.1 + 0.8 * w).toFixed(3)}); ${top ? "font-weight: bold;" : ""}` }, `${t.rank[s]}`);
      });
      table.appendChild(el("tr", {}, el("td", { text: String(s) }), cells, el("td", { cls: "cite-text", text: texts[s] || "" })));
    }
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Sources side by side: each method's rank of each source" }),
      el("div", { cls: "note", text: `cell: the source's rank under the method (1 = most credited); colour: its score within the method's range; bold: the method's top ${K}` }), table));
    const court = csvTable("court.csv");
    if (court) root.appendChild(tablePanel("The court: the answer's log-probability without each method's top-k sources, and with only them", court, "cite-court", (MAN.files || {})["court.csv"]));
    const cost = csvTable("cost.csv");
    if (cost) root.appendChild(tablePanel("Cost of each method", cost, "cite-cost", (MAN.files || {})["cost.csv"]));
    if (MAN.contextcite) root.appendChild(el("p", { cls: "sub", id: "cite-lds", text: `ContextCite: LDS ${fmt(MAN.contextcite.lds)} on ${MAN.contextcite.held_out} held-out masks (${MAN.contextcite.ablations} ablations, alpha ${MAN.contextcite.alpha})` }));
    extras(root);
  };
})();
