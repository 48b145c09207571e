/* streetlamp report viewer: the attribution graph (`streetlamp graph`). Everything drawn is stored in the run
 * folder (commands/graph/view.py): the kept nodes and edges as arrays, their labels in the manifest's
 * graph_view, paths.csv, audit.csv, heads.csv, qk_pairs.csv and qk_audit.csv. The graph is drawn as layers (y)
 * x token positions (x): token embeddings at the bottom, feature nodes (circles) and error nodes (grey squares)
 * at their (layer, position), the logits at the top; edges by |weight| (width, opacity) and sign (colour).
 * Every label (tokens, node labels) is text: textContent or canvas fillText, never HTML. */
(function () {
  "use strict";
  const S = window.streetlamp, L = S.lib, el = L.el, fmt = L.fmt;
  const POS = [0, 114, 178], NEG = [213, 94, 0]; // Okabe-Ito blue (positive) and vermillion (negative)
  const ERR = "#9a9a9a", TOK = "#444444", LOGIT = "#e69f00"; // error squares grey, logits Okabe-Ito orange
  const PITCH = 11; // px between two nodes of one (layer, position) cell

  function csv(name) { return (L.MODEL.csv_tables || []).find((t) => t.file === name); }
  function rowsOf(t) { // a CSV table as objects
    return t ? t.rows.map((r) => Object.fromEntries(t.columns.map((c, j) => [c, r[j]]))) : [];
  }
  function tableOf(t, rows, id, textCols) {
    return L.table(t.columns.map((c, j) => ({ title: c, text: textCols ? textCols.includes(c) : rows.some((r) => typeof r[j] === "string") })), rows, { id });
  }
  function fit(g, s, w) { // the text cut to width w (canvas px), with an ellipsis
    s = String(s);
    if (g.measureText(s).width <= w) return s;
    while (s.length > 1 && g.measureText(s + "…").width > w) s = s.slice(0, -1);
    return s + "…";
  }

  S.views.graph = async function (root) {
    const MAN = L.MAN, gv = MAN.graph_view || {}, toks = (MAN.tokens || []).map(String), P0 = MAN.parameters || {};
    const kinds = gv.kinds || ["feature", "error", "token", "logit"], labels = gv.labels || [];
    const get = async (name) => (L.has(name) ? Array.from((await L.arr(name)).data) : []);
    const nid = await get("node_id"), nkind = await get("node_kind"), nlayer = await get("node_layer"), npos = await get("node_position");
    const nfeat = await get("node_feature"), nact = await get("node_activation"), ninf = await get("node_influence"), nprob = await get("node_probability");
    const es = await get("edge_source"), et = await get("edge_target"), ew = await get("edge_weight");
    const n = toks.length, NL = gv.n_layers || 0, K = nid.length;
    const at = new Map(); nid.forEach((v, i) => at.set(v, i)); // node id -> kept index
    const label = (v) => (at.has(v) ? String(labels[at.get(v)] ?? `node ${v}`) : `node ${v}`);
    const kindOf = (i) => kinds[nkind[i]] || "feature";
    const sc = MAN.scores || {}, gr = MAN.graph || {}, lg = (gr.logits || [])[0] || {};

    root.appendChild(L.header("streetlamp graph", `${MAN.model || ""}; transcoders ${(MAN.features || {}).source || (MAN.features || {}).path || ""}`));
    // a long prompt (2,048 tokens) would push the graph off the page: its start and end here, the whole in a fold
    const prompt = String(MAN.prompt || ""), LONG = 240, long = prompt.length > LONG;
    const promptShown = long ? `${prompt.slice(0, 120)} … ${prompt.slice(-100)}` : prompt;
    root.appendChild(el("p", { cls: "sub", id: "graph-summary", text: `prompt ${L.q(promptShown)} (${n} tokens${long ? `, ${prompt.length} characters: start and end shown` : ""}); next token ${L.q(lg.token ?? "")} (p = ${fmt(lg.probability, 3)}); ` +
      `replacement score ${fmt(sc.replacement, 3)}, completeness ${fmt(sc.completeness, 3)}; kept ${gr.n_kept_nodes} of ${gr.n_nodes} nodes, ${gr.n_kept_edges} edges ` +
      `(node threshold ${P0.node_threshold}, edge threshold ${P0.edge_threshold})` }));
    if (long) root.appendChild(el("details", { id: "graph-prompt" }, el("summary", { text: "the whole prompt" }), el("p", { cls: "note", text: prompt })));

    // ---------- layout: levels (0 tokens, 1..NL layers, NL+1 logits) x positions ----------
    const colW = Math.max(46, Math.min(110, Math.floor(1080 / Math.max(n, 1)))), left = 64, perCell = Math.max(1, Math.floor((colW - 8) / PITCH));
    const cells = new Map(); // "level:pos" -> kept indices (an error first, then features by influence)
    const levelOf = (i) => { const k = kindOf(i); return k === "token" ? 0 : k === "logit" ? NL + 1 : nlayer[i] + 1; };
    for (let i = 0; i < K; i++) { if (kindOf(i) === "logit") continue; const key = `${levelOf(i)}:${npos[i]}`; if (!cells.has(key)) cells.set(key, []); cells.get(key).push(i); }
    for (const v of cells.values()) v.sort((a, b) => (kindOf(a) === "error" ? -1 : 0) - (kindOf(b) === "error" ? -1 : 0) || ninf[b] - ninf[a]);
    const rowsAt = new Array(NL + 2).fill(1);
    for (const [key, v] of cells) { const lv = +key.split(":")[0]; rowsAt[lv] = Math.max(rowsAt[lv], Math.ceil(v.length / perCell)); }
    const levelH = rowsAt.map((r, lv) => (lv === 0 ? 34 : Math.max(56, r * PITCH + 30)));
    const logits = []; for (let i = 0; i < K; i++) if (kindOf(i) === "logit") logits.push(i);
    logits.sort((a, b) => nprob[b] - nprob[a]);
    const slot = 78, top = 46, bottom = 40, colX = (p) => left + (p + 0.5) * colW;
    // logits: one row at the top, the likeliest above the last position, the others leftwards one slot apart
    const x0 = Math.max(colX(Math.max(0, n - 1)), left + slot / 2 + (logits.length - 1) * slot);
    const W = Math.max(left + n * colW + 16, x0 + slot / 2 + 8);
    levelH[NL + 1] = 40;
    const Hh = top + levelH.reduce((s, v) => s + v, 0) + bottom;
    const base = []; { let y = Hh - bottom; for (let lv = 0; lv < NL + 2; lv++) { base.push(y); y -= levelH[lv]; } } // a level's lower edge
    const xy = new Array(K);
    for (const [key, v] of cells) {
      const [lv, p] = key.split(":").map(Number), per = Math.min(perCell, v.length);
      v.forEach((i, r) => {
        const c = r % perCell, row = Math.floor(r / perCell);
        xy[i] = [colX(p) + (c - (per - 1) / 2) * PITCH, lv === 0 ? base[0] - 14 : base[lv] - 14 - row * PITCH];
      });
    }
    logits.forEach((i, r) => { xy[i] = [x0 - r * slot, base[NL + 1] - 14]; });

    // ---------- the drawing ----------
    let maxW = 0; for (const w of ew) if (Number.isFinite(w)) maxW = Math.max(maxW, Math.abs(w));
    maxW = maxW || 1;
    let maxInf = 0; for (let i = 0; i < K; i++) if (kindOf(i) === "feature" && Number.isFinite(ninf[i])) maxInf = Math.max(maxInf, ninf[i]);
    maxInf = maxInf || 1;
    // an edge's importance as the pruning scores it: its share of its target's incoming |weight| times the
    // target's influence on the logits (a logit's own weight is its probability); the kept edges' sums
    const inSum = new Map();
    for (let e = 0; e < es.length; e++) inSum.set(et[e], (inSum.get(et[e]) || 0) + Math.abs(ew[e]));
    const reach = (v) => { const i = at.get(v); if (i === undefined) return 0; return (Number.isFinite(ninf[i]) ? ninf[i] : 0) + (kindOf(i) === "logit" && Number.isFinite(nprob[i]) ? nprob[i] : 0); };
    const escore = es.map((_, e) => (Math.abs(ew[e]) / (inSum.get(et[e]) || 1)) * reach(et[e]));
    const order = es.map((_, e) => e).sort((a, b) => escore[a] - escore[b] || Math.abs(ew[a]) - Math.abs(ew[b])); // the most important drawn last
    // a large graph (a real model keeps 10^5 edges) is a hairball: by default only the CAP most important are drawn
    const M = es.length, CAP = 1000;
    let cap = Math.min(M, CAP), showErrors = true;
    const isError = (v) => at.has(v) && kindOf(at.get(v)) === "error";
    const canvas = el("canvas", { id: "graph-canvas", width: W, height: Hh });
    const readout = el("div", { cls: "readout", id: "graph-node" }, "hover a node for its label; click it to show only its edges (click empty space to show all)");
    const nodeEdges = el("div", { id: "graph-node-edges" });
    let focus = null; // a set of node ids whose edges alone are drawn (a clicked node, a clicked path)
    let focusEdges = null; // with a path: the set of "source:target" edges on it
    let drawn = { nodes: [], edges: [] }; // what the last draw() drew (the tests read it): [id, kind, x, y], [source, target, weight, highlighted]
    const count = el("div", { cls: "note", id: "graph-edge-count" });
    const capIn = el("input", { type: "number", id: "graph-edge-cap", min: "0", max: String(M), step: "100", value: String(cap) });
    capIn.addEventListener("change", () => { const v = Math.round(Number(capIn.value)); cap = Number.isFinite(v) ? Math.max(0, Math.min(M, v)) : cap; capIn.value = String(cap); draw(); });
    const allBtn = el("button", { id: "graph-edge-all", text: `all ${M}` });
    allBtn.addEventListener("click", () => { cap = M; capIn.value = String(M); draw(); });
    const errIn = el("input", { type: "checkbox", id: "graph-show-errors" }); errIn.checked = true;
    errIn.addEventListener("change", () => { showErrors = errIn.checked; draw(); });
    const controls = el("div", { cls: "row", id: "graph-controls" },
      el("label", { text: "edges drawn, most important first: " }, capIn), allBtn,
      el("label", { text: " error nodes " }, errIn));
    function draw() {
      const g = canvas.getContext("2d");
      g.fillStyle = "#fff"; g.fillRect(0, 0, W, Hh);
      g.font = "11px sans-serif"; g.textBaseline = "middle";
      for (let lv = 0; lv < NL + 2; lv++) { // level bands and names
        if (lv % 2) { g.fillStyle = "#f6f6f6"; g.fillRect(left - 4, base[lv] - levelH[lv], W - left, levelH[lv]); }
        g.fillStyle = "#222"; g.fillText(lv === 0 ? "tokens" : lv === NL + 1 ? "logits" : `L${lv - 1}`, 6, base[lv] - 14);
      }
      g.strokeStyle = "#e4e4e4"; g.lineWidth = 1;
      for (let p = 0; p <= n; p++) { g.beginPath(); g.moveTo(left + p * colW, base[NL] - levelH[NL]); g.lineTo(left + p * colW, base[0]); g.stroke(); }
      let shown = 0;
      drawn = { nodes: [], edges: [] };
      const start = M - cap; // order is ascending: the cap most important are its last ones
      for (let r = 0; r < M; r++) {
        const e = order[r];
        const a = at.get(es[e]), b = at.get(et[e]);
        if (a === undefined || b === undefined || !xy[a] || !xy[b]) continue;
        if (!showErrors && (isError(es[e]) || isError(et[e]))) continue;
        const mine = focusEdges ? focusEdges.has(`${es[e]}:${et[e]}`) : focus && (focus.has(es[e]) || focus.has(et[e]));
        if (r < start && !mine) continue; // under the cap, unless it is the clicked node's or path's
        const on = !focus || mine; // a path or a node sets focus (and focusEdges) together
        const t = Math.abs(ew[e]) / maxW, c = ew[e] >= 0 ? POS : NEG;
        g.strokeStyle = `rgba(${c[0]},${c[1]},${c[2]},${on ? 0.12 + 0.78 * Math.sqrt(t) : 0.04})`;
        g.lineWidth = on ? 0.5 + 3.5 * t : 0.5;
        g.beginPath(); g.moveTo(xy[a][0], xy[a][1]); g.lineTo(xy[b][0], xy[b][1]); g.stroke();
        shown++; drawn.edges.push([es[e], et[e], ew[e], on]);
      }
      let nodes = 0, errors = 0;
      for (let i = 0; i < K; i++) {
        if (!xy[i] || (!showErrors && kindOf(i) === "error")) continue;
        const [x, y] = xy[i], k = kindOf(i), dim = focus && !focus.has(nid[i]);
        g.globalAlpha = dim ? 0.3 : 1; g.lineWidth = 1; g.strokeStyle = "#333";
        if (k === "error") { g.fillStyle = ERR; g.fillRect(x - 5, y - 5, 10, 10); g.strokeRect(x - 5, y - 5, 10, 10); errors++; }
        else if (k === "token") { g.fillStyle = TOK; g.beginPath(); g.moveTo(x, y - 6); g.lineTo(x + 6, y); g.lineTo(x, y + 6); g.lineTo(x - 6, y); g.closePath(); g.fill(); }
        else if (k === "logit") { g.fillStyle = LOGIT; g.beginPath(); g.arc(x, y, 6.5, 0, 7); g.fill(); g.stroke(); }
        else { g.fillStyle = L.css(L.seq(0.15 + 0.85 * Math.max(0, ninf[i]) / maxInf)); g.beginPath(); g.arc(x, y, 4.2, 0, 7); g.fill(); g.stroke(); }
        nodes++; drawn.nodes.push([nid[i], k, x, y]);
      }
      g.globalAlpha = 1; g.fillStyle = "#222"; g.font = "10px sans-serif"; g.textAlign = "center";
      logits.forEach((i, r) => { const [x, y] = xy[i]; g.fillText(fit(g, label(nid[i]).replace(/^logit /, ""), slot - 8), x, y - 22 + (r % 2 ? -11 : 0)); g.fillText(fmt(nprob[i], 3), x, y + 15); });
      g.font = "11px sans-serif";
      toks.forEach((t, p) => g.fillText(fit(g, t, colW - 6), colX(p), base[0] + 10));
      g.font = "9px sans-serif"; g.fillStyle = "#777";
      toks.forEach((_, p) => g.fillText(String(p), colX(p), base[0] + 24));
      g.textAlign = "start";
      Object.assign(canvas.dataset, { nodes: String(nodes), edges: String(shown), errors: String(errors), logits: String(logits.length), kept: String(M) });
      count.textContent = `drawing ${shown} of the ${M} kept edges (the ${cap} most important: share of the target's incoming |weight| × the target's influence, as the pruning scores them` +
        `${focus ? ", and every edge of the selection" : ""}${showErrors ? "" : "; error nodes and their edges hidden"}); ` +
        "every kept edge is in edges.parquet";
    }
    function nodeAt(ev) {
      const b = canvas.getBoundingClientRect(), px = (ev.clientX - b.left) * W / b.width, py = (ev.clientY - b.top) * Hh / b.height;
      let best = -1, bd = 49;
      for (let i = 0; i < K; i++) { if (!xy[i] || (!showErrors && kindOf(i) === "error")) continue; const d = (xy[i][0] - px) ** 2 + (xy[i][1] - py) ** 2; if (d < bd) { bd = d; best = i; } }
      return best;
    }
    function describe(i) {
      const k = kindOf(i), parts = [label(nid[i]), k];
      if (k === "feature" || k === "error") parts.push(`layer ${nlayer[i]}`);
      parts.push(`position ${npos[i]}${toks[npos[i]] !== undefined ? " (" + L.q(toks[npos[i]]) + ")" : ""}`);
      if (k === "feature") parts.push(`feature ${nfeat[i]}`, `activation ${fmt(nact[i])}`);
      if (k === "logit") parts.push(`token id ${nfeat[i]}`, `probability ${fmt(nprob[i])}`);
      parts.push(`influence ${fmt(ninf[i])}`);
      return parts.join("; ");
    }
    function select(i) {
      nodeEdges.textContent = "";
      if (i < 0) { focus = null; focusEdges = null; draw(); return; }
      focus = new Set([nid[i]]); focusEdges = new Set();
      readout.textContent = describe(i); readout.setAttribute("data-node", String(nid[i]));
      const rows = [];
      for (let e = 0; e < es.length; e++) if (es[e] === nid[i] || et[e] === nid[i]) { rows.push([label(es[e]), label(et[e]), ew[e]]); focus.add(es[e]); focus.add(et[e]); focusEdges.add(`${es[e]}:${et[e]}`); }
      rows.sort((a, b) => Math.abs(b[2]) - Math.abs(a[2]));
      nodeEdges.appendChild(el("div", { cls: "note", text: `${rows.length} kept edges into or out of ${label(nid[i])} (largest |weight| first, at most 30 shown)` }));
      nodeEdges.appendChild(L.table([{ title: "source", text: true }, { title: "target", text: true }, { title: "weight" }], rows.slice(0, 30), { id: "graph-node-edge-table" }));
      draw();
    }
    canvas.addEventListener("mousemove", (ev) => { const i = nodeAt(ev); if (i < 0) { L.hideTip(); return; } readout.textContent = describe(i); readout.setAttribute("data-node", String(nid[i])); L.showTip(ev, readout.textContent); });
    canvas.addEventListener("mouseleave", L.hideTip);
    canvas.addEventListener("click", (ev) => select(nodeAt(ev)));
    const strip = el("div", { cls: "tokens", id: "graph-tokens" });
    toks.forEach((t, p) => { strip.appendChild(el("span", { cls: "tok", "data-position": String(p), title: `position ${p}`, text: t })); strip.appendChild(document.createTextNode(" ")); });
    const key = el("div", { cls: "note", text: "y: layers (token embeddings at the bottom, the logits at the top, likeliest nearest the last position); x: token positions. " +
      "Circles: features (fill: influence on the logits, sequential palette); grey squares: error nodes (what the transcoder misses at that layer and position); dark diamonds: token embeddings; orange: logits (probability below). " +
      "Edges: blue positive, vermillion negative (Okabe-Ito), width and opacity by |weight| / the largest |weight| (" + fmt(maxW, 4) + ")." });
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "The attribution graph (kept nodes and edges)" }), key,
      controls, el("div", { cls: "scroll" }, canvas), count, readout, el("div", { cls: "note", text: "the tokens (as text):" }), strip,
      L.exportButtons(() => canvas, "graph", () => `attribution graph of ${MAN.prompt || ""}`), nodeEdges));
    draw();
    // wider than the page (a long prompt): start scrolled to the last position, where the logits and most nodes are
    const box = canvas.parentElement;
    if (box && box.scrollWidth > box.clientWidth) box.scrollLeft = box.scrollWidth - box.clientWidth;
    S.graph = { drawn: () => drawn, draw, select, W, Hh, cap: () => cap };

    // ---------- paths and the audit ----------
    const paths = csv("paths.csv");
    if (paths) {
      const pr = rowsOf(paths);
      root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Top paths into the top logit (paths.csv; click one to show it on the graph)" }),
        el("div", { cls: "note", text: paths.shows }),
        L.table(paths.columns.map((c, j) => ({ title: c, text: paths.rows.some((r) => typeof r[j] === "string") })), paths.rows, { id: "graph-paths",
          onclick: (r) => { const ids = String(pr[r].nodes).split(/\s+/).map(Number); focus = new Set(ids); focusEdges = new Set(ids.slice(1).map((v, k) => `${ids[k]}:${v}`)); draw(); canvas.scrollIntoView({ block: "nearest" }); } })));
    }
    const audit = csv("audit.csv");
    if (audit) {
      const j = audit.columns.indexOf("agree"), ar = audit.rows.slice();
      if (j >= 0) ar.sort((a, b) => (a[j] === "True" ? 1 : 0) - (b[j] === "True" ? 1 : 0)); // disagreements first (stable)
      const nAgree = j >= 0 ? ar.filter((r) => r[j] === "True").length : 0;
      root.appendChild(el("div", { cls: "panel" }, el("h2", { text: `The graph's claims on the real model (audit.csv; disagreements first): ${nAgree} of ${ar.length} agree` }),
        el("div", { cls: "note", text: audit.shows }), tableOf(audit, ar, "graph-audit")));
    }

    // ---------- heads ----------
    const hp = el("div", { cls: "panel", id: "graph-heads-panel" }, el("h2", { text: "Heads that carry the kept edges" }));
    root.appendChild(hp);
    const heads = csv("heads.csv");
    if (!gv.heads || !heads) hp.appendChild(el("p", { cls: "note", text: "no head loadings in this run (graph --head-edges N splits the N largest cross-position edges over heads)" }));
    else {
      const hs = await get("head_edge_source"), ht = await get("head_edge_target"), hw = await get("head_edge_weight");
      const hl = (await get("head_loading")), hc = await get("head_composition"), NH = gv.n_heads || 0;
      const pairs = rowsOf(csv("qk_pairs.csv")), qa = rowsOf(csv("qk_audit.csv")), qaT = csv("qk_audit.csv");
      hp.appendChild(el("div", { cls: "note", text: `${hs.length} cross-position edges (the --head-edges ${P0.head_edges} largest kept) split over the heads whose OV path alone carries part of each; composition: paths through two or more heads; per edge the parts sum to the edge. ${heads.shows}` }));
      hp.appendChild(tableOf(heads, heads.rows, "graph-heads", ["carrier", "largest_edge"]));
      const summary = rowsOf(heads);
      summary.forEach((h) => {
        if (h.carrier === "composition") return;
        const l = h.layer, hh = h.head, mine = [];
        for (let e = 0; e < hs.length; e++) { const v = hl[(e * NL + l) * NH + hh]; if (v !== 0) mine.push([label(hs[e]), label(ht[e]), hw[e], v, hw[e] ? v / hw[e] : NaN]); }
        mine.sort((a, b) => Math.abs(b[3]) - Math.abs(a[3]));
        const box = el("details", { cls: "panel graph-head", "data-head": String(h.carrier), id: `graph-head-${h.carrier}` });
        if (summary.indexOf(h) < 3) box.setAttribute("open", "");
        box.appendChild(el("summary", { text: `${h.carrier}: ${fmt(100 * h.share_of_abs_loading, 2)}% of the split edges' |loading| over ${h.edges} edges (summed loading ${fmt(h.loading_sum)})` }));
        box.appendChild(el("div", { cls: "note", text: `the edges ${h.carrier} carries (its loading: the edge through its OV path and no other head's), largest first (at most 12)` }));
        box.appendChild(L.table([{ title: "source", text: true }, { title: "target", text: true }, { title: "edge weight" }, { title: "loading" }, { title: "share of edge" }], mine.slice(0, 12), { id: `graph-head-edges-${h.carrier}` }));
        const qp = pairs.filter((r) => r.head === h.carrier);
        if (!qp.length) box.appendChild(el("div", { cls: "note", text: `why it attended: not explained (QK is computed for the --qk-heads ${P0.qk_heads} heads carrying the largest edges)` }));
        const seen = new Set();
        for (const r of qp) {
          const k = `${r.query_position}:${r.key_position}`; if (seen.has(k)) continue; seen.add(k);
          const at_ = qp.filter((x) => `${x.query_position}:${x.key_position}` === k);
          box.appendChild(el("h3", { text: `why it attended from ${r.query_position} (${L.q(toks[r.query_position] ?? "")}) to ${r.key_position} (${L.q(toks[r.key_position] ?? "")}): attention ${fmt(r.attention, 3)}, score ${fmt(r.score)}; edge ${r.edge}` }));
          const sides = el("div", { cls: "row" });
          for (const [kind, title] of [["pair", "top (query-side part, key-side part) pairs of the score"], ["query side", "query-side parts (with the whole key)"], ["key side", "key-side parts (with the whole query)"]]) {
            const rr = at_.filter((x) => x.kind === kind).map((x) => [x.rank, x.query_part, x.key_part, x.contribution, x.share_of_score]);
            if (!rr.length) continue;
            sides.appendChild(el("div", {}, el("div", { cls: "note", text: title }),
              L.table([{ title: "rank" }, { title: "query part", text: true }, { title: "key part", text: true }, { title: "contribution" }, { title: "share of score" }], rr,
                { id: `graph-qk-${h.carrier}-${k.replace(":", "-")}-${kind.replace(" ", "-")}` })));
          }
          box.appendChild(sides);
        }
        const mineA = qa.map((x, i) => [x, i]).filter(([x]) => x.head === h.carrier);
        if (mineA.length && qaT) {
          box.appendChild(el("div", { cls: "note", text: "checked on the real model (qk_audit.csv: the top query-side / key-side feature zeroed; disagreements first)" }));
          box.appendChild(tableOf(qaT, mineA.map(([, i]) => qaT.rows[i]), `graph-qk-audit-${h.carrier}`));
        }
        hp.appendChild(box);
      });
      const comp = summary.find((h) => h.carrier === "composition");
      if (comp) hp.appendChild(el("div", { cls: "note", text: `composition (paths through two or more heads): ${fmt(100 * comp.share_of_abs_loading, 2)}% of the |loading|; largest on ${comp.largest_edge} (${fmt(comp.largest_loading)})` }));
      if (hc.length === 0) hp.appendChild(el("div", { cls: "note", text: "no kept edge crosses positions" }));
    }

    // ---------- the rest: other tables, the manifest ----------
    const shown = new Set(["paths.csv", "audit.csv", "heads.csv", "qk_pairs.csv", "qk_audit.csv"]);
    for (const t of L.MODEL.csv_tables || []) if (!shown.has(t.file)) root.appendChild(el("div", { cls: "panel" }, el("h2", { text: t.file }), el("div", { cls: "note", text: t.shows }), tableOf(t, t.rows, "csv-" + t.file.replace(/[^A-Za-z0-9_-]/g, "_"))));
    const qkAll = csv("qk_audit.csv");
    if (qkAll) root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "QK audit, every head (qk_audit.csv; disagreements first)" }), el("div", { cls: "note", text: qkAll.shows }), tableOf(qkAll, qkAll.rows, "graph-qk-audit")));
    const rest = {}; for (const [k, v] of Object.entries(MAN)) if (!["arrays", "tables", "figures", "versions", "graph_view"].includes(k)) rest[k] = v;
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Manifest" }), L.kv(rest, 1)));
  };
})();
