/* streetlamp report viewer: the head atlas (streetlamp atlas). Every head as a point over any two of its
 * per-head scores (default: attention prominence against causal effect), a head finder (sort and filter by
 * any score), and a head's panel: its attention on its top sequences by prominence and by effect, with the
 * numbers and the tokens as text. A head's patterns are one chunk of panel_patterns, decoded when it is
 * opened. */
(function () {
  "use strict";
  const S = window.streetlamp, L = S.lib, el = L.el, fmt = L.fmt, MAN = L.MAN, MODEL = L.MODEL, state = L.state;

  S.views.atlas = async function (root) {
    const A = MAN.atlas || {}, NH = A.n_heads, names = A.metrics || [], K = A.top_k || 1;
    const ab = MAN.ablation || {};
    root.appendChild(L.header("streetlamp atlas", L.modelLine()));
    root.appendChild(el("p", { cls: "sub", text: `${A.n_sequences} sequences; ${ab.strategy || "?"} ablation at ${ab.site || "attn.z"}: ${ab.reference || ""}; ${A.n_exact_pairs} of ${A.n_pairs} (head, sequence) pairs ablated exactly` }));
    const hm = await L.arr("head_metrics"), M = hm.shape[1], N = hm.shape[0];
    const col = (name) => names.indexOf(name);
    const val = (i, name) => { const k = col(name); return k < 0 ? NaN : hm.data[i * M + k]; };
    const label = (i) => `${Math.floor(i / NH)}.${i % NH}`;
    const types = A.head_types || [];
    const flag = (i) => (val(i, "streetlight") > 0.5 ? "streetlight" : val(i, "unremarkable_used") > 0.5 ? "unremarkable but used" : "");
    const rules = A.rules || {};

    // ---------- controls ----------
    const pick = (id, dflt) => { const s = el("select", { id }); for (const n of names) s.appendChild(el("option", { value: n, text: n })); s.value = state[id] && names.includes(state[id]) ? state[id] : dflt; return s; };
    const xs = pick("atlas-x", "prominence"), ys = pick("atlas-y", "effect");
    const logY = el("input", { type: "checkbox", id: "atlas-logy" }); logY.checked = state["atlas-logy"] !== "0";
    const filt = el("select", { id: "atlas-filter" });
    for (const [v, t] of [["", "all heads"], ["streetlight", "streetlight heads"], ["unremarkable_used", "unremarkable but used"], ["estimate_poor", "attribution estimate poor"],
      ...[...new Set(types.filter(Boolean))].map((t) => ["type:" + t, "head type " + t])]) filt.appendChild(el("option", { value: v, text: t }));
    filt.value = state["atlas-filter"] || "";
    const shown = (i) => { const f = filt.value; if (!f) return true; if (f.startsWith("type:")) return types[i] === f.slice(5); return val(i, f) > 0.5; };
    root.appendChild(el("div", { cls: "panel controls" }, "x: ", xs, " y: ", ys, " ", logY, " log y ", " show: ", filt,
      el("div", { cls: "note", text: `streetlight: ${rules.streetlight || ""} (floor ${rules.floor}, striking ${rules.striking}); unremarkable but used: ${rules.unremarkable_used || ""}; effect: ${rules.effect || ""}` })));

    // ---------- scatter: every head over two metrics, click a head ----------
    const W = 620, Hh = 400, P = 50, cv = el("canvas", { id: "atlas-scatter", width: W, height: Hh });
    const readout = el("div", { cls: "readout", id: "atlas-scatter-value" }, "hover a point; click it for its panel");
    let pts = [];
    function drawScatter() {
      const g = cv.getContext("2d"), xn = xs.value, yn = ys.value;
      const idx = []; for (let i = 0; i < N; i++) if (shown(i) && Number.isFinite(val(i, xn)) && Number.isFinite(val(i, yn))) idx.push(i);
      const Yraw = idx.map((i) => val(i, yn)), pos = Yraw.length > 0 && Yraw.every((v) => v > 0);
      const ly = logY.checked && pos; logY.disabled = !pos;
      const X = idx.map((i) => val(i, xn)), Y = Yraw.map((v) => (ly ? Math.log10(v) : v));
      const x0 = Math.min(...X), x1 = Math.max(...X), y0 = Math.min(...Y), y1 = Math.max(...Y);
      const sx = (x) => P + (x - x0) / ((x1 - x0) || 1) * (W - 2 * P), sy = (y) => Hh - P - (y - y0) / ((y1 - y0) || 1) * (Hh - 2 * P);
      g.fillStyle = "#fff"; g.fillRect(0, 0, W, Hh); g.strokeStyle = "#999"; g.strokeRect(P, P, W - 2 * P, Hh - 2 * P);
      g.fillStyle = "#222"; g.font = "12px sans-serif"; g.fillText(xn, W / 2 - 30, Hh - 10);
      g.save(); g.translate(14, Hh / 2 + 30); g.rotate(-Math.PI / 2); g.fillText(yn + (ly ? " (log scale)" : ""), 0, 0); g.restore();
      const yl = (v) => fmt(ly ? 10 ** v : v, 3);
      if (idx.length) { g.fillText(fmt(x0, 3), P, Hh - P + 14); g.fillText(fmt(x1, 3), W - P - 40, Hh - P + 14); g.fillText(yl(y0), 2, Hh - P + 14); g.fillText(yl(y1), 2, P - 6); }
      const byY = [...idx].sort((a, b) => val(b, yn) - val(a, yn)).slice(0, 6), named = new Set(byY);
      pts = idx.map((i, k) => [i, sx(X[k]), sy(Y[k])]);
      for (const [i, px, py] of pts) { // Okabe-Ito: vermillion streetlight, blue unremarkable-but-used, grey the rest
        const f = flag(i); g.fillStyle = f === "streetlight" ? "#d55e00" : f ? "#0072b2" : "#888";
        g.beginPath(); g.arc(px, py, f ? 4.5 : 3, 0, 7); g.fill();
        if (named.has(i) || String(i) === state.head) { g.fillStyle = "#222"; g.font = "10px sans-serif"; g.fillText(label(i), px + 5, py - 4); }
      }
      cv.setAttribute("data-points", String(pts.length));
    }
    const nearest = (ev) => { const r = cv.getBoundingClientRect(), mx = (ev.clientX - r.left) * W / r.width, my = (ev.clientY - r.top) * Hh / r.height;
      let best = -1, bd = 100; for (const [i, px, py] of pts) { const d = (px - mx) ** 2 + (py - my) ** 2; if (d < bd) { bd = d; best = i; } } return best; };
    cv.addEventListener("mousemove", (ev) => { const i = nearest(ev); if (i < 0) return;
      readout.textContent = `head ${label(i)}${types[i] ? " (" + types[i] + ")" : ""}: ${xs.value} ${fmt(val(i, xs.value))}, ${ys.value} ${fmt(val(i, ys.value))}${flag(i) ? "; " + flag(i) : ""}`; L.showTip(ev, readout.textContent); });
    cv.addEventListener("mouseleave", L.hideTip);
    cv.addEventListener("click", (ev) => { const i = nearest(ev); if (i >= 0) openHead(i); });
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Every head: where it looks against what removing it changes" }), cv, readout,
      el("div", { cls: "note", text: "each point a head; the six highest on y are labelled (layer.head), hover for any; vermillion: streetlight (striking pattern, effect within noise of zero); blue: unremarkable but used; colours Okabe-Ito" }),
      L.exportButtons(() => cv, "atlas-scatter", () => `${ys.value} against ${xs.value}`)));

    // ---------- head finder ----------
    const finder = el("div", { id: "atlas-finder" });
    const keyCols = ["prominence", "effect", "effect_low", "effect_high", "rho", "rho_low", "rho_high", "est_r", "entropy", "sink", "previous_token", "duplicate_token", "induction", "dla", "dloss"];
    function drawFinder() {
      const extra = [xs.value, ys.value].filter((n) => !keyCols.includes(n));
      const cols = [...keyCols.filter((n) => col(n) >= 0), ...extra];
      const rows = []; const heads = [];
      for (let i = 0; i < N; i++) if (shown(i)) { heads.push(i); rows.push([label(i), types[i] || "", flag(i), ...cols.map((n) => val(i, n))]); }
      finder.textContent = "";
      finder.appendChild(L.table([{ title: "head", text: true }, { title: "type", text: true }, { title: "flag", text: true }, ...cols.map((c) => ({ title: c }))], rows,
        { id: "atlas-heads", sort: 4, desc: true, onclick: (r) => openHead(heads[r]), key: (r) => label(heads[r]) }));
    }
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Head finder (click a column to sort, a row for the head's panel)" }), finder));

    // ---------- a head's panel ----------
    const panel = el("div", { cls: "panel", id: "atlas-panel" }, el("p", { text: "click a head in the scatter or the finder" }));
    root.appendChild(panel);
    const seqs = await L.arr("panel_sequence"), vals = await L.arr("panel_values");
    const slots = seqs.shape[1];
    async function openHead(i) {
      const t0 = performance.now();
      state.head = String(i); L.writeHash(); drawScatter();
      const pat = await L.slab("panel_patterns", i), Wd = MODEL.arrays.panel_patterns.shape[2];
      panel.textContent = "";
      panel.setAttribute("data-head", label(i));
      panel.appendChild(el("h2", { text: `head ${label(i)}${types[i] ? " (" + types[i] + ")" : ""}${flag(i) ? ": " + flag(i) : ""}` }));
      const nums = {}; for (const n of names) nums[n] = fmt(val(i, n));
      panel.appendChild(L.kv(nums, 0));
      const err = MODEL.arrays.panel_patterns.max_error;
      if (err) panel.appendChild(el("div", { cls: "note", text: `patterns stored at fixed point: each weight within ${fmt(err)}` }));
      for (let j = 0; j < slots; j++) {
        const s = seqs.data[i * slots + j]; if (s < 0) continue;
        const v = vals.data.subarray((i * slots + j) * 4, (i * slots + j + 1) * 4);
        const toks = (A.tokens || {})[String(s)] || [], n = Math.min(toks.length, Wd);
        const what = j < K ? `top ${j + 1} by prominence` : `top ${j - K + 1} by effect`;
        const box = el("div", { cls: "panel atlas-seq", "data-slot": j, "data-sequence": s });
        box.appendChild(el("h3", { text: `${what}: sequence ${s} (${(A.example_ids || {})[String(s)] || ""})` }));
        box.appendChild(el("div", { cls: "note", text: `prominence ${fmt(v[0])}, KL at the explained position ${fmt(v[1])}${Number.isNaN(v[1]) ? " (not ablated exactly)" : ""}, estimated Δlog p ${fmt(v[2])}, DLA ${fmt(v[3])}` }));
        const m = pat.subarray(j * Wd * Wd, (j + 1) * Wd * Wd), cell = Math.max(4, Math.min(12, Math.floor(480 / Math.max(n, 1))));
        const c = el("canvas", { width: n * cell, height: n * cell, cls: "atlas-pattern" });
        L.paint(c, n, n, (a, b) => m[a * Wd + b], (x) => L.seq(x), null, cell, cell);
        const ex = (A.explained || {})[String(s)], row = Math.min(n - 1, Number.isInteger(ex) ? ex : n - 1); // the explained position's row
        const line = el("div", { cls: "tokens" });
        for (let k = 0; k < n; k++) { const w = m[row * Wd + k], cc = L.seq(w);
          line.appendChild(el("span", { cls: "tok", text: toks[k], title: `weight ${fmt(w)}`, style: `background:${L.css(cc)};color:${L.ink(cc)}` })); line.appendChild(document.createTextNode(" ")); }
        box.appendChild(el("div", { cls: "note", text: `attention of the explained position (row ${row}) over the tokens${toks.length > Wd ? ` (the first ${Wd} of ${toks.length})` : ""}; the full pattern (rows: queries, columns: keys) below` }));
        box.appendChild(line); box.appendChild(c);
        panel.appendChild(box);
      }
      panel.appendChild(L.legend("seq", 0, 1));
      S.atlasPanelMs = performance.now() - t0;
      panel.setAttribute("data-ms", String(S.atlasPanelMs));
    }
    for (const s of [xs, ys, filt]) s.addEventListener("change", () => { state[s.id] = s.value; L.writeHash(); drawScatter(); drawFinder(); });
    logY.addEventListener("change", () => { state["atlas-logy"] = logY.checked ? "1" : "0"; L.writeHash(); drawScatter(); });
    drawScatter(); drawFinder();
    S.atlasOpen = openHead;
    const h0 = parseInt(state.head, 10);
    if (Number.isFinite(h0) && h0 >= 0 && h0 < N) await openHead(h0);
  };
})();
