/* streetlamp report viewer: plain JavaScript, no dependencies, no network.
 * Every string that comes from the run is rendered with textContent (or canvas fillText), never parsed
 * as HTML. The data lives in <script type="application/json" id="sl-model"> (the manifest and an index
 * of arrays) and <script type="application/octet-stream" id="sl-blob-N"> elements (base64 of
 * byte-shuffled, deflate-compressed chunks, decoded here only when a view needs them). */
(function () {
  "use strict";
  let MODEL = JSON.parse(document.getElementById("sl-model").textContent);
  let MAN = MODEL.manifest, BLOBS = null; // BLOBS: chunks handed to SL.render by a host page, else the sl-blob-N elements
  const SL = (window.streetlamp = { ready: false, errors: [] });

  // ---------- DOM helpers (text only) ----------
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") e.textContent = String(v);
      else if (k === "cls") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of kids.flat()) {
      if (c === null || c === undefined || c === false) continue;
      e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return e;
  }
  const $ = (id) => document.getElementById(id);
  function fmt(v, d) {
    if (v === null || v === undefined || Number.isNaN(v)) return "n/a";
    if (typeof v !== "number") return String(v);
    if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
    if (d === undefined && Number.isInteger(v) && Math.abs(v) < 1e7) return String(v);
    const a = Math.abs(v);
    if (d === undefined) d = 4;
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
    return v.toFixed(d);
  }
  const q = (s) => JSON.stringify(String(s)); // a token shown quoted, as text

  // ---------- arrays ----------
  const ITEM = { f32: 4, u16: 2, u12: 2, u8: 1 };
  const SCALE = { u16: 65535, u12: 4095, u8: 255 };
  const chunkCache = new Map(); // blob id -> Promise<Float32Array>
  const LRU = [];
  const CACHE_BYTES = 256 * 1024 * 1024;
  function b64bytes(id) {
    const s = BLOBS ? BLOBS[id] : $("sl-blob-" + id).textContent;
    const bin = atob(s);
    const u = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
    return u;
  }
  async function inflate(u) {
    const stream = new Blob([u]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }
  function decode(raw, codec) {
    const k = ITEM[codec], n = raw.length / k;
    let bytes = raw;
    if (k > 1) {
      bytes = new Uint8Array(raw.length);
      for (let b = 0; b < k; b++) { const off = b * n; for (let i = 0; i < n; i++) bytes[i * k + b] = raw[off + i]; }
    }
    if (codec === "f32") return new Float32Array(bytes.buffer);
    const out = new Float32Array(n);
    const qv = k === 2 ? new Uint16Array(bytes.buffer) : bytes, sc = SCALE[codec];
    for (let i = 0; i < n; i++) out[i] = qv[i] / sc;
    return out;
  }
  function chunk(id, codec) {
    if (chunkCache.has(id)) {
      const i = LRU.indexOf(id); if (i >= 0) { LRU.splice(i, 1); LRU.push(id); }
      return chunkCache.get(id).p;
    }
    const entry = { p: inflate(b64bytes(id)).then((raw) => { const a = decode(raw, codec); entry.bytes = a.byteLength; return a; }), bytes: 0 };
    chunkCache.set(id, entry); LRU.push(id);
    let total = 0; for (const k of LRU) total += chunkCache.get(k).bytes;
    while (total > CACHE_BYTES && LRU.length > 2) { const old = LRU.shift(); total -= chunkCache.get(old).bytes; chunkCache.delete(old); }
    return entry.p;
  }
  const has = (name) => Object.prototype.hasOwnProperty.call(MODEL.arrays, name);
  function info(name) { if (!has(name)) throw new Error("no array " + name); return MODEL.arrays[name]; }
  async function arr(name) { // the whole array, flat, with its shape
    const a = info(name);
    const parts = await Promise.all(a.chunks.map((id) => chunk(id, a.codec)));
    if (parts.length === 1) return { shape: a.shape, data: parts[0], err: a.max_error };
    const n = parts.reduce((s, p) => s + p.length, 0), data = new Float32Array(n);
    let o = 0; for (const p of parts) { data.set(p, o); o += p.length; }
    return { shape: a.shape, data, err: a.max_error };
  }
  async function slab(name, i) { // one piece along the first axis (one layer of attention)
    const a = info(name);
    if (a.chunks.length > 1) return chunk(a.chunks[i], a.codec);
    const all = await chunk(a.chunks[0], a.codec), per = all.length / a.shape[0];
    return all.subarray(i * per, (i + 1) * per);
  }
  SL.arr = arr; SL.slab = slab;

  // ---------- palettes ----------
  function lut(role) {
    const h = MODEL.palettes[role].hex, out = [];
    for (let i = 0; i < 256; i++) out.push([parseInt(h.substr(6 * i, 2), 16), parseInt(h.substr(6 * i + 2, 2), 16), parseInt(h.substr(6 * i + 4, 2), 16)]);
    return out;
  }
  const SEQ = lut("sequential"), DIV = lut("diverging");
  const SEQ_NAME = MODEL.palettes.sequential.name, DIV_NAME = MODEL.palettes.diverging.name;
  const FORBID = [189, 189, 189];
  function seq(v) { return SEQ[Math.max(0, Math.min(255, Math.round(v * 255)))]; }
  function div(v, m) { return DIV[Math.max(0, Math.min(255, Math.round((v / (m || 1) + 1) * 127.5)))]; }
  const css = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;
  const ink = (c) => (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] > 140 ? "#000" : "#fff");
  function legend(kind, lo, hi, extra) {
    const c = el("canvas", { width: 160, height: 12, title: "colour scale" });
    const g = c.getContext("2d");
    for (let x = 0; x < 160; x++) { const t = x / 159; g.fillStyle = css(kind === "seq" ? seq(t) : DIV[Math.round(t * 255)]); g.fillRect(x, 0, 1, 12); }
    const what = kind === "seq" ? `${SEQ_NAME} (sequential, colour-blind-safe), fixed ${fmt(lo, 1)}..${fmt(hi, 1)}`
      : `${DIV_NAME} (diverging, colour-blind-safe), ${fmt(-hi, 3)}..${fmt(hi, 3)}, white = 0`;
    return el("div", { cls: "legend" }, fmt(kind === "seq" ? lo : -hi, 3), c, fmt(hi, 3), el("span", { text: what }), extra || null);
  }
  function hatchLegend() {
    const c = el("canvas", { width: 14, height: 12 });
    const g = c.getContext("2d"); g.fillStyle = css(FORBID); g.fillRect(0, 0, 14, 12); hatch(g, [[0, 0, 14, 12]]);
    return el("span", { cls: "legend" }, c, "forbidden by the mask (hatched grey, never 'low')");
  }
  function hatch(g, rects) {
    g.save(); g.beginPath(); for (const r of rects) g.rect(r[0], r[1], r[2], r[3]); g.clip();
    g.strokeStyle = "rgba(60,60,60,0.55)"; g.lineWidth = 1; g.beginPath();
    const W = g.canvas.width, H = g.canvas.height;
    for (let s = -H; s < W; s += 5) { g.moveTo(s, H); g.lineTo(s + H, 0); }
    g.stroke(); g.restore();
  }

  // ---------- images: cells -> canvas ----------
  // paint rows x cols values into canvas c at cell size (cw, ch); colour(v) -> rgb; allowed(i,j) -> bool
  function paint(c, rows, cols, value, colour, allowed, cw, ch) {
    const img = new ImageData(cols, rows), d = img.data, forb = [];
    for (let i = 0; i < rows; i++) {
      let run = -1;
      for (let j = 0; j < cols; j++) {
        const ok = allowed ? allowed(i, j) : true, p = 4 * (i * cols + j);
        const col = ok ? colour(value(i, j)) : FORBID;
        d[p] = col[0]; d[p + 1] = col[1]; d[p + 2] = col[2]; d[p + 3] = 255;
        if (!ok && run < 0) run = j;
        if ((ok || j === cols - 1) && run >= 0) { forb.push([run * cw, i * ch, ((ok ? j : j + 1) - run) * cw, ch]); run = -1; }
      }
    }
    const tmp = el("canvas", { width: cols, height: rows });
    tmp.getContext("2d").putImageData(img, 0, 0);
    const g = c.getContext("2d");
    g.imageSmoothingEnabled = false;
    g.drawImage(tmp, 0, 0, cols * cw, rows * ch);
    if (forb.length) hatch(g, forb);
  }

  // ---------- export ----------
  function download(name, blob) {
    const a = el("a", { download: name, href: URL.createObjectURL(blob) });
    document.body.appendChild(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }
  function exportButtons(getCanvas, name, title) {
    const png = el("button", { text: "PNG", title: "download this figure as PNG", onclick: () => getCanvas().toBlob((b) => download(name + ".png", b)) });
    const svg = el("button", { text: "SVG", title: "download this figure as SVG", onclick: () => {
      const c = getCanvas(), ns = "http://www.w3.org/2000/svg";
      const s = document.createElementNS(ns, "svg");
      s.setAttribute("xmlns", ns); s.setAttribute("width", c.width); s.setAttribute("height", c.height + 24);
      const t = document.createElementNS(ns, "text"); t.setAttribute("x", 4); t.setAttribute("y", 16);
      t.setAttribute("font-family", "sans-serif"); t.setAttribute("font-size", "13"); t.textContent = title(); s.appendChild(t);
      const im = document.createElementNS(ns, "image"); im.setAttribute("x", 0); im.setAttribute("y", 24);
      im.setAttribute("width", c.width); im.setAttribute("height", c.height); im.setAttribute("href", c.toDataURL("image/png"));
      s.appendChild(im);
      download(name + ".svg", new Blob([new XMLSerializer().serializeToString(s)], { type: "image/svg+xml" }));
    } });
    return el("span", { cls: "controls" }, "export:", png, svg);
  }

  // ---------- sortable table ----------
  function table(cols, rows, opts) {
    opts = opts || {};
    let key = opts.sort === undefined ? -1 : opts.sort, dir = opts.desc ? -1 : 1;
    const tbody = el("tbody");
    const ths = cols.map((c, k) => el("th", { cls: c.text ? "t" : "", title: "click to sort", "data-col": k,
      onclick: () => { dir = key === k ? -dir : (c.text ? 1 : -1); key = k; draw(); } }, c.title));
    function draw() {
      const order = rows.map((r, i) => i);
      if (key >= 0) order.sort((a, b) => {
        const x = rows[a][key], y = rows[b][key];
        if (x === y) return a - b;
        if (x === null || x === undefined || Number.isNaN(x)) return 1;
        if (y === null || y === undefined || Number.isNaN(y)) return -1;
        return (x < y ? -1 : 1) * dir;
      });
      tbody.textContent = "";
      for (const i of order) {
        const tr = el("tr", { "data-row": i, "data-key": opts.key ? opts.key(i) : null, cls: opts.onclick ? "clickable" : "" },
          rows[i].map((v, k) => el("td", { cls: cols[k].text ? "t" : "", "data-value": typeof v === "number" ? String(v) : null },
            cols[k].fmt ? cols[k].fmt(v) : typeof v === "number" ? fmt(v) : v === null || v === undefined ? "" : String(v))));
        if (opts.onclick) tr.addEventListener("click", () => opts.onclick(i));
        tbody.appendChild(tr);
      }
      ths.forEach((th, k) => th.setAttribute("aria-sort", k === key ? (dir > 0 ? "ascending" : "descending") : "none"));
    }
    draw();
    return el("div", { cls: "scroll" }, el("table", { id: opts.id || null }, el("thead", {}, el("tr", {}, ths)), tbody));
  }

  // ---------- state in the URL fragment ----------
  const state = {};
  function readHash() {
    const h = (location.hash || "").replace(/^#/, "");
    for (const part of h.split("&")) {
      if (!part) continue;
      const i = part.indexOf("="); if (i < 0) continue;
      state[decodeURIComponent(part.slice(0, i))] = decodeURIComponent(part.slice(i + 1));
    }
  }
  function writeHash() {
    const s = Object.entries(state).filter(([, v]) => v !== null && v !== undefined && v !== "")
      .map(([k, v]) => encodeURIComponent(k) + "=" + encodeURIComponent(String(v))).join("&");
    try { history.replaceState(null, "", "#" + s); } catch (e) { /* srcdoc iframes may refuse; the view still works */ }
  }
  const sint = (k, dflt, lo, hi) => { const v = parseInt(state[k], 10); return Number.isFinite(v) && v >= lo && v <= hi ? v : dflt; };

  // ---------- statistics shown (derived from stored arrays, tested against scipy) ----------
  function rankDesc(v) { // 1 = largest; ties share their mean rank
    const idx = v.map((x, i) => i).sort((a, b) => v[b] - v[a]), r = new Array(v.length);
    for (let s = 0; s < idx.length;) { let e = s; while (e + 1 < idx.length && v[idx[e + 1]] === v[idx[s]]) e++;
      for (let k = s; k <= e; k++) r[idx[k]] = (s + e) / 2 + 1; s = e + 1; }
    return r;
  }
  function kendallTauB(x, y) {
    let c = 0, d = 0, tx = 0, ty = 0; const n = x.length;
    for (let i = 0; i < n; i++) for (let j = i + 1; j < n; j++) {
      const a = Math.sign(x[i] - x[j]), b = Math.sign(y[i] - y[j]);
      if (a === 0 && b === 0) continue; if (a === 0) tx++; else if (b === 0) ty++; else if (a === b) c++; else d++;
    }
    const den = Math.sqrt((c + d + tx) * (c + d + ty));
    return den > 0 ? (c - d) / den : NaN;
  }
  function jsd(p, r) { // Jensen-Shannon divergence in bits (0..1)
    let s = 0;
    for (let i = 0; i < p.length; i++) { const m = (p[i] + r[i]) / 2; if (p[i] > 0) s += p[i] * Math.log2(p[i] / m); if (r[i] > 0) s += r[i] * Math.log2(r[i] / m); }
    return Math.max(0, s / 2);
  }
  SL.stats = { kendallTauB, jsd, rankDesc };

  // ---------- shared header ----------
  function header(title, sub) {
    return el("div", {}, el("h1", { text: title }), el("p", { cls: "sub", text: sub }));
  }
  function modelLine() {
    const m = MAN.model || MAN.model_info || {};
    return [m.name, m.kind, m.layers !== undefined ? `${m.layers} layers x ${m.heads} heads` : null].filter(Boolean).join(", ");
  }
  const tip = el("div", { cls: "tip" });
  function showTip(ev, text) { tip.textContent = text; tip.style.display = "block"; tip.style.left = ev.clientX + 12 + "px"; tip.style.top = ev.clientY + 12 + "px"; }
  function hideTip() { tip.style.display = "none"; }

  // ---------- a layer x head (or any 2-D) grid of numbers, with hover values ----------
  function valueGrid(id, vals, rows, cols, opts) {
    // vals: flat Float32Array rows*cols; opts: {rowName, colName, signed, title, cell, rowLabels, colLabels, onclick}
    const cell = opts.cell || Math.max(6, Math.min(28, Math.floor(560 / Math.max(cols, 1))));
    let m = 0; for (const v of vals) if (Number.isFinite(v)) m = Math.max(m, Math.abs(v));
    const signed = opts.signed === undefined ? Array.from(vals).some((v) => v < 0) : opts.signed;
    const lo = signed ? -m : 0, hi = opts.hi !== undefined ? opts.hi : (signed ? m : Math.max(m, 1e-12));
    const c = el("canvas", { id, width: cols * cell, height: rows * cell, "data-rows": rows, "data-cols": cols });
    const colour = (v) => (!Number.isFinite(v) ? FORBID : signed ? div(v, m) : seq((v - lo) / (hi - lo)));
    paint(c, rows, cols, (i, j) => vals[i * cols + j], colour, (i, j) => Number.isFinite(vals[i * cols + j]), cell, cell);
    const out = el("div", { cls: "readout", id: id + "-value" }, "hover a cell");
    const where = (ev) => { const r = c.getBoundingClientRect(); const j = Math.floor((ev.clientX - r.left) / (r.width / cols)), i = Math.floor((ev.clientY - r.top) / (r.height / rows));
      return i >= 0 && j >= 0 && i < rows && j < cols ? [i, j] : null; };
    const label = (i, j) => `${opts.rowName} ${opts.rowLabels ? opts.rowLabels[i] : i}, ${opts.colName} ${opts.colLabels ? opts.colLabels[j] : j}`;
    c.addEventListener("mousemove", (ev) => { const p = where(ev); if (!p) return; const v = vals[p[0] * cols + p[1]];
      out.textContent = `${label(p[0], p[1])}: ${fmt(v)}`; out.setAttribute("data-value", String(v)); showTip(ev, out.textContent); });
    c.addEventListener("mouseleave", hideTip);
    if (opts.onclick) c.addEventListener("click", (ev) => { const p = where(ev); if (p) opts.onclick(p[0], p[1]); });
    const lg = signed ? legend("div", 0, m) : legend("seq", lo, hi);
    return el("div", { cls: "panel" }, el("h2", { text: opts.title }),
      el("div", { cls: "note", text: `rows: ${opts.rowName}, columns: ${opts.colName}` + (opts.note ? "; " + opts.note : "") }),
      c, lg, out, exportButtons(() => c, id, () => opts.title));
  }

  // ---------- scatter with labels ----------
  function scatter(id, xs, ys, labels, opts) {
    const W = 520, Hh = 340, P = 44, c = el("canvas", { id, width: W, height: Hh });
    const g = c.getContext("2d");
    const fin = (a) => a.filter(Number.isFinite);
    const x0 = Math.min(...fin(xs)), x1 = Math.max(...fin(xs)), y0 = Math.min(...fin(ys)), y1 = Math.max(...fin(ys));
    const sx = (x) => P + (x - x0) / ((x1 - x0) || 1) * (W - 2 * P), sy = (y) => Hh - P - (y - y0) / ((y1 - y0) || 1) * (Hh - 2 * P);
    g.fillStyle = "#fff"; g.fillRect(0, 0, W, Hh); g.strokeStyle = "#999"; g.strokeRect(P, P, W - 2 * P, Hh - 2 * P);
    g.fillStyle = "#222"; g.font = "12px sans-serif";
    g.fillText(opts.xTitle, W / 2 - 60, Hh - 8); g.save(); g.translate(12, Hh / 2 + 60); g.rotate(-Math.PI / 2); g.fillText(opts.yTitle, 0, 0); g.restore();
    g.fillText(fmt(x0, 3), P, Hh - P + 14); g.fillText(fmt(x1, 3), W - P - 30, Hh - P + 14); g.fillText(fmt(y0, 3), 2, Hh - P); g.fillText(fmt(y1, 3), 2, P + 4);
    g.font = "10px sans-serif";
    for (let i = 0; i < xs.length; i++) { if (!Number.isFinite(xs[i]) || !Number.isFinite(ys[i])) continue;
      g.fillStyle = "#2c5d8f"; g.beginPath(); g.arc(sx(xs[i]), sy(ys[i]), 3, 0, 7); g.fill(); g.fillStyle = "#444"; g.fillText(labels[i], sx(xs[i]) + 4, sy(ys[i]) - 3); }
    const out = el("div", { cls: "readout", id: id + "-value" }, "hover a point");
    c.addEventListener("mousemove", (ev) => { const r = c.getBoundingClientRect(), mx = (ev.clientX - r.left) * W / r.width, my = (ev.clientY - r.top) * Hh / r.height;
      let best = -1, bd = 64; for (let i = 0; i < xs.length; i++) { const d = (sx(xs[i]) - mx) ** 2 + (sy(ys[i]) - my) ** 2; if (d < bd) { bd = d; best = i; } }
      if (best >= 0) { out.textContent = `${labels[best]}: ${opts.xName} ${fmt(xs[best])}, ${opts.yName} ${fmt(ys[best])}`; showTip(ev, out.textContent); } });
    c.addEventListener("mouseleave", hideTip);
    return el("div", { cls: "panel" }, el("h2", { text: opts.title }), c, out, opts.note ? el("div", { cls: "note", text: opts.note }) : null,
      exportButtons(() => c, id, () => opts.title));
  }

  // ---------- line chart ----------
  function lines(id, series, opts) { // series: [{name, x:[], y:[]}]
    const W = 520, Hh = 300, P = 44, c = el("canvas", { id, width: W, height: Hh }), g = c.getContext("2d");
    const xsAll = series.flatMap((s) => s.x).filter(Number.isFinite), ysAll = series.flatMap((s) => s.y).filter(Number.isFinite);
    if (!xsAll.length) return el("div", { cls: "panel" }, el("h2", { text: opts.title }), el("p", { text: "no data" }));
    const x0 = Math.min(...xsAll), x1 = Math.max(...xsAll), y0 = Math.min(0, ...ysAll), y1 = Math.max(...ysAll);
    const sx = (x) => P + (x - x0) / ((x1 - x0) || 1) * (W - 2 * P), sy = (y) => Hh - P - (y - y0) / ((y1 - y0) || 1) * (Hh - 2 * P);
    g.fillStyle = "#fff"; g.fillRect(0, 0, W, Hh); g.strokeStyle = "#999"; g.strokeRect(P, P, W - 2 * P, Hh - 2 * P);
    g.fillStyle = "#222"; g.font = "12px sans-serif"; g.fillText(opts.xTitle, W / 2 - 50, Hh - 8);
    g.save(); g.translate(12, Hh / 2 + 50); g.rotate(-Math.PI / 2); g.fillText(opts.yTitle, 0, 0); g.restore();
    g.fillText(fmt(y0, 3), 2, Hh - P); g.fillText(fmt(y1, 3), 2, P + 4); g.fillText(fmt(x0, 2), P, Hh - P + 14); g.fillText(fmt(x1, 2), W - P - 24, Hh - P + 14);
    const COLS = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000"]; // Okabe-Ito
    series.forEach((s, k) => { g.strokeStyle = COLS[k % COLS.length]; g.lineWidth = 2; g.beginPath(); let first = true;
      s.x.forEach((x, i) => { if (!Number.isFinite(s.y[i])) return; if (first) g.moveTo(sx(x), sy(s.y[i])); else g.lineTo(sx(x), sy(s.y[i])); first = false; });
      g.stroke(); g.fillStyle = COLS[k % COLS.length]; g.fillRect(W - P - 150, P + 6 + 14 * k, 10, 10); g.fillStyle = "#222"; g.fillText(s.name, W - P - 136, P + 15 + 14 * k); });
    return el("div", { cls: "panel" }, el("h2", { text: opts.title }), c, opts.note ? el("div", { cls: "note", text: opts.note }) : null,
      el("div", { cls: "note", text: "line colours: Okabe-Ito (colour-blind-safe)" }), exportButtons(() => c, id, () => opts.title));
  }
  function bars(id, names, values, opts) {
    const W = 520, rowH = 18, P = 160, Hh = names.length * rowH + 30, c = el("canvas", { id, width: W, height: Hh }), g = c.getContext("2d");
    const m = Math.max(1e-12, ...values.filter(Number.isFinite).map(Math.abs)), zero = values.some((v) => v < 0) ? P + (W - P - 10) / 2 : P;
    const scale = (W - 10 - zero) / m;
    g.fillStyle = "#fff"; g.fillRect(0, 0, W, Hh); g.font = "12px sans-serif";
    names.forEach((n, i) => { g.fillStyle = "#222"; g.fillText(String(n).slice(0, 24), 4, 16 + i * rowH); const v = values[i];
      if (!Number.isFinite(v)) return; g.fillStyle = v >= 0 ? "#0072b2" : "#d55e00"; g.fillRect(Math.min(zero, zero + v * scale), 5 + i * rowH, Math.abs(v * scale), rowH - 6);
      g.fillStyle = "#222"; g.fillText(fmt(v, 3), Math.min(W - 60, zero + Math.max(0, v * scale) + 4), 16 + i * rowH); });
    return el("div", { cls: "panel" }, el("h2", { text: opts.title }), c, opts.note ? el("div", { cls: "note", text: opts.note }) : null, exportButtons(() => c, id, () => opts.title));
  }
  function kv(obj, depth) {
    const box = el("div", { cls: "kv" });
    const add = (k, v) => { box.appendChild(el("div", { cls: "k", text: k })); box.appendChild(el("div", { cls: "v", text: typeof v === "string" ? v : JSON.stringify(v) })); };
    for (const [k, v] of Object.entries(obj || {})) {
      if (v && typeof v === "object" && !Array.isArray(v) && depth > 0) for (const [k2, v2] of Object.entries(v)) add(`${k}.${k2}`, v2);
      else add(k, v);
    }
    return box;
  }
  function figures() {
    const figs = MODEL.figures || [];
    if (!figs.length) return null;
    return el("div", { cls: "panel" }, el("h2", { text: "Figures stored in the run folder" }),
      figs.map((f) => el("div", { cls: "figure" }, el("div", { cls: "note", text: `${f.file}: ${f.shows || ""}` }), el("img", { src: f.uri, alt: f.shows || f.file }))));
  }
  // how to read a method's scores (streetlamp/readings.py computes them; the page only words them):
  // the attention sink of an attention-derived score, AttnLRP's position skew. One div per note, or null.
  function readings(name, x) {
    const notes = [], pct = (v, d) => `${(100 * v).toFixed(d)}%`;
    const s = x && x.attention_sink, k = x && x.position_skew;
    if (s) notes.push(`attention sink in ${name}: ${q(s.token)}@${s.key} takes ${pct(s.share, 1)} of its mass (at least ${pct(s.threshold, 0)}: more than all other tokens together), so its top token says where the sink is, not what the text contributes; with it set aside, the top tokens are ${(s.set_aside || []).map(([j, t, v]) => `${q(t)}@${j} ${pct(v, 0)}`).join(", ") || "none"} (shares of the rest)`);
    if (k) notes.push(`position skew in ${name}: position 0 takes ${pct(k.first.share, 1)} of the total |relevance| (${k.first.times_uniform.toFixed(1)}× uniform, ${k.first.sign < 0 ? "negative" : "positive"}), the last token ${pct(k.last.share, 1)} (${k.last.times_uniform.toFixed(1)}×); this grows with the length of the text (docs/decoder.md): read the middle tokens' ranking, not the ends'`);
    return notes.length ? el("div", { cls: "warn reading", "data-method": name }, notes.map((t) => el("div", { text: t }))) : null;
  }
  function genericTables() {
    return (Array.isArray(MAN.tables) ? MAN.tables : []).map((t, k) => el("div", { cls: "panel" }, el("h2", { text: t.title || `table ${k + 1}` }),
      t.note ? el("div", { cls: "note", text: t.note }) : null,
      table((t.columns || []).map((c, j) => ({ title: String(c), text: (t.rows || []).some((r) => typeof r[j] === "string") })), t.rows || [], { id: `table-${k}` })));
  }

  SL.lib = { el, fmt, q, arr, slab, has, info, table, valueGrid, scatter, lines, bars, kv, figures, genericTables, readings, legend, hatchLegend,
    paint, seq, div, FORBID, exportButtons, state, writeHash, sint, header, modelLine, rankDesc, kendallTauB, jsd, showTip, hideTip, css, ink, MAN, MODEL };
  const VIEWS = (SL.views = {});

  // ---------- generic view: any command ----------
  VIEWS.generic = async function (root) {
    root.appendChild(header(`streetlamp ${MODEL.view}`, modelLine()));
    root.appendChild(el("div", { cls: "note", text: "generic view: the manifest's tables and figures, the stored arrays, and a summary of the manifest" }));
    for (const t of genericTables()) root.appendChild(t);
    for (const [name, a] of Object.entries(MODEL.arrays)) {
      const d = (MAN.arrays || {})[name] || {};
      if (a.shape.length === 2 && a.shape[0] * a.shape[1] <= 65536) {
        const v = await arr(name), ax = d.axes || ["row", "column"];
        root.appendChild(valueGrid("grid-" + name.replace(/[^A-Za-z0-9_-]/g, "_"), v.data, a.shape[0], a.shape[1],
          { title: name, rowName: ax[0], colName: ax[1], note: d.meaning }));
      }
    }
    const f = figures(); if (f) root.appendChild(f);
    const arrs = Object.entries(MODEL.arrays).map(([n, a]) => [n, a.shape.join(" x "), ((MAN.arrays || {})[n] || {}).meaning || ""]);
    if (arrs.length) root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Arrays" }),
      table([{ title: "array", text: true }, { title: "shape", text: true }, { title: "meaning", text: true }], arrs, { id: "arrays-table" })));
    const summary = {}; for (const [k, v] of Object.entries(MAN)) if (!["arrays", "tables", "figures", "versions"].includes(k)) summary[k] = v;
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Manifest" }), kv(summary, 1)));
  };

  async function main(root) {
    root = root || $("app"); root.textContent = ""; document.body.appendChild(tip);
    readHash();
    const view = VIEWS[MODEL.view] || VIEWS.generic;
    try { await view(root); }
    catch (e) { root.appendChild(el("p", { cls: "error", text: "report error: " + (e && e.message ? e.message : String(e)) })); SL.errors.push(String(e)); console.error(e); }
    SL.ready = true; document.body.setAttribute("data-ready", "1");
  }
  SL.start = main;
  // for a host page (streetlamp serve): render another model (same shape as sl-model) and its chunks into root
  SL.render = async function (model, blobs, root) {
    MODEL = model; MAN = model.manifest; BLOBS = blobs; chunkCache.clear(); LRU.length = 0;
    SL.lib.MODEL = MODEL; SL.lib.MAN = MAN; SL.ready = false;
    await main(root);
  };
  // view modules below register themselves in VIEWS before this runs
  window.addEventListener("DOMContentLoaded", () => main());
})();
