/* streetlamp report viewer: a long-context explain run (`explain --rows/--layers/--heads`). The folder keeps
 * chosen attention rows and the methods' rows over every token, never [layer, head, seq, seq]: the page shows
 * one row at a time over the whole text, its largest entries, and where the rest lives. */
(function () {
  "use strict";
  const S = window.streetlamp, L = S.lib, el = L.el, fmt = L.fmt, q = L.q, state = L.state;
  const TOP = 20;

  S.views.explain_long = async function (root) {
    const MAN = L.MAN, LONG = L.MODEL.long || {}, lc = MAN.long_context || {};
    const labels = MAN.token_labels || MAN.tokens || [], n = labels.length;
    const pos = (MAN.explained_position || {}).index;
    const methods = Object.keys(L.MODEL.arrays).filter((k) => k.endsWith(".tokens")).map((k) => k.slice(0, -".tokens".length));
    const layers = LONG.layers || [], heads = LONG.heads || [], rules = (lc.qk || {}).rules || {};
    const meaning = (name) => (((MAN.arrays || {})[name] || {}).meaning || "");

    const st = { what: null, l: null, r: 0, h: -1 };
    st.what = state.what === "attention" && layers.length ? "attention" : methods.includes(state.what) ? state.what : methods[0] || "attention";
    const lw = parseInt(state.l, 10);
    st.l = layers.includes(lw) ? lw : layers[layers.length - 1];
    const rowsOf = (l) => ((LONG.rows || {})[String(l)] || []);
    const rw = parseInt(state.r, 10), r0 = rowsOf(st.l);
    st.r = r0.includes(rw) ? rw : r0.includes(pos) ? pos : r0[0];
    st.h = L.sint("h", -1, -1, heads.length - 1);

    const tgt = MAN.target || {}, pred = MAN.prediction || {}, kept = lc.kept || {};
    root.appendChild(L.header("streetlamp explain (long context)", L.modelLine()));
    root.appendChild(el("div", { cls: "panel" },
      el("div", { cls: "kv" },
        el("div", { cls: "k", text: "tokens" }), el("div", { cls: "v", text: String(n) }),
        el("div", { cls: "k", text: "explained position" }), el("div", { cls: "v", text: `${pos} ${q(labels[pos])}` }),
        el("div", { cls: "k", text: "target" }), el("div", { cls: "v", text: `${q(tgt.label)} (${tgt.quantity || ""})` }),
        el("div", { cls: "k", text: "prediction" }), el("div", { cls: "v", text: `${q((MAN.prediction || {}).label || "")} p = ${fmt(pred.prob)}` }),
        el("div", { cls: "k", text: "kept" }), el("div", { cls: "v", text: `layers ${(kept.layers || []).join(", ")}; heads ${(kept.heads || []).join(", ")}; rows ${(kept.rows || []).join(", ")}` })),
      el("div", { cls: "note", text: "Only what the run kept is here: the full [layer, head, query, key] tensor was never made. Any other row or "
        + "column is exact from the stored queries and keys: streetlamp attention-row RUN --layer L --row N [--column]." })));

    const ctl = el("div", { cls: "controls" });
    const panel = el("div", { cls: "panel", id: "long-panel" });
    root.appendChild(el("div", { cls: "panel" }, ctl));
    root.appendChild(panel);

    function select(id, label, options, value, onchange) {
      const s = el("select", { id, "aria-label": label, onchange: () => onchange(s.value) },
        options.map(([v, t]) => el("option", { value: String(v), selected: String(v) === String(value) }, t)));
      return el("label", {}, label + " ", s);
    }
    function controls() {
      ctl.textContent = "";
      const whats = methods.map((m) => [m, m]);
      if (layers.length) whats.push(["attention", "attention row (kept)"]);
      ctl.appendChild(select("long-what", "show", whats, st.what, (v) => { st.what = v; draw(); }));
      if (st.what === "attention") {
        ctl.appendChild(select("long-layer", "layer", layers.map((l) => [l, String(l)]), st.l, (v) => {
          st.l = parseInt(v, 10); const rs = rowsOf(st.l); if (!rs.includes(st.r)) st.r = rs.includes(pos) ? pos : rs[0]; draw(); }));
        ctl.appendChild(select("long-row", "row (query)", rowsOf(st.l).map((r) => [r, `${r} ${q(labels[r])}`]), st.r, (v) => { st.r = parseInt(v, 10); draw(); }));
        ctl.appendChild(select("long-head", "head", [[-1, `mean over ${heads.length} kept heads`], ...heads.map((h, k) => [k, `head ${h}`])], st.h,
          (v) => { st.h = parseInt(v, 10); draw(); }));
      }
    }

    async function values() {
      if (st.what !== "attention") return { v: (await L.arr(st.what + ".tokens")).data, allowed: null,
        title: `${st.what} over the ${n} tokens`, note: meaning(st.what + ".tokens") };
      const rs = rowsOf(st.l), k = rs.indexOf(st.r), slab = await S.slab("rows.L" + st.l, k), nh = heads.length;
      let v;
      if (st.h >= 0) v = slab.subarray(st.h * n, (st.h + 1) * n);
      else { v = new Float32Array(n); for (let h = 0; h < nh; h++) for (let j = 0; j < n; j++) v[j] += slab[h * n + j] / nh; }
      const rule = rules[String(st.l)] || {};
      const allowed = (j) => (!rule.causal || j <= st.r) && (!rule.window || j > st.r - rule.window);
      const err = L.info("rows.L" + st.l).max_error;
      return { v, allowed, title: `layer ${st.l}, row ${st.r} ${q(labels[st.r])}, ${st.h < 0 ? `mean over ${nh} heads` : `head ${heads[st.h]}`}`,
        note: "attention weights of this query over every key" + (rule.window ? `; sliding window ${rule.window}` : "")
          + (err > 0 ? `; stored in this page at fixed point (±${fmt(err, 4)}); exact values in the run's attention/ shards` : "") };
    }

    let drawn = 0; // a newer selection wins over a draw still decoding its row
    async function draw() {
      const me = ++drawn;
      Object.assign(state, { view: "explain_long", what: st.what, l: st.l, r: st.r, h: st.h < 0 ? "mean" : st.h }); L.writeHash();
      controls();
      const { v, allowed, title, note } = await values();
      if (me !== drawn) return;
      let m = 0, signed = false;
      for (let j = 0; j < n; j++) { if (allowed && !allowed(j)) continue; m = Math.max(m, Math.abs(v[j])); if (v[j] < 0) signed = true; }
      m = m || 1e-12;
      const colour = (x) => (signed ? L.div(x, m) : L.seq(x / m));
      panel.textContent = "";
      panel.appendChild(el("h2", { text: title }));
      panel.appendChild(el("div", { cls: "note", text: note }));
      if (st.what !== "attention") { const r = L.readings(st.what, (MAN.arrays || {})[st.what + ".tokens"]); if (r) panel.appendChild(r); }
      panel.appendChild(signed ? L.legend("div", 0, m) : L.legend("seq", 0, m, el("span", { text: " (scaled to this row's largest value)" })));
      const readout = el("div", { cls: "readout", id: "long-value" }, "hover a token");
      const strip = el("div", { cls: "tokens", id: "long-tokens" });
      const frag = document.createDocumentFragment();
      for (let j = 0; j < n; j++) {
        const ok = !allowed || allowed(j), c = ok ? colour(v[j]) : L.FORBID;
        const s = el("span", { cls: "tok" + (j === pos ? " sel" : ""), "data-i": j, "data-value": ok ? String(v[j]) : null, text: labels[j] });
        s.style.background = L.css(c); s.style.color = L.ink(c);
        frag.appendChild(s);
      }
      strip.appendChild(frag);
      strip.addEventListener("mousemove", (ev) => {
        const t = ev.target.closest ? ev.target.closest(".tok") : null; if (!t) return;
        const j = parseInt(t.getAttribute("data-i"), 10), ok = !allowed || allowed(j);
        readout.textContent = `position ${j} ${q(labels[j])}: ${ok ? fmt(v[j]) : "masked (not visible from this query)"}`;
        readout.setAttribute("data-value", ok ? String(v[j]) : ""); L.showTip(ev, readout.textContent);
      });
      strip.addEventListener("mouseleave", L.hideTip);
      panel.appendChild(readout);
      panel.appendChild(strip);
      const order = []; for (let j = 0; j < n; j++) if (!allowed || allowed(j)) order.push(j);
      order.sort((a, b) => Math.abs(v[b]) - Math.abs(v[a]) || a - b);
      const top = order.slice(0, TOP).map((j, k) => [k + 1, j, labels[j], v[j]]);
      panel.appendChild(el("h2", { text: `largest ${top.length} of ${order.length} (by |value|)` }));
      panel.appendChild(L.table([{ title: "rank" }, { title: "position" }, { title: "token", text: true, fmt: (t) => q(t) }, { title: "value" }], top, { id: "long-top" }));
      const om = (LONG.omitted_rows || {})[String(st.l)];
      if (st.what === "attention" && om) panel.appendChild(el("div", { cls: "note", text: `${om} more kept row(s) of layer ${st.l} are in the run folder (this page embeds at most ${LONG.max_rows} per layer)` }));
      // what is drawn now (a selection redraws asynchronously: scripts and tests wait for this)
      panel.setAttribute("data-drawn", st.what === "attention" ? `attention|${st.l}|${st.r}|${st.h}` : st.what);
    }
    await draw();
  };
})();
