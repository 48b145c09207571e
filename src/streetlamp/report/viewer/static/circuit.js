/* streetlamp report viewer: the circuit view (`streetlamp circuit`). Everything drawn is a stored array of the
 * run folder (commands/circuit/view.py): the circuit at each swept size (masks.<method>), the edge scores and
 * their intervals, inclusion frequencies, exact patching effects where computed, the first prompt's attention
 * and the faithfulness curves. The view never recomputes a circuit. */
(function () {
  "use strict";
  const S = window.streetlamp, L = S.lib, el = L.el, fmt = L.fmt, q = L.q;
  const V = S.views;
  const COLS = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#000000"]; // Okabe-Ito
  const OFFSET = { q: -5, k: 0, v: 5, mlp: 0, logits: 0 }; // where a head's three inputs meet it
  // an MLP writer: the layer's MLP, or with --expert-nodes an expert (L{l}.E{e}) or the shared expert (L{l}.SE)
  const isMlp = (rest) => rest === "MLP" || rest === "SE" || /^E\d+$/.test(rest);

  function layout(cv) {
    const nl = cv.n_layers, nh = cv.n_heads, colW = Math.max(34, Math.min(160, Math.floor(1100 / (nl + 2))));
    // MLP rows below the heads: one, or a layer's experts (then its shared expert) one per row
    const mlpRow = cv.writers.map((w) => { const rest = w.split(".")[1] || ""; return rest === "SE" ? -1 : rest[0] === "E" ? +rest.slice(1) : 0; });
    const nE = Math.max(0, ...mlpRow) + 1, nm = nE + (cv.writers.some((w) => w.endsWith(".SE")) ? 1 : 0);
    const P = 46, top = 34, rowH = 22, W = 2 * P + (nl + 1) * colW, Hh = top + (nh + nm) * rowH + 8;
    const pos = cv.writers.map((w, j) => {
      if (w === "embed") return [P, top + (nh / 2) * rowH];
      const [lp, rest] = w.split("."), l = +lp.slice(1);
      const x = P + (l + 1) * colW;
      if (!isMlp(rest)) return [x, top + +rest.slice(1) * rowH];
      return [x + colW * 0.5, top + (nh + 0.5 + (mlpRow[j] < 0 ? nE : mlpRow[j])) * rowH];
    });
    const logits = [P + (nl + 1) * colW, top + (nh / 2) * rowH];
    const target = cv.readers.map(([node, input, layer, owners]) => {
      if (input === "logits") return logits;
      const ys = owners.map((o) => pos[o][1]), y = ys.reduce((s, v) => s + v, 0) / ys.length;
      // the router's input: left of its experts, at their middle (it feeds every expert's weight)
      if (input === "router") return [pos[owners[0]][0] - 10, y];
      return [pos[owners[0]][0], y + OFFSET[input]];
    });
    return { W, Hh, P, top, rowH, colW, pos, logits, target, nE, nm };
  }

  function segDist(px, py, x1, y1, x2, y2) {
    const dx = x2 - x1, dy = y2 - y1, t = Math.max(0, Math.min(1, ((px - x1) * dx + (py - y1) * dy) / (dx * dx + dy * dy || 1)));
    return Math.hypot(px - x1 - t * dx, py - y1 - t * dy);
  }

  V.circuit = async function (root) {
    const MAN = L.MAN, MODEL = L.MODEL, cv = MAN.circuit_view, P = MAN.parameters || {};
    const methods = MAN.methods || [], R = cv.readers.length, U = cv.writers.length;
    const stored = Array.from((await L.arr("sizes")).data), data = {};
    const sizes = (P.sizes || []).length === stored.length ? P.sizes : stored; // the manifest's exact decimals
    for (const m of methods) {
      data[m] = {};
      for (const k of ["scores", "interval", "inclusion", "masks", "faithfulness", "random"]) data[m][k] = (await L.arr(`${k}.${m}`)).data;
    }
    const exact = (await L.arr("exact")).data, exactIv = (await L.arr("exact_interval")).data;
    const att = await L.arr("attention"), [, nhA, n] = att.shape, toks = cv.prompt.tokens;
    const summary = MAN.summary || {};
    const chosen = sizes.findIndex((x) => Math.abs(x - P.size) <= 1e-6 * Math.abs(P.size));
    let method = methods.includes(L.state.method) ? L.state.method : methods[0];
    let k = L.sint("size", chosen >= 0 ? chosen : sizes.length - 1, 0, sizes.length - 1);
    const s0 = summary[methods[0]] || {};
    root.appendChild(L.header("streetlamp circuit", L.modelLine()));
    root.appendChild(el("p", { cls: "sub", text: `task ${(MAN.task || {}).name}, ${(MAN.task || {}).n_prompts} prompts; ${P.ablation} ablation, metric ${P.metric}: ` +
      `m(model) ${fmt(s0.m_full)}, m(empty circuit) ${fmt(s0.m_empty)}; score = m(edge ablated) − m(model) (negative: the edge carries the behaviour)` }));

    // ---------- controls ----------
    const sel = el("select", { id: "circuit-method", "aria-label": "method" }, methods.map((m) => el("option", { value: m, text: m })));
    sel.value = method;
    const slider = el("input", { type: "range", id: "circuit-size", min: 0, max: sizes.length - 1, step: 1, value: k, "aria-label": "circuit size" });
    const readout = el("div", { cls: "readout", id: "circuit-f" });
    const L_ = layout(cv), canvas = el("canvas", { id: "circuit-graph", width: L_.W, height: L_.Hh });
    const detail = el("div", { id: "circuit-edge" }, el("p", { cls: "note", text: "click an edge (in the graph or the table) to see its exact patching effect, the receiving head's attention and its inclusion frequency" }));
    const edgeBox = el("div", {}), curveBox = el("div", {}), legendBox = el("div", { id: "circuit-scale" });
    let maxAbs = 1, drawn = [];
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "The circuit" }),
      el("div", { cls: "controls" }, el("label", {}, "method ", sel), el("label", {}, " size ", slider)), readout,
      el("div", { cls: "note", text: "columns: embed, layers 0.., logits; in a layer the heads (top, H0 first) and the MLP (below, offset right); an edge ends at a head's q (above its centre), k (centre) or v (below); a key/value group's k and v edges end between its heads; with --expert-nodes a layer's experts are squares one per row below its heads (the shared expert last) and an edge into its router ends left of its experts. Colour: the diverging palette by the edge's score (white = 0), width by |score|" }),
      el("div", { cls: "scroll" }, canvas), legendBox,
      L.exportButtons(() => canvas, "circuit_graph", () => `circuit by ${method} at ${sizes[k]} of the edges`), detail));
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Edges of the circuit at this size (largest |score| first; click one)" }), edgeBox));
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Faithfulness over circuit sizes" }), curveBox));

    const name = (i, j) => `${cv.writers[j]} -> ${cv.readers[i][0]} (${cv.readers[i][1]}${cv.readers[i][4] ? ", key/value group " + cv.readers[i][4] : ""})`;
    function draw() {
      const d = data[method], g = canvas.getContext("2d"), base = k * R * U;
      g.fillStyle = "#fff"; g.fillRect(0, 0, canvas.width, canvas.height);
      const edges = [];
      maxAbs = 0;
      for (let i = 0; i < R; i++) for (let j = 0; j < U; j++) if (d.masks[base + i * U + j] > 0.5) {
        const s = d.scores[i * U + j]; edges.push([i, j, s]); if (Number.isFinite(s)) maxAbs = Math.max(maxAbs, Math.abs(s));
      }
      maxAbs = maxAbs || 1;
      edges.sort((a, b) => Math.abs(a[2]) - Math.abs(b[2])); // the largest drawn last, on top
      drawn = edges.map(([i, j, s]) => {
        const [x1, y1] = L_.pos[j], [x2, y2] = L_.target[i];
        g.strokeStyle = L.css(L.div(s, maxAbs)); g.globalAlpha = 0.85; g.lineWidth = 0.6 + 3.4 * Math.abs(s) / maxAbs;
        g.beginPath(); g.moveTo(x1, y1); g.lineTo(x2, y2); g.stroke();
        return { reader: i, writer: j, score: s, x1, y1, x2, y2 };
      });
      g.globalAlpha = 1;
      const used = new Set(); for (const e of drawn) { used.add(e.writer); for (const o of cv.readers[e.reader][3]) used.add(o); }
      g.font = "10px sans-serif";
      cv.writers.forEach((w, j) => {
        const [x, y] = L_.pos[j], on = used.has(j);
        g.fillStyle = on ? "#333" : "#ddd"; g.strokeStyle = "#777"; g.lineWidth = 0.8;
        g.beginPath(); if (isMlp(w.split(".")[1] || "")) g.rect(x - 4, y - 4, 8, 8); else g.arc(x, y, w === "embed" ? 6 : 4, 0, 7); g.fill(); g.stroke();
      });
      g.fillStyle = "#333"; g.beginPath(); g.arc(L_.logits[0], L_.logits[1], 6, 0, 7); g.fill();
      g.fillStyle = "#222"; g.fillText("embed", L_.P - 16, L_.top - 16); g.fillText("logits", L_.logits[0] - 14, L_.top - 16);
      for (let l = 0; l < cv.n_layers; l++) g.fillText(`L${l}`, L_.P + (l + 1) * L_.colW - 6, L_.top - 16);
      for (let h = 0; h < cv.n_heads; h++) g.fillText(`H${h}`, 2, L_.top + h * L_.rowH + 3);
      if (L_.nm === 1) g.fillText("MLP", 2, L_.top + (cv.n_heads + 0.5) * L_.rowH + 3);
      else for (let e = 0; e < L_.nm; e++) g.fillText(e < L_.nE ? `E${e}` : "SE", 2, L_.top + (cv.n_heads + 0.5 + e) * L_.rowH + 3);
      const t = d.faithfulness, r = d.random, f = t[3 * k], lo = t[3 * k + 1], hi = t[3 * k + 2];
      readout.textContent = `${method} at ${sizes[k]} of the edges: ${drawn.length} edges, faithfulness f = ${fmt(f, 3)} [${fmt(lo, 3)}, ${fmt(hi, 3)}] (95% bootstrap over prompts); random circuits ${fmt(r[3 * k], 3)} [${fmt(r[3 * k + 1], 3)}, ${fmt(r[3 * k + 2], 3)}]`;
      Object.assign(readout.dataset, { f: String(f), lo: String(lo), hi: String(hi), edges: String(drawn.length), size: String(sizes[k]), method });
      canvas.dataset.edges = String(drawn.length);
      legendBox.textContent = ""; legendBox.appendChild(L.legend("div", 0, maxAbs, el("span", { text: " edge score (sign: colour)" })));
      S.circuit = { method, size: k, drawn, f, lo, hi, maxAbs, layout: L_, show: showEdge };
      edgeTable(); curves();
    }
    function edgeTable() {
      const d = data[method], top = drawn.slice().sort((a, b) => Math.abs(b.score) - Math.abs(a.score)).slice(0, 40);
      const rows = top.map((e) => { const i = e.reader, j = e.writer, x = i * U + j;
        return [cv.writers[j], cv.readers[i][0], cv.readers[i][1], e.score, d.interval[x], d.interval[R * U + x], exact[x], d.inclusion[x]]; });
      edgeBox.textContent = "";
      edgeBox.appendChild(el("div", { cls: "note", text: `${drawn.length} edges; the ${top.length} largest shown. exact: m(edge patched) − m(model) where computed (${cv.exact}); inclusion: at the chosen size ${P.size}` }));
      edgeBox.appendChild(L.table(["source", "target", "input", "score", "ci low", "ci high", "exact", "inclusion"].map((c, j) => ({ title: c, text: j < 3 })), rows,
        { id: "circuit-edges", key: (r) => `${top[r].reader}:${top[r].writer}`, onclick: (r) => showEdge(top[r].reader, top[r].writer) }));
    }
    function showEdge(i, j) {
      const d = data[method], x = i * U + j, [node, input, layer, owners] = cv.readers[i];
      detail.textContent = "";
      const ex = exact[x], has = Number.isFinite(ex);
      const kv = el("div", { cls: "kv", id: "circuit-edge-kv", "data-reader": i, "data-writer": j, "data-score": String(d.scores[x]), "data-exact": String(ex), "data-inclusion": String(d.inclusion[x]) },
        el("div", { cls: "k", text: "edge" }), el("div", { cls: "v", text: name(i, j) }),
        el("div", { cls: "k", text: `${method} score` }), el("div", { cls: "v", text: `${fmt(d.scores[x])} [${fmt(d.interval[x])}, ${fmt(d.interval[R * U + x])}]` }),
        el("div", { cls: "k", text: "exact patching" }), el("div", { cls: "v", text: has ? `${fmt(ex)} [${fmt(exactIv[x])}, ${fmt(exactIv[R * U + x])}]` : `not computed for this edge (computed for ${cv.exact})` }),
        el("div", { cls: "k", text: "inclusion frequency" }), el("div", { cls: "v", text: `${fmt(d.inclusion[x], 3)} of the bootstrap circuits at size ${P.size}` }));
      detail.appendChild(el("h2", { text: `Edge ${name(i, j)}` })); detail.appendChild(kv);
      if (!owners.length || input === "mlp" || input === "router") { detail.appendChild(el("p", { cls: "note", text: `the receiver (${node}) attends to nothing: no attention to show` })); return; }
      const labels = toks.map((t, p) => `${p} ${q(t)}`);
      for (const o of owners) {
        const h = +cv.writers[o].split(".")[1].slice(1), vals = att.data.subarray((layer * nhA + h) * n * n, (layer * nhA + h + 1) * n * n);
        detail.appendChild(L.valueGrid(`circuit-att-L${layer}H${h}`, vals, n, n, { title: `attention of ${cv.writers[o]} on the first prompt`, rowName: "query", colName: "key",
          rowLabels: labels, colLabels: labels, signed: false, hi: 1, cell: Math.max(8, Math.min(22, Math.floor(420 / n))), note: `prompt: ${cv.prompt.text}` }));
      }
    }
    canvas.addEventListener("click", (ev) => {
      const b = canvas.getBoundingClientRect(), px = (ev.clientX - b.left) * canvas.width / b.width, py = (ev.clientY - b.top) * canvas.height / b.height;
      let best = null, bd = 6;
      for (let t = drawn.length - 1; t >= 0; t--) { const e = drawn[t], dd = segDist(px, py, e.x1, e.y1, e.x2, e.y2); if (dd < bd) { bd = dd; best = e; } }
      if (best) showEdge(best.reader, best.writer);
    });
    function curves() {
      const W = 680, Hh = 340, Pd = 60, c = el("canvas", { id: "circuit-curves", width: W, height: Hh }), g = c.getContext("2d");
      const lg = sizes[sizes.length - 1] / sizes[0] > 20, tx = (x) => (lg ? Math.log10(x) : x);
      const x0 = tx(sizes[0]), x1 = tx(sizes[sizes.length - 1]);
      let y0 = 0, y1 = 1;
      for (const m of methods) for (const a of [data[m].faithfulness, data[m].random]) for (const v of a) if (Number.isFinite(v)) { y0 = Math.min(y0, v); y1 = Math.max(y1, v); }
      const sx = (x) => Pd + (tx(x) - x0) / ((x1 - x0) || 1) * (W - 2 * Pd), sy = (y) => Hh - Pd - (y - y0) / ((y1 - y0) || 1) * (Hh - 2 * Pd);
      g.fillStyle = "#fff"; g.fillRect(0, 0, W, Hh); g.strokeStyle = "#999"; g.strokeRect(Pd, Pd, W - 2 * Pd, Hh - 2 * Pd);
      g.setLineDash([2, 3]); for (const y of [0, 1]) { g.beginPath(); g.moveTo(Pd, sy(y)); g.lineTo(W - Pd, sy(y)); g.stroke(); } g.setLineDash([]);
      g.fillStyle = "#222"; g.font = "11px sans-serif";
      g.fillText(`circuit size (fraction of the edges${lg ? ", log scale" : ""})`, W / 2 - 110, Hh - 10);
      g.save(); g.translate(14, Hh / 2 + 70); g.rotate(-Math.PI / 2); g.fillText("faithfulness f(C), 95% band", 0, 0); g.restore();
      g.fillText(fmt(y0, 2), 18, sy(y0) + 4); g.fillText(fmt(y1, 2), 18, sy(y1) + 4);
      g.fillText("0 (empty)", W - Pd + 4, sy(0) + 4); g.fillText("1 (model)", W - Pd + 4, sy(1) + 4);
      sizes.forEach((s) => g.fillText(String(s), sx(s) - 10, Hh - Pd + 14));
      const series = methods.map((m, i) => ({ name: m, a: data[m].faithfulness, col: COLS[i % COLS.length], dash: [] }))
        .concat([{ name: `random circuits (${methods[0]})`, a: data[methods[0]].random, col: "#888", dash: [5, 4] }]);
      series.forEach((s, i) => {
        g.fillStyle = s.col; g.globalAlpha = 0.15; g.beginPath();
        sizes.forEach((x, t) => (t ? g.lineTo(sx(x), sy(s.a[3 * t + 2])) : g.moveTo(sx(x), sy(s.a[3 * t + 2]))));
        for (let t = sizes.length - 1; t >= 0; t--) g.lineTo(sx(sizes[t]), sy(s.a[3 * t + 1]));
        g.closePath(); g.fill(); g.globalAlpha = 1;
        g.strokeStyle = s.col; g.lineWidth = 2; g.setLineDash(s.dash); g.beginPath();
        sizes.forEach((x, t) => (t ? g.lineTo(sx(x), sy(s.a[3 * t])) : g.moveTo(sx(x), sy(s.a[3 * t])))); g.stroke(); g.setLineDash([]);
        g.fillRect(W - Pd - 170, Pd + 8 + 14 * i, 10, 10); g.fillStyle = "#222"; g.fillText(s.name, W - Pd - 156, Pd + 17 + 14 * i);
      });
      g.strokeStyle = "#d55e00"; g.lineWidth = 1; g.beginPath(); g.moveTo(sx(sizes[k]), Pd); g.lineTo(sx(sizes[k]), Hh - Pd); g.stroke();
      curveBox.textContent = "";
      curveBox.appendChild(c);
      curveBox.appendChild(el("div", { cls: "note", text: "every method's f with its 95% bootstrap band over prompts (circuits fixed), the random baseline dashed; the vertical line is the size the slider shows. Lines: Okabe-Ito (colour-blind-safe)" }));
      curveBox.appendChild(L.exportButtons(() => c, "circuit_faithfulness", () => "faithfulness over circuit sizes"));
      const rows = [];
      for (const m of methods) sizes.forEach((x, t) => rows.push([m, x, data[m].faithfulness[3 * t], data[m].faithfulness[3 * t + 1], data[m].faithfulness[3 * t + 2], data[m].random[3 * t]]));
      curveBox.appendChild(L.table(["method", "size", "f", "ci low", "ci high", "random f"].map((t, j) => ({ title: t, text: j === 0 })), rows, { id: "circuit-faithfulness" }));
    }
    sel.addEventListener("change", () => { method = sel.value; L.state.method = method; L.writeHash(); draw(); });
    slider.addEventListener("input", () => { k = +slider.value; L.state.size = k; L.writeHash(); draw(); });
    draw();
    const paths = (MODEL.csv_tables || []).find((t) => t.file === "paths.csv");
    if (paths) root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "The matrix says, patching says (paths.csv; disagreements first)" }),
      el("div", { cls: "note", text: paths.shows }),
      L.table(paths.columns.map((c, j) => ({ title: c, text: paths.rows.some((r) => typeof r[j] === "string") })), paths.rows, { id: "circuit-paths" })));
    const areas = (MODEL.csv_tables || []).find((t) => t.file === "areas.csv");
    if (areas) root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "CPR and CMD per method (areas.csv)" }),
      L.table(areas.columns.map((c, j) => ({ title: c, text: areas.rows.some((r) => typeof r[j] === "string") })), areas.rows, { id: "circuit-areas" })));
    const rest = {}; for (const [kk, v] of Object.entries(MAN)) if (!["arrays", "tables", "figures", "versions", "circuit_view"].includes(kk)) rest[kk] = v;
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Manifest" }), L.kv(rest, 1)));
  };
})();
