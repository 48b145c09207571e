/* streetlamp report viewer: the explain view (seed 003, made interactive). */
(function () {
  "use strict";
  const S = window.streetlamp, L = S.lib, el = L.el, fmt = L.fmt, q = L.q, state = L.state;
  const JSD_WARN = 0.1; // bits: the head mean is flagged when heads' rows differ by this much on average
  const SINK = 0.3; // a key receiving at least this share of the attention (mean over queries) is marked a sink
  const SPECIAL_RE = /^(\[(CLS|SEP|PAD|MASK|UNK|BOS|EOS)\]|<\/?s>|<pad>|<unk>|<mask>|<\|[^|]*\|>)$/i;

  S.views.explain = async function (root) {
    const MAN = L.MAN;
    const labels = MAN.token_labels || MAN.tokens, toks = MAN.tokens || labels, n = labels.length;
    const ainfo = L.info("attention"), [NL, NH] = ainfo.shape, err = ainfo.max_error;
    const allowed = (await L.arr("allowed")).data;
    const pos = (MAN.explained_position || {}).index || 0;
    const special = new Set(MAN.special_positions || toks.map((t, i) => (SPECIAL_RE.test(t) ? i : -1)).filter((i) => i >= 0));
    const methods = Object.keys(MAN.methods || {}).filter((m) => L.has(m + ".tokens"));
    for (const k of Object.keys(L.MODEL.arrays)) { const m = k.replace(/\.tokens$/, ""); if (k.endsWith(".tokens") && !methods.includes(m)) methods.push(m); }
    const P = MAN.parameters || {};
    const st = {
      l: L.sint("l", P.layer !== null && P.layer !== undefined ? P.layer : NL - 1, 0, NL - 1),
      h: state.h === "mean" ? -1 : L.sint("h", P.head !== null && P.head !== undefined ? P.head : -1, -1, NH - 1),
      t: L.sint("t", pos, 0, n - 1), mode: state.mode === "col" ? "col" : "row", lock: state.lock === "1",
      hide: state.hide !== "0", rescale: state.rescale === "1",
    };
    let saveTimer = 0; // the fragment is written once the pointer rests (browsers throttle history.replaceState)
    const save = (later) => { Object.assign(state, { view: "explain", l: st.l, h: st.h < 0 ? "mean" : st.h, t: st.t, mode: st.mode, lock: st.lock ? 1 : 0, hide: st.hide ? 1 : 0, rescale: st.rescale ? 1 : 0 });
      clearTimeout(saveTimer); if (later) saveTimer = setTimeout(L.writeHash, 150); else L.writeHash(); };
    const headName = (h) => (h < 0 ? `mean over ${NH} heads` : `head ${h}`);
    const errNote = err > 0 ? ` (stored at ${{ u16: 16, u12: 12, u8: 8 }[ainfo.codec]}-bit precision in this page: ±${fmt(err, 4)}; exact values in arrays.safetensors)` : "";
    const ok = (i, j) => allowed[i * n + j] > 0;
    const dec = err > 5e-5 ? 3 : 4, fv = (v) => (Number.isFinite(v) ? v.toFixed(dec) : fmt(v)); // no digits beyond the stored precision

    const BG = [], FG = []; // the sequential palette (and the mask's grey, index 256) as CSS colours, text ink to match
    for (let k = 0; k <= 256; k++) { const c = k < 256 ? L.seq(k / 255) : L.FORBID; BG.push(L.css(c)); FG.push(L.ink(c)); }

    // layers decoded on demand; head means cached
    const means = new Map();
    async function layer(l) { return S.slab("attention", l); }
    async function mean(l) {
      if (means.has(l)) return means.get(l);
      const a = await layer(l), m = new Float32Array(n * n);
      for (let h = 0; h < NH; h++) { const o = h * n * n; for (let k = 0; k < n * n; k++) m[k] += a[o + k]; }
      for (let k = 0; k < n * n; k++) m[k] /= NH;
      if (means.size > 4) means.delete(means.keys().next().value);
      means.set(l, m); return m;
    }
    async function matrix(l, h) { if (h < 0) return mean(l); const a = await layer(l); return a.subarray(h * n * n, (h + 1) * n * n); }

    // sinks: keys receiving >= SINK of the attention on average, in the selected layer/head
    function sinks(m) {
      const out = new Set();
      for (let j = 0; j < n; j++) { let s = 0, c = 0; for (let i = 0; i < n; i++) if (ok(i, j)) { s += m[i * n + j]; c++; } if (c && s / c >= SINK) out.add(j); }
      return out;
    }

    // ---- header and controls ----
    const tgt = MAN.target || {}, pred = MAN.prediction || {};
    root.appendChild(L.header("streetlamp explain", L.modelLine()));
    root.appendChild(el("div", { cls: "panel" },
      el("div", { cls: "kv" },
        el("div", { cls: "k", text: "text" }), el("div", { cls: "v", id: "text", text: MAN.text || "" }),
        el("div", { cls: "k", text: "prediction" }), el("div", { cls: "v", text: `${q(pred.label)} (p = ${fmt(pred.prob)})` }),
        el("div", { cls: "k", text: "explained quantity" }), el("div", { cls: "v", id: "quantity", text: `${tgt.explained || ""} (${tgt.chosen || ""} target)` }),
        el("div", { cls: "k", text: "explained position" }), el("div", { cls: "v", text: `${q(labels[pos])} at position ${pos}: ${(MAN.explained_position || {}).why || ""}` }),
        el("div", { cls: "k", text: "tokens" }), el("div", { cls: "v", text: `${n}${MAN.truncated ? " (text truncated to the model's positions)" : ""}` }))));
    const layerSel = el("select", { id: "layer", "aria-label": "layer" }, Array.from({ length: NL }, (_, l) => el("option", { value: l, text: `layer ${l}` })));
    const headSel = el("select", { id: "head", "aria-label": "head" }, el("option", { value: -1, text: `mean over ${NH} heads` }),
      Array.from({ length: NH }, (_, h) => el("option", { value: h, text: `head ${h}` })));
    const rowBtn = el("button", { id: "mode-row", text: "query row: what it reads", onclick: () => { st.mode = "row"; refresh(); } });
    const colBtn = el("button", { id: "mode-col", text: "key column: who reads it", onclick: () => { st.mode = "col"; refresh(); } });
    const hideBox = el("input", { type: "checkbox", id: "hide-special" });
    const rescaleBox = el("input", { type: "checkbox", id: "rescale" });
    layerSel.value = st.l; headSel.value = st.h; hideBox.checked = st.hide; rescaleBox.checked = st.rescale;
    layerSel.addEventListener("change", () => { st.l = +layerSel.value; redraw(); });
    headSel.addEventListener("change", () => { st.h = +headSel.value; redraw(); });
    hideBox.addEventListener("change", () => { st.hide = hideBox.checked; refresh(); compare(); });
    rescaleBox.addEventListener("change", () => { st.rescale = rescaleBox.checked; redraw(); });
    root.appendChild(el("div", { cls: "controls panel" }, layerSel, headSel, rowBtn, colBtn,
      el("label", {}, hideBox, " hide special tokens ([CLS], [SEP], BOS ...) and sinks"),
      el("label", {}, rescaleBox, " rescale each matrix row to its own max (colours only)")));

    // ---- token strip ----
    const strip = el("div", { cls: "tokens", id: "tokens", tabindex: 0, role: "listbox", "aria-label": "tokens: arrow keys move, Enter locks, Escape unlocks" });
    const spans = labels.map((t, i) => {
      const s = el("span", { cls: "tok" + (special.has(i) ? " special" : ""), "data-i": i, role: "option", title: `position ${i}${special.has(i) ? " (special token)" : ""}` }, t);
      s.addEventListener("mouseenter", () => { if (!st.lock && st.t !== i) { st.t = i; refresh(true); } });
      s.addEventListener("click", () => { if (st.lock && st.t === i) st.lock = false; else { st.t = i; st.lock = true; } refresh(); compareRowHighlight(); });
      strip.appendChild(s); return s;
    });
    strip.addEventListener("keydown", (ev) => {
      const vis = (i) => !(st.hide && hidden(i));
      let t = st.t;
      if (ev.key === "ArrowRight" || ev.key === "ArrowDown") { do t++; while (t < n && !vis(t)); }
      else if (ev.key === "ArrowLeft" || ev.key === "ArrowUp") { do t--; while (t >= 0 && !vis(t)); }
      else if (ev.key === "Home") t = 0; else if (ev.key === "End") t = n - 1;
      else if (ev.key === "Enter" || ev.key === " ") { st.lock = !st.lock; refresh(); ev.preventDefault(); return; }
      else if (ev.key === "Escape") { st.lock = false; refresh(); return; } else return;
      ev.preventDefault(); if (t >= 0 && t < n) { st.t = t; st.lock = true; refresh(); spans[t].scrollIntoView({ block: "nearest" }); }
    });
    const selLine = el("div", { cls: "readout", id: "selection" });
    const tokLegend = el("div", {}, L.legend("seq", 0, 1, L.hatchLegend()));
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Tokens" }),
      el("div", { cls: "note", text: "hover a token to see its query row (what it reads) or key column (who reads it) in the selected layer and head; click to lock; arrow keys move; dashed border: special token; dotted underline: attention sink (receives ≥ 30% of the attention on average in this layer/head)" }),
      strip, selLine, tokLegend));

    // ---- raw numbers + head disagreement ----
    // the raw numbers: a virtual list (only the rows in view exist), so a 1,024-token text costs what 30 rows cost
    const ROW_H = 21, BOX_H = 360, rawBody = el("tbody"), rawBox = el("div", { cls: "scroll", id: "raw-box", style: `height:${BOX_H}px` });
    let rawVals = null, rawOk = null, rawKeys = []; // the values shown, which are allowed, and which keys are listed
    function drawRaw() {
      const first = Math.max(0, Math.floor(rawBox.scrollTop / ROW_H) - 4), last = Math.min(rawKeys.length, first + Math.ceil(BOX_H / ROW_H) + 8);
      rawBody.textContent = "";
      rawBody.appendChild(el("tr", { cls: "pad", style: `height:${first * ROW_H}px` }, el("td", { colspan: 3 })));
      for (let k = first; k < last; k++) {
        const j = rawKeys[k], ok_ = rawOk(j);
        rawBody.appendChild(el("tr", { "data-j": j, cls: j === st.t ? "hl" : null }, el("td", { text: j }), el("td", { cls: "t", text: labels[j] }),
          el("td", { cls: "val", "data-value": ok_ ? String(rawVals[j]) : "", text: ok_ ? fv(rawVals[j]) : "masked" })));
      }
      rawBody.appendChild(el("tr", { cls: "pad", style: `height:${(rawKeys.length - last) * ROW_H}px` }, el("td", { colspan: 3 })));
    }
    rawBox.appendChild(el("table", { id: "raw" }, el("thead", {}, el("tr", {}, el("th", { text: "pos" }), el("th", { cls: "t", text: "token" }), el("th", { text: "attention" }))), rawBody));
    let scrollFrame = 0;
    rawBox.addEventListener("scroll", () => { if (!scrollFrame) scrollFrame = requestAnimationFrame(() => { scrollFrame = 0; drawRaw(); }); });
    const rawTitle = el("h2", {});
    const hiddenNote = el("div", { cls: "note", id: "hidden-keys" });
    const jsdBox = el("div", { id: "disagreement" });
    root.appendChild(el("div", { cls: "row" },
      el("div", { cls: "panel", style: "flex:1 1 340px" }, rawTitle, el("div", { cls: "note", text: "raw stored attention probabilities" + errNote }),
        rawBox, hiddenNote),
      el("div", { cls: "panel", style: "flex:1 1 420px" }, el("h2", { text: "What the head mean hides" }), jsdBox)));

    // ---- grid of thumbnails ----
    const T = 60, blk = Math.max(1, Math.ceil(n / T)), tn = Math.ceil(n / blk), tsz = tn * Math.max(1, Math.floor(T / tn));
    const grid = el("div", { cls: "grid", id: "grid", style: `grid-template-columns: 52px repeat(${NH + 1}, ${tsz + 2}px)` });
    grid.appendChild(el("div", {}));
    for (let h = 0; h < NH; h++) grid.appendChild(el("div", { cls: "lab", text: `head ${h}` }));
    grid.appendChild(el("div", { cls: "lab", text: "mean" }));
    const thumbs = [];
    for (let l = 0; l < NL; l++) {
      grid.appendChild(el("div", { cls: "lab", text: `layer ${l}` }));
      const row = [];
      for (let h = 0; h <= NH; h++) {
        const hh = h === NH ? -1 : h;
        const c = el("canvas", { cls: "thumb", width: tsz, height: tsz, "data-l": l, "data-h": hh, title: `layer ${l}, ${headName(hh)}: click for the full matrix` });
        c.addEventListener("click", () => { st.l = l; st.h = hh; layerSel.value = l; headSel.value = hh; redraw(); $m.scrollIntoView({ block: "nearest" }); });
        grid.appendChild(c); row.push(c);
      }
      thumbs.push(row);
    }
    async function drawThumbs(l) {
      const row = thumbs[l]; if (row[0].dataset.drawn) return; row[0].dataset.drawn = "1";
      const a = await layer(l), m = await mean(l), cell = tsz / tn;
      for (let h = 0; h <= NH; h++) {
        const src = h === NH ? m : a.subarray(h * n * n, (h + 1) * n * n);
        L.paint(row[h], tn, tn, (bi, bj) => { // block maximum over allowed cells (exact cell when blk = 1)
          let v = 0; for (let i = bi * blk; i < Math.min(n, (bi + 1) * blk); i++) for (let j = bj * blk; j < Math.min(n, (bj + 1) * blk); j++) if (ok(i, j) && src[i * n + j] > v) v = src[i * n + j];
          return v;
        }, L.seq, (bi, bj) => { for (let i = bi * blk; i < Math.min(n, (bi + 1) * blk); i++) for (let j = bj * blk; j < Math.min(n, (bj + 1) * blk); j++) if (ok(i, j)) return true; return false; }, cell, cell);
        row[h].dataset.drawn = "1";
      }
    }
    const io = new IntersectionObserver((es) => { for (const e of es) if (e.isIntersecting) drawThumbs(+e.target.dataset.l); }, { rootMargin: "200px" });
    thumbs.forEach((r) => io.observe(r[0]));
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Every layer and head" }),
      el("div", { cls: "note", text: `one fixed 0..1 scale for every thumbnail (the PNGs' scale); rows: query, columns: key; ${blk > 1 ? `each pixel is the maximum of a ${blk} x ${blk} block of cells` : "one pixel per cell"}; a layer is decoded when it scrolls into view; click a thumbnail for its full matrix` }),
      L.legend("seq", 0, 1, L.hatchLegend()), el("div", { cls: "scroll", style: "max-height:520px" }, grid),
      L.exportButtons(gridCanvas, "attention_grid", () => `${L.modelLine()}: attention, every layer x head (rows: query, columns: key)`)));
    function gridCanvas() {
      const pad = 4, c = el("canvas", { width: (NH + 1) * (tsz + pad), height: NL * (tsz + pad) }), g = c.getContext("2d");
      g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
      thumbs.forEach((r, l) => r.forEach((t, h) => g.drawImage(t, h * (tsz + pad), l * (tsz + pad))));
      return c;
    }

    // ---- full matrix ----
    const cs = Math.max(1, Math.min(16, Math.floor(640 / n))), lab = n <= 64, M0 = lab ? 96 : 40;
    const W = M0 + n * cs + 8, H = M0 + n * cs + 8;
    const $m = el("canvas", { id: "matrix", width: W, height: H, style: "position:absolute;left:0;top:0" });
    const over = el("canvas", { width: W, height: H, style: "position:absolute;left:0;top:0;pointer-events:none" });
    const mTitle = el("h2", { id: "matrix-title" });
    const cellOut = el("div", { cls: "readout", id: "cellvalue" }, "point at a cell");
    root.appendChild(el("div", { cls: "panel" }, mTitle,
      el("div", { style: `position:relative;width:${W}px;height:${H}px` }, $m, over),
      cellOut, el("div", { id: "matrix-legend" }), L.exportButtons(() => $m, "attention_matrix", () => mTitle.textContent)));
    let cur = null, curMax = null;
    async function drawMatrix() { // a newer selection wins over a draw still decoding; #matrix says what it drew
      const l = st.l, h = st.h, m = await matrix(l, h);
      if (l !== st.l || h !== st.h) return;
      cur = m;
      curMax = new Float32Array(n); for (let i = 0; i < n; i++) { let x = 0; for (let j = 0; j < n; j++) if (m[i * n + j] > x) x = m[i * n + j]; curMax[i] = x || 1; }
      const g = $m.getContext("2d"); g.fillStyle = "#fff"; g.fillRect(0, 0, W, H);
      const sub = el("canvas", { width: n * cs, height: n * cs });
      L.paint(sub, n, n, (i, j) => (st.rescale ? m[i * n + j] / curMax[i] : m[i * n + j]), L.seq, ok, cs, cs);
      g.drawImage(sub, M0, M0);
      g.fillStyle = "#222"; g.font = "12px sans-serif";
      g.fillText("Key columns (attended-to token) →", M0, 12);
      g.save(); g.translate(12, M0 + 230); g.rotate(-Math.PI / 2); g.fillText("Query rows (attending token) →", 0, 0); g.restore();
      g.font = `${Math.min(11, cs + 2)}px monospace`;
      if (lab) {
        for (let j = 0; j < n; j++) { g.save(); g.translate(M0 + j * cs + cs * 0.75, M0 - 3); g.rotate(-Math.PI / 2); g.fillText(labels[j].slice(0, 11), 0, 0); g.restore(); }
        for (let i = 0; i < n; i++) g.fillText(labels[i].slice(0, 9), 18, M0 + i * cs + cs * 0.8);
      } else {
        const step = Math.pow(10, Math.ceil(Math.log10(n / 8)));
        for (let k = 0; k < n; k += step) { g.fillText(String(k), M0 + k * cs, M0 - 4); g.fillText(String(k), 16, M0 + k * cs + 8); }
      }
      mTitle.textContent = `layer ${l}, ${headName(h)}: attention probabilities`;
      $m.dataset.drawn = `${l}:${h}`;
      const lg = document.getElementById("matrix-legend"); lg.textContent = "";
      lg.appendChild(L.legend("seq", 0, 1, L.hatchLegend()));
      lg.appendChild(el("div", { cls: st.rescale ? "warn" : "note", id: "scale-note", text: st.rescale ? "colours: each row rescaled to its own maximum (not comparable across rows); the numbers shown stay raw" : "colours: raw probabilities on the fixed 0..1 scale" }));
      drawOverlay();
    }
    function drawOverlay() {
      const g = over.getContext("2d"); g.clearRect(0, 0, W, H); g.strokeStyle = "#e66100"; g.lineWidth = 2;
      if (st.mode === "row") g.strokeRect(M0 - 1, M0 + st.t * cs - 1, n * cs + 2, cs + 2); else g.strokeRect(M0 + st.t * cs - 1, M0 - 1, cs + 2, n * cs + 2);
    }
    $m.addEventListener("mousemove", (ev) => {
      if (!cur) return; const r = $m.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left - M0) / cs), i = Math.floor((ev.clientY - r.top - M0) / cs);
      if (i < 0 || j < 0 || i >= n || j >= n) return;
      const v = cur[i * n + j];
      cellOut.textContent = `Query row ${i} ${q(labels[i])} → Key column ${j} ${q(labels[j])}: ` + (ok(i, j) ? fv(v) : "forbidden by the mask");
      cellOut.dataset.i = i; cellOut.dataset.j = j; cellOut.dataset.value = ok(i, j) ? String(v) : "";
    });
    $m.addEventListener("click", (ev) => { const r = $m.getBoundingClientRect(); const i = Math.floor((ev.clientY - r.top - M0) / cs), j = Math.floor((ev.clientX - r.left - M0) / cs);
      if (i >= 0 && i < n && j >= 0 && j < n) { st.t = st.mode === "row" ? i : j; st.lock = true; refresh(); } });

    // ---- light versus use ----
    const cmpBox = el("div", { id: "compare" });
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Where the light is versus what the model uses" }), cmpBox));
    const figs = L.figures(); if (figs) root.appendChild(figs); // an image model's overlay (drawn over the picture)

    // hidden when "hide" is on: special tokens and sinks; the explained position stays in the strip (it is the
    // query the methods explain) but leaves the key lists like any other special token
    function hiddenKey(i) { return special.has(i) || curSinks.has(i); }
    function hidden(i) { return hiddenKey(i) && i !== pos; }
    let curSinks = new Set();
    let shown = { t: -1, lock: false, sinks: null, hide: null, mode: null, cur: null }; // what the strip and table show now

    function refresh(hover) { // selection changed: strip, numbers, disagreement, overlay (only what changed is touched)
      if (!cur) return;
      rowBtn.setAttribute("aria-pressed", st.mode === "row"); colBtn.setAttribute("aria-pressed", st.mode === "col");
      const t = st.t, vals = new Float32Array(n);
      for (let j = 0; j < n; j++) vals[j] = st.mode === "row" ? cur[t * n + j] : cur[j * n + t];
      const okv = (j) => (st.mode === "row" ? ok(t, j) : ok(j, t));
      const sameRow = shown.t === t && shown.mode === st.mode && shown.cur === cur;
      const layout = shown.sinks !== curSinks || shown.hide !== st.hide; // which tokens are hidden
      if (layout) spans.forEach((s, j) => { s.classList.toggle("sink", curSinks.has(j)); s.classList.toggle("hidden", st.hide && hidden(j)); });
      if (!sameRow) spans.forEach((s, j) => { // 257 colour strings made once; a span is touched only when its colour changes
        const k = okv(j) ? Math.max(0, Math.min(255, Math.round(vals[j] * 255))) : 256;
        if (s._c !== k) { s._c = k; s.style.background = BG[k]; s.style.color = FG[k]; }
      });
      if (shown.t !== t || shown.lock !== st.lock) {
        if (shown.t >= 0) spans[shown.t].classList.remove("sel", "lock");
        spans[t].classList.add("sel"); spans[t].classList.toggle("lock", st.lock);
      }
      const what = st.mode === "row" ? `Query row ${t} ${q(labels[t])}: what it reads` : `Key column ${t} ${q(labels[t])}: who reads it`;
      selLine.textContent = `${what} in layer ${st.l}, ${headName(st.h)}${st.lock ? " (locked; click again or Escape to unlock)" : ""}`;
      rawTitle.textContent = st.mode === "row" ? `Row ${t} ${q(labels[t])}: attention to each key` : `Column ${t} ${q(labels[t])}: attention from each query`;
      if (layout) { rawKeys = []; for (let j = 0; j < n; j++) if (!(st.hide && hiddenKey(j))) rawKeys.push(j); }
      rawVals = vals; rawOk = okv; drawRaw();
      if (!sameRow || layout) { // nothing is lost by hiding: the hidden keys and their attention, in one line
        const hid = []; for (let j = 0; j < n; j++) if (st.hide && hiddenKey(j)) hid.push(`${q(labels[j])}@${j} ${okv(j) ? fv(vals[j]) : "masked"}`);
        hiddenNote.textContent = hid.length ? `hidden (special tokens and sinks; untick "hide" to list them): ${hid.slice(0, 12).join(", ")}${hid.length > 12 ? ` and ${hid.length - 12} more` : ""}` : "";
      }
      shown = { t, lock: st.lock, sinks: curSinks, hide: st.hide, mode: st.mode, cur };
      disagreement(); drawOverlay(); save(hover);
    }

    async function disagreement() {
      const a = await layer(st.l), t = st.t, keys = [];
      for (let j = 0; j < n; j++) if (ok(t, j)) keys.push(j);
      const rows = []; for (let h = 0; h < NH; h++) rows.push(keys.map((j) => a[h * n * n + t * n + j]));
      const per = new Array(NH).fill(0); let tot = 0, pairs = 0;
      for (let x = 0; x < NH; x++) for (let y = x + 1; y < NH; y++) { const d = L.jsd(rows[x], rows[y]); per[x] += d; per[y] += d; tot += d; pairs++; }
      const mj = pairs ? tot / pairs : 0; for (let h = 0; h < NH; h++) per[h] /= Math.max(1, NH - 1);
      jsdBox.textContent = "";
      jsdBox.appendChild(el("div", {}, `Layer ${st.l}, query ${t} ${q(labels[t])}: mean pairwise Jensen–Shannon divergence between the ${NH} heads' rows = `,
        el("b", { id: "jsd", "data-value": String(mj), text: fmt(mj) }), " bits (0 = identical rows, 1 = disjoint)."));
      const order = per.map((v, h) => h).sort((x, y) => per[y] - per[x]);
      const dis = order.filter((h) => per[h] >= JSD_WARN);
      if (mj >= JSD_WARN) jsdBox.appendChild(el("div", { cls: "warn", id: "jsd-warning", text: `Averaging hides disagreeing heads (mean JSD ≥ ${JSD_WARN} bits): heads ${dis.join(", ")} read different tokens; look at them one by one.` }));
      else jsdBox.appendChild(el("div", { cls: "ok", text: `The heads mostly agree here (mean JSD < ${JSD_WARN} bits): the head mean is a fair summary for this query.` }));
      const trows = order.map((h) => { let best = keys[0], bv = -1; keys.forEach((j, k) => { if (rows[h][k] > bv) { bv = rows[h][k]; best = j; } });
        return [h, labels[best], best, bv, per[h]]; });
      jsdBox.appendChild(L.table([{ title: "head" }, { title: "reads most", text: true }, { title: "pos" }, { title: "weight", fmt: fv }, { title: "mean JSD to the other heads (bits)" }],
        trows, { id: "heads-table", onclick: (i) => { st.h = trows[i][0]; headSel.value = st.h; redraw(); } }));
    }

    function compareRowHighlight() { document.querySelectorAll("#compare-table tbody tr").forEach((tr) => tr.classList.toggle("hl", +tr.dataset.key === st.t)); }

    async function compare() {
      const mi = MAN.methods || {};
      let row = new Float32Array(n); for (let j = 0; j < n; j++) row[j] = cur[pos * n + j];
      if (L.has("attention@explained")) { // exact float32 rows of the explained position (the full tensor is fixed point)
        const ex = (await L.arr("attention@explained")).data, at = (h) => ex.subarray((st.l * NH + h) * n, (st.l * NH + h + 1) * n);
        if (st.h >= 0) row = at(st.h); else { row = new Float32Array(n); for (let h = 0; h < NH; h++) { const r = at(h); for (let j = 0; j < n; j++) row[j] += r[j] / NH; } }
      }
      const keep = []; for (let j = 0; j < n; j++) if (ok(pos, j) && !(st.hide && hiddenKey(j))) keep.push(j);
      const scores = {}; for (const m of methods) scores[m] = (await L.arr(m + ".tokens")).data;
      const attR = L.rankDesc(keep.map((j) => row[j])), ranks = {};
      for (const m of methods) ranks[m] = L.rankDesc(keep.map((j) => Math.abs(scores[m][j])));
      const cols = [{ title: "pos" }, { title: "token", text: true }, { title: `attention (L${st.l}, ${st.h < 0 ? "head mean" : "H" + st.h}, from pos ${pos})`, fmt: L.has("attention@explained") ? (v) => v.toFixed(4) : fv }, { title: "rank" }];
      for (const m of methods) cols.push({ title: m + ((mi[m] || {}).view ? ` (${mi[m].view})` : "") }, { title: "rank by |score|" });
      const rows = keep.map((j, k) => { const r = [j, labels[j], row[j], attR[k]]; for (const m of methods) r.push(scores[m][j], ranks[m][k]); return r; });
      cmpBox.textContent = "";
      const occ = methods.find((m) => m === "occlusion");
      const top = keep.slice().sort((x, y) => row[y] - row[x])[0];
      const where = `layer ${st.l}, ${headName(st.h)}, from ${q(labels[pos])} at position ${pos}`;
      let sentence;
      if (top === undefined) sentence = "no tokens left to compare (every token is hidden)";
      else if (occ) {
        const o = mi.occlusion || {}, repl = o.replacement_used === "delete" ? "deleted" : `replaced by ${q(o.replacement_token || o.replacement || "?")}`;
        sentence = `Attention (${where}) points at ${q(labels[top])} (position ${top}, weight ${fmt(row[top], 4)}); removing ${q(labels[top])} (${repl}) changes ${tgt.explained || "the output"} by ${fmt(-scores[occ][top])}.`;
      } else sentence = `Attention (${where}) points at ${q(labels[top])} (position ${top}, weight ${fmt(row[top], 4)}); this run has no occlusion, so what removing it does is unknown (run explain with --methods occlusion).`;
      cmpBox.appendChild(el("p", { cls: "sentence", id: "sentence", text: sentence }));
      for (const m of methods) { const r = L.readings(m, mi[m]); if (r) cmpBox.appendChild(r); }
      const taus = methods.map((m) => [m, L.kendallTauB(keep.map((j) => row[j]), keep.map((j) => Math.abs(scores[m][j])))]);
      cmpBox.appendChild(el("div", { id: "taus" }, `Kendall τ-b between this attention row and each method's |score| over ${keep.length} tokens (${st.hide ? "special tokens and sinks excluded" : "all tokens"}): `,
        taus.map(([m, t], k) => el("span", { cls: "tau", "data-method": m, "data-value": String(t) }, (k ? "; " : "") + `${m} ${fmt(t, 3)}`))));
      const detail = methods.map((m) => { const x = mi[m] || {}; const t = x.target || {};
        return `${m}: explains ${t.explained || tgt.explained || "?"}${x.replacement_token || x.replacement_used ? `, replacement ${q(x.replacement_used === "delete" ? "delete" : x.replacement_token || x.replacement)}` : ""}${x.view ? `, ${x.view}` : ""}`; });
      cmpBox.appendChild(el("div", { cls: "note", text: detail.join("; ") }));
      cmpBox.appendChild(L.table(cols, rows, { id: "compare-table", key: (i) => rows[i][0], onclick: (i) => { st.t = rows[i][0]; st.lock = true; refresh(); compareRowHighlight(); } }));
      compareRowHighlight();
    }

    async function redraw() {
      await drawMatrix(); curSinks = sinks(cur);
      thumbs.forEach((r, l) => r.forEach((c, h) => c.classList.toggle("cur", l === st.l && (h === NH ? -1 : h) === st.h)));
      refresh(); await compare();
    }
    await redraw();
    await drawThumbs(st.l);
  };
})();
