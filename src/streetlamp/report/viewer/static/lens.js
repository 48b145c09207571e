/* streetlamp report viewer: the lens view (`streetlamp lens`). Per layer, what the lens reads from the residual
 * at the explained position (its top tokens), and with --check what intervention says: the patched outcome
 * (the residual patched into a neutral context) or the token the residual promotes over a baseline (replaced
 * in the same prompt), the KL, the ranks of the target token, and a mark on every layer where the lens
 * disagrees with the intervention. Tokens come from the manifest's lens_view and are drawn as text
 * (textContent, canvas fillText); every number is a stored array (lens.*, check.*, check_baseline.*). Below it,
 * the generic view's panels (direct logit attribution, head types, figures, the manifest). */
(function () {
  "use strict";
  const S = window.streetlamp, L = S.lib, el = L.el, fmt = L.fmt, q = L.q;
  const V = S.views;
  const VERMILLION = "#d55e00", BLUE = "#0072b2", GREEN = "#009e73"; // Okabe-Ito
  const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);

  async function column(name, pos, width) { // one column of a [row, pos] array, or one [row] array
    if (!L.has(name)) return null;
    const a = await L.arr(name);
    if (a.shape.length === 1) return Array.from(a.data);
    const n = a.shape[1], out = [];
    for (let r = 0; r < a.shape[0]; r++) out.push(a.data[r * n * (width || 1) + pos * (width || 1)]);
    return out;
  }

  // what one variant of the check says per layer, from the stored arrays and the manifest's labels
  async function rowsOf(lv, variant) {
    const n = lv.layers.length, rows = [];
    const lensTop = lv.lens_top, k = lv.top_k, pos = lv.position;
    const topP = L.has("lens.top_prob") ? await L.arr("lens.top_prob") : null, npos = topP ? topP.shape[1] : 0;
    const pT = await column("lens.prob", pos), rankT = await column("lens.rank", pos);
    let c = {};
    if (variant === "patch") c = { kl: await column("check.kl"), match: await column("check.top1_match"),
      rl: await column("check.rank_lens"), ro: await column("check.rank_patched") };
    if (variant === "baseline") c = { kl: await column("check_baseline.kl_model"), klLens: await column("check_baseline.kl_lens"),
      match: await column("check_baseline.top1_match"), rl: await column("check_baseline.rank_lens"), ro: await column("check_baseline.rank_model") };
    const meta = lv[variant] || {};
    for (let r = 0; r < n; r++) {
      const probs = []; for (let j = 0; j < k; j++) probs.push(topP ? topP.data[(r * npos + pos) * topP.shape[2] + j] : NaN);
      const row = { row: r, layer: lv.layers[r], lens_top: lensTop[r], lens_top_prob: probs, p_target: pT ? pT[r] : NaN, rank_target: rankT ? rankT[r] : NaN };
      if (c.kl) Object.assign(row, { check_lens_top: meta.lens_top[r], outcome_top: meta.outcome_top[r], kl: c.kl[r],
        kl_lens: c.klLens ? c.klLens[r] : null, rank_lens: c.rl[r], rank_outcome: c.ro[r], match: c.match[r] > 0.5, disagrees: !(c.match[r] > 0.5) });
      rows.push(row);
    }
    return rows;
  }

  function words(variant) {
    return variant === "baseline"
      ? { lens: "lens: most promoted over the baseline", outcome: "model: most promoted", kl: "KL(prompt ‖ replaced)", ro: "rank (model)", both: "most promoted: lens / model" }
      : { lens: "lens top", outcome: "patched outcome", kl: "KL(patched ‖ lens)", ro: "rank (patched)" };
  }

  // the layer strip: one line per layer, the disagreeing layers banded and marked
  function strip(canvas, rows, variant, target) {
    const checked = rows.length && rows[0].kl !== undefined, w = words(variant);
    const rowH = 20, top = 40, cols = checked ? [8, 66, 420, 600, 790, 960] : [8, 66, 420];
    const heads = checked ? ["layer", "lens readout: top tokens (p)", w.both || w.outcome, w.kl, `rank of ${q(target)}: lens / ${w.ro.slice(6, -1)}`, "vs intervention"]
      : ["layer", "lens readout: top tokens (p)", `p(${q(target)}), rank`];
    // a long target token widens its header: push the columns after it right so no header overlaps the next
    const m = document.createElement("canvas").getContext("2d"); m.font = "bold 12px sans-serif";
    for (let i = 1; i < cols.length; i++) cols[i] = Math.max(cols[i], cols[i - 1] + m.measureText(heads[i - 1]).width + 14);
    const W = cols[cols.length - 1] + (checked ? 120 : 200), H = top + Math.max(0, rows.length - 1) * rowH + 12;
    canvas.width = W; canvas.height = H;
    const g = canvas.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, W, H);
    g.font = "bold 12px sans-serif"; g.fillStyle = "#222";
    heads.forEach((h, i) => g.fillText(h, cols[i], 16));
    let klMax = 1e-12; for (const r of rows) if (Number.isFinite(r.kl)) klMax = Math.max(klMax, r.kl);
    g.font = "12px ui-monospace, Menlo, Consolas, monospace";
    rows.forEach((r, i) => {
      const y = top + i * rowH;
      if (r.disagrees) { g.fillStyle = "rgba(213,94,0,0.16)"; g.fillRect(0, y - 14, W, rowH); g.fillStyle = VERMILLION; g.fillRect(0, y - 14, 4, rowH); }
      g.fillStyle = "#222";
      g.fillText(String(r.layer), cols[0] + 4, y);
      g.fillText(clip(r.lens_top.slice(0, 3).map((t, j) => `${q(t)} ${fmt(r.lens_top_prob[j], 2)}`).join("  "), 52), cols[1], y);
      if (!checked) { g.fillText(`${fmt(r.p_target, 3)}, ${fmt(r.rank_target)}`, cols[2], y); return; }
      g.fillText(clip(variant === "baseline" ? `${q(r.check_lens_top)} / ${q(r.outcome_top)}` : q(r.outcome_top), 26), cols[2], y);
      const bw = 120 * (Number.isFinite(r.kl) ? r.kl / klMax : 0);
      g.fillStyle = r.disagrees ? VERMILLION : BLUE; g.fillRect(cols[3], y - 10, bw, 11);
      g.fillStyle = "#222"; g.fillText(fmt(r.kl, 3), cols[3] + bw + 4, y);
      g.fillText(`${fmt(r.rank_lens)} / ${fmt(r.rank_outcome)}`, cols[4], y);
      g.fillStyle = r.disagrees ? VERMILLION : GREEN; g.font = "bold 12px sans-serif";
      g.fillText(r.disagrees ? "✗ DISAGREES" : "✓ agrees", cols[5], y);
      g.font = "12px ui-monospace, Menlo, Consolas, monospace";
    });
  }

  function table(rows, variant, target) {
    const w = words(variant), checked = rows.length && rows[0].kl !== undefined;
    const heads = ["layer", "lens readout (top tokens)", `p(${q(target)})`, `rank of ${q(target)} (readout)`];
    if (checked) heads.push(w.lens, w.outcome, "top-1 match", w.kl, ...(variant === "baseline" ? ["KL(lens ‖ lens of baseline)"] : []),
      `rank of ${q(target)} (lens)`, `rank of ${q(target)} (${w.ro.slice(6, -1)})`, "vs intervention");
    const tbody = el("tbody");
    const num = (v, d) => el("td", { "data-value": String(v), text: fmt(v, d) });
    const txt = (v, cls) => el("td", { cls: "t" + (cls ? " " + cls : ""), text: v });
    for (const r of rows) {
      const tr = el("tr", { "data-layer": r.layer, "data-row": r.row, "data-disagrees": checked ? (r.disagrees ? "1" : "0") : null,
        style: r.disagrees ? "background:rgba(213,94,0,0.16);box-shadow:inset 4px 0 0 #d55e00" : null },
      txt(String(r.layer)), txt(r.lens_top.map(q).join(" "), "lens-tokens"), num(r.p_target), num(r.rank_target));
      if (checked) {
        tr.appendChild(txt(q(r.check_lens_top), "lens-says")); tr.appendChild(txt(q(r.outcome_top), "outcome"));
        tr.appendChild(el("td", { text: r.match ? "yes" : "no" })); tr.appendChild(num(r.kl));
        if (variant === "baseline") tr.appendChild(num(r.kl_lens));
        tr.appendChild(num(r.rank_lens)); tr.appendChild(num(r.rank_outcome));
        tr.appendChild(el("td", { cls: "mark", style: `font-weight:bold;color:${r.disagrees ? VERMILLION : GREEN}`, text: r.disagrees ? "✗ DISAGREES" : "✓ agrees" }));
      }
      tbody.appendChild(tr);
    }
    return el("div", { cls: "scroll", style: "max-height:none" }, el("table", { id: "lens-table" },
      el("thead", {}, el("tr", {}, heads.map((h) => el("th", { cls: "t", text: h })))), tbody));
  }

  V.lens = async function (root) {
    const MAN = L.MAN, lv = MAN.lens_view, P = MAN.parameters || {};
    if (!lv) { await V.generic(root); return; } // a folder written before the lens view
    const target = lv.target.label, variants = lv.variants || [];
    root.appendChild(L.header("streetlamp lens", L.modelLine()));
    root.appendChild(el("p", { cls: "sub", text: `${lv.kind} lens of ${q(P.text || "")}, at the last position ${lv.position} (${q(lv.position_label)}); target ${q(target)}` }));
    let variant = variants.includes(L.state.variant) ? L.state.variant : variants[0] || null;
    const sel = el("select", { id: "lens-variant", "aria-label": "check" }, variants.map((v) => el("option", { value: v, text: v === "patch" ? "patched into the neutral context" : "replaced by a baseline in the prompt" })));
    if (variant) sel.value = variant;
    const canvas = el("canvas", { id: "lens-strip" }), summary = el("div", { id: "lens-summary" }), tableBox = el("div", {});
    const how = el("div", { cls: "note", id: "lens-how" });
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: `What each layer will make the model say: the ${lv.kind} lens${variant ? " against intervention" : ""}` }),
      variants.length > 1 ? el("div", { cls: "controls" }, el("label", {}, "check: ", sel)) : null, summary, how,
      el("div", { cls: "scroll", style: "max-height:none" }, canvas),
      L.exportButtons(() => canvas, "lens_layers", () => `${lv.kind} lens per layer${variant ? ", checked: " + variant : ""}`), tableBox));
    const curves = el("div", {});
    root.appendChild(curves);

    async function draw() {
      const rows = await rowsOf(lv, variant);
      strip(canvas, rows, variant, target);
      tableBox.textContent = ""; tableBox.appendChild(table(rows, variant, target));
      const bad = rows.filter((r) => r.disagrees).map((r) => r.layer);
      canvas.setAttribute("data-disagrees", bad.join(","));
      summary.textContent = "";
      if (!variant) {
        summary.appendChild(el("div", { cls: "note", text: "not checked against intervention: run streetlamp lens with --check (or --check-variant baseline|both) to see where the lens disagrees" }));
      } else {
        summary.appendChild(el("div", { cls: bad.length ? "warn" : "ok", id: "lens-verdict",
          text: `${bad.length} of ${rows.length} layers disagree with the intervention${bad.length ? ": " + bad.join(", ") : ""}` }));
        const meta = lv[variant];
        how.textContent = variant === "patch"
          ? `patch: each layer's residual at the explained position is put into the neutral context ${JSON.stringify(meta.neutral)} at the same layer and the rest of the model runs; a layer disagrees when the lens's top token is not the patched run's top token (${meta.file})`
          : `baseline (${meta.baseline}): each layer's residual at the explained position is replaced by the baseline in the same prompt; the lens's and the model's change of log-probability are compared; a layer disagrees when the token the residual promotes most differs (${meta.file})`;
      }
      S.lensView = { variant, rows, disagreeing: bad };
      canvas.setAttribute("data-variant", variant || "");  // tests wait on it (the CSP forbids wait_for_function's eval)
      curves.textContent = "";
      const x = rows.map((r) => r.row), series = [];
      if (variant) series.push({ name: words(variant).kl, x, y: rows.map((r) => r.kl) });
      if (variant === "baseline") series.push({ name: "KL(lens ‖ lens of baseline)", x, y: rows.map((r) => r.kl_lens) });
      if (series.length) curves.appendChild(L.lines("lens-kl", series, { title: "KL per layer (x: 0 = embedding, l + 1 = after layer l)", xTitle: "layer row", yTitle: "nats" }));
      const lp = await column("lens.logprob", lv.position);
      if (lp) curves.appendChild(L.lines("lens-logprob", [{ name: `log p(${q(target)})`, x, y: lp }], { title: `The lens's log p(${q(target)}) per layer`, xTitle: "layer row", yTitle: "log p" }));
    }
    sel.addEventListener("change", async () => { variant = sel.value; L.state.variant = variant; L.writeHash(); await draw(); });
    await draw();
    const rest = el("div", { cls: "panel" }, el("h2", { text: "Everything else the run stored" }));
    root.appendChild(rest);
    await V.generic(rest);
  };
})();
