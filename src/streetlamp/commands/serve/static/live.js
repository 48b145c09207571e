/* streetlamp serve: the live page. Every result is drawn by the report's own code (streetlamp.render
 * draws the explain view from the same manifest and arrays a run folder holds; streetlamp.lib draws grids
 * and tables); this file adds the text box, token and head actions, progress and errors. Strings from the
 * server are always rendered as text (textContent), never parsed as HTML. */
(function () {
  "use strict";
  const S = window.streetlamp, L = S.lib, el = L.el, fmt = L.fmt, q = L.q;

  S.views.live = async function (root) {
    const info = L.MODEL.live, models = info.models;
    const live = { base: null, shown: null, token: null, heads: [], lastId: null, busy: false, edits: [], history: [] };
    S.live = live;

    // ---- controls ----
    const modelSel = el("select", { id: "live-model", "aria-label": "model" },
      models.map((m) => el("option", { value: m.name, text: `${m.name} (${m.kind}, ${m.layers} x ${m.heads}, ≤ ${m.max_positions} tokens)` })));
    const text = el("textarea", { id: "live-text", rows: 3, cols: 90, maxlength: info.max_chars, "aria-label": "text",
      placeholder: "type or paste a text" });
    text.value = "The movie was not good, but the acting was great.";
    const trunc = el("input", { type: "checkbox", id: "live-truncate" });
    const methodBoxes = info.methods.filter((m) => m !== "attention").map((m) => {
      const b = el("input", { type: "checkbox", "data-method": m, id: "live-method-" + m });
      b.checked = info.default_methods.includes(m);
      return el("label", { cls: "meth" }, b, " " + m);
    });
    const go = el("button", { id: "live-explain", text: "Explain", onclick: () => explain() });
    const status = el("div", { id: "live-status", cls: "readout", "data-state": "idle" }, "ready");
    const bar = el("progress", { id: "live-progress", hidden: true });
    const error = el("div", { id: "live-error", cls: "error", role: "alert" });
    const pred = el("div", { id: "live-pred", cls: "readout" });
    root.appendChild(L.header("streetlamp serve", "a click is an intervention: remove or replace a token, ablate heads, compare two texts"));
    root.appendChild(el("div", { cls: "panel" },
      el("div", { cls: "controls" }, "model", modelSel, el("label", {}, trunc, " truncate to the model's positions")),
      text, el("div", { cls: "controls" }, "methods:", methodBoxes, go), el("div", { cls: "controls" }, bar, status), error, pred));

    // ---- actions: the selected token, the selected heads ----
    const tokLine = el("div", { id: "live-token", cls: "readout" }, "click a token in the strip below to remove or replace it");
    const repSel = el("select", { id: "live-replace-select", "aria-label": "replacement" }, el("option", { value: "", text: "menu..." }));
    const repIn = el("input", { id: "live-replace-input", size: 14, placeholder: "or type one token", "aria-label": "typed replacement" });
    const removeBtn = el("button", { id: "live-remove", text: "remove", disabled: true, onclick: () => edit("remove") });
    const replaceBtn = el("button", { id: "live-replace", text: "replace", disabled: true, onclick: () => edit("replace") });
    const headLine = el("div", { id: "live-heads", cls: "readout" }, "click a head's thumbnail in the grid below to ablate it (click more to ablate several)");
    const ablSel = el("select", { id: "live-ablation", "aria-label": "ablation" }, el("option", { value: "zero", text: "zero ablation" }),
      el("option", { value: "mean", text: "mean ablation (streetlamp heads' reference texts)" }));
    const clearBtn = el("button", { id: "live-clear-heads", text: "clear heads", onclick: () => { live.heads = []; showHeads(); result.textContent = ""; } });
    const undoBtn = el("button", { id: "live-undo", text: "undo the last edit", disabled: true, onclick: () => undo() });
    const resetBtn = el("button", { id: "live-reset", text: "reset to the original text", disabled: true, onclick: () => reset() });
    const historyBox = el("div", { id: "live-history" });
    const saveBtn = el("button", { id: "live-save", text: "save as run folder", disabled: true, onclick: () => save() });
    const saved = el("div", { id: "live-saved", cls: "readout" });
    const result = el("div", { id: "live-result" });
    root.appendChild(el("div", { cls: "panel", id: "live-actions" }, el("h2", { text: "Intervene" }),
      tokLine, el("div", { cls: "controls" }, removeBtn, "or", repSel, repIn, replaceBtn),
      historyBox, el("div", { cls: "controls" }, undoBtn, resetBtn),
      headLine, el("div", { cls: "controls" }, ablSel, clearBtn), el("div", { cls: "controls" }, saveBtn), saved, result));

    // ---- minimal pair ----
    const pa = el("input", { id: "live-pair-a", size: 60, "aria-label": "text A", value: "The animal didn't cross the street because it was too tired." });
    const pb = el("input", { id: "live-pair-b", size: 60, "aria-label": "text B", value: "The animal didn't cross the street because it was too wide." });
    const pairOut = el("div", { id: "live-pair-result" });
    // each text's explain view is the report's, drawn by streetlamp.render inside its own frame (/frame: the
    // viewer keeps one view's state per page, so two views side by side need two pages)
    const frames = ["a", "b"].map((k) => {
      const f = el("iframe", { id: "pair-frame-" + k, src: "/frame", title: `text ${k.toUpperCase()}: explain view`, cls: "pair-frame" });
      f.ready = new Promise((r) => f.addEventListener("load", r, { once: true }));
      return f;
    });
    const pairViews = el("div", { id: "live-pair-views", cls: "pair-views", hidden: true }, frames);
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Minimal pair" }),
      el("div", { cls: "controls" }, "A", pa), el("div", { cls: "controls" }, "B", pb),
      el("button", { id: "live-pair-go", text: "compare", onclick: () => pair() }), pairOut, pairViews));

    const viewRoot = el("div", { id: "live-view" });
    root.appendChild(viewRoot);

    function fillMenu() {
      const m = models.find((x) => x.name === modelSel.value) || models[0];
      repSel.textContent = ""; repSel.appendChild(el("option", { value: "", text: "menu..." }));
      for (const r of m.replacements) repSel.appendChild(el("option", { value: r.token, text: `${r.token} (${r.why})` }));
    }
    modelSel.addEventListener("change", fillMenu); fillMenu();

    // ---- requests, progress, errors ----
    const jobId = () => Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");
    async function call(path, body, what) {
      if (live.busy) { error.textContent = "a computation is running: wait for it to finish"; return null; }
      live.busy = true; error.textContent = ""; bar.hidden = false; status.dataset.state = "running"; status.textContent = what + "...";
      const job = jobId(); body.job = job; body.model = modelSel.value;
      let done = false;
      const poll = async () => {
        while (!done) {
          await new Promise((r) => setTimeout(r, 300));
          if (done) break;
          try {
            const r = await fetch("/api/progress/" + job, { credentials: "same-origin" });
            if (r.ok && !done) showProgress(what, await r.json());
          } catch (e) { /* the answer itself reports failures */ }
        }
      };
      poll();
      const t0 = performance.now();
      bar.removeAttribute("value");
      try {
        const r = await fetch(path, { method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
        let data = null;
        try { data = await r.json(); } catch (e) { data = { error: `the server answered ${r.status} without JSON` }; }
        if (!r.ok || data.error) { error.textContent = data.error || `the server answered ${r.status}`; status.dataset.state = "error"; status.textContent = what + " failed"; return null; }
        status.dataset.state = "done"; status.textContent = `${what}: done in ${fmt((performance.now() - t0) / 1000, 2)} s`;
        live.lastId = data.id; saveBtn.disabled = false; saved.textContent = "";
        return data;
      } catch (e) {
        error.textContent = "the server cannot be reached (is streetlamp serve still running?)"; status.dataset.state = "error"; return null;
      } finally { done = true; live.busy = false; bar.hidden = true; }
    }

    function showProgress(what, p) {
      const s = p.step;
      status.textContent = `${what}: ${p.stage}${p.state === "queued" && p.position ? ` (${p.position} ahead in the queue)` : ""}` +
        (s ? ` (${s.what} ${s.done}/${s.total})` : "") + `, ${fmt(p.elapsed, 1)} s`;
      if (s && s.total > 0) { bar.max = s.total; bar.value = s.done; status.dataset.done = String(s.done); status.dataset.total = String(s.total); }
      else { bar.removeAttribute("value"); delete status.dataset.done; delete status.dataset.total; }
    }

    function predLine(p) {
      pred.textContent = `prediction: ${q(p.label)} (p = ${fmt(p.prob)})` + (p.explained.index !== p.index ? `; explained: ${q(p.explained.label)} (p = ${fmt(p.explained.prob)})` : "");
      pred.dataset.label = p.label; pred.dataset.prob = String(p.prob);
    }

    async function show(data) {
      live.shown = data; live.lastId = data.id; saved.textContent = "";
      predLine(data.prediction);
      await S.render(data.view.model, data.view.blobs, viewRoot);
      live.token = null; showToken();
      viewRoot.setAttribute("data-shown", data.kind);
    }

    async function explain() {
      const methods = methodBoxes.map((l) => l.firstChild).filter((b) => b.checked).map((b) => b.dataset.method);
      const data = await call("/api/explain", { text: text.value, truncate: trunc.checked, methods }, "explain");
      if (!data) return;
      live.base = data; live.baseText = text.value; live.baseTrunc = trunc.checked; live.heads = []; showHeads(); result.textContent = "";
      live.edits = []; live.history = []; showHistory();
      await show(data);
    }

    // ---- token actions ----
    function labels() { return (live.shown && live.shown.view.model.manifest.token_labels) || []; }
    const current = () => (live.history.length ? live.history[live.history.length - 1] : live.base);
    function showToken() {
      const ok = live.token !== null && live.shown === current();
      removeBtn.disabled = replaceBtn.disabled = !ok;
      if (!live.base) tokLine.textContent = "explain a text first";
      else if (live.shown !== current()) tokLine.textContent = "showing another result: reset or undo to edit tokens";
      else if (live.token === null) tokLine.textContent = live.edits.length
        ? "click a token in the strip below to edit the edited text further (the edit applies on top of the ones above)"
        : "click a token in the strip below to remove or replace it";
      else tokLine.textContent = `token ${live.token} ${q(labels()[live.token])} selected`;
    }
    viewRoot.addEventListener("click", (ev) => {
      const t = ev.target.closest && ev.target.closest(".tok");
      if (t && viewRoot.contains(t)) { live.token = +t.dataset.i; showToken(); return; }
      const c = ev.target.closest && ev.target.closest("canvas.thumb");
      if (c && viewRoot.contains(c) && +c.dataset.h >= 0 && live.shown === live.base) {
        const l = +c.dataset.l, h = +c.dataset.h, k = live.heads.findIndex((x) => x[0] === l && x[1] === h);
        if (k >= 0) live.heads.splice(k, 1); else live.heads.push([l, h]);
        showHeads(); if (live.heads.length) ablate(); else result.textContent = "";
      }
    });

    async function edit(op) {
      if (live.token === null || !live.base) return;
      const e = { position: live.token, op };
      if (op === "replace") { e.replacement = repIn.value || repSel.value; if (!e.replacement) { error.textContent = "choose a replacement from the menu or type one token"; return; } }
      const body = { text: live.baseText, truncate: live.baseTrunc, edits: [...live.edits, e], methods: live.base.view.model.manifest.live.methods };
      const data = await call("/api/edit", body, op === "remove" ? "removing the token" : "replacing the token");
      if (!data) return;
      live.edits.push(e); live.history.push(data); showHistory();
      await show(data);
      editResult(data.edit);
    }
    // the edit history: each edit applies on top of the previous ones; undo drops the last, reset all of them
    function showHistory() {
      historyBox.textContent = "";
      undoBtn.disabled = resetBtn.disabled = !live.edits.length;
      if (!live.edits.length) return;
      const b = live.base.prediction;
      historyBox.appendChild(el("ol", { id: "edit-history" },
        el("li", { cls: "orig", "data-step": "0", "data-prob": String(b.explained.prob) }, `original text: p(${q(b.explained.label)}) = ${fmt(b.explained.prob)}`),
        live.history[live.history.length - 1].edit.edits.map((e, k) => el("li", { "data-step": String(k + 1), "data-prob": String(e.after.explained.prob) },
          `${e.description}: p(${q(e.after.explained.label)}) = ${fmt(e.after.explained.prob)}, prediction ${q(e.after.label)}`))));
    }
    async function undo() {
      if (!live.edits.length || live.busy) return;
      live.edits.pop(); live.history.pop(); showHistory();
      const data = current(); // the numbers first, then the (slower) view: never a new strip beside old numbers
      if (data === live.base) result.textContent = ""; else editResult(data.edit);
      await show(data);
    }
    async function reset() {
      if (live.busy) return;
      live.edits = []; live.history = []; showHistory(); result.textContent = "";
      await show(live.base);
    }
    function editResult(e) {
      result.textContent = "";
      const b = e.before, a = e.after;
      result.appendChild(el("p", { cls: "sentence", id: "edit-sentence" }, `${e.description}: prediction ${q(a.label)} (p = ${fmt(a.prob)}), was ${q(b.label)} (p = ${fmt(b.prob)}); `,
        `p(${q(a.explained.label)}) ${fmt(b.explained.prob)} → `, el("b", { id: "edit-explained-prob", "data-value": String(a.explained.prob), text: fmt(a.explained.prob) }),
        ` (change ${fmt(e.change)}).`));
      result.appendChild(el("div", { id: "edit-pred", cls: "readout", "data-label": a.label, "data-prob": String(a.prob), "data-index": String(a.index) },
        `edited input: ${q(a.label)} p = ${fmt(a.prob)}`));
      const rows = e.layers.map((r) => [String(r.layer), r.attention_mean, r.attention_max, r.attention_max_head, r.explained_distance, r.token_distance]);
      result.appendChild(el("div", { cls: "note", text: `${e.attention}; distance: ${e.distance}. Attention says how much the explained position read the token; the distance says how much its representation actually changed without it` +
        (e.edits.length > 1 ? ` (all ${e.edits.length} edits together, against the original text; the token column is the last edit's).` : ".") }));
      result.appendChild(L.table([{ title: "layer", text: true }, { title: "attention on the token (head mean)" }, { title: "max over heads" }, { title: "head" },
        { title: `cos distance at the explained position` }, { title: "cos distance at the token" }], rows, { id: "edit-table" }));
    }

    // ---- head ablation ----
    function showHeads() {
      headLine.textContent = live.heads.length ? `heads to ablate: ${live.heads.map((x) => `L${x[0]}.H${x[1]}`).join(", ")} (click a thumbnail again to drop it)`
        : "click a head's thumbnail in the grid below to ablate it (click more to ablate several)";
    }
    ablSel.addEventListener("change", () => { if (live.heads.length) ablate(); });
    async function ablate() {
      const data = await call("/api/ablate", { text: live.baseText, truncate: live.baseTrunc, heads: live.heads.slice(), ablation: ablSel.value }, "ablating");
      if (!data) return;
      result.textContent = "";
      const c = data.clean, j = data.joint;
      result.appendChild(el("p", { cls: "sentence", id: "ablate-sentence" }, `${data.ablation} ablation of ${data.heads.length} head(s): p(${q(c.explained.label)}) ${fmt(c.explained.prob)} → `,
        el("b", { id: "ablate-joint", "data-value": String(j.effect), "data-prob": String(j.prob), text: fmt(j.prob) }), ` (change ${fmt(j.effect)}); prediction ${q(j.prediction.label)}.`));
      result.appendChild(el("div", { cls: "note", text: `change: ${data.effect}; attention mass: ${data.attention_mass}` }));
      const rows = data.heads.map((r) => [r.layer, r.head, r.attention_mass, r.attention_max, r.prob, r.effect, r.prediction]);
      result.appendChild(L.table([{ title: "layer" }, { title: "head" }, { title: "attention mass" }, { title: "attention max" }, { title: "p ablated alone" },
        { title: "change" }, { title: "prediction", text: true }], rows, { id: "ablate-table", key: (i) => `${rows[i][0]}.${rows[i][1]}` }));
    }

    // ---- minimal pair ----
    async function frameView(f, view) {
      await f.ready;
      const w = f.contentWindow, d = f.contentDocument;
      // objects of the frame's own realm (the viewer may test them), then the report's renderer there
      await w.streetlamp.render(w.JSON.parse(JSON.stringify(view.model)), w.JSON.parse(JSON.stringify(view.blobs)), d.getElementById("app"));
      const fit = () => { f.style.height = (d.documentElement.scrollHeight + 4) + "px"; };
      fit(); if (!f.observer) { f.observer = new w.ResizeObserver(fit); f.observer.observe(d.body); }
    }
    async function pair() {
      const methods = methodBoxes.map((l) => l.firstChild).filter((b) => b.checked).map((b) => b.dataset.method);
      pairViews.dataset.shown = "0";
      const data = await call("/api/pair", { text_a: pa.value, text_b: pb.value, truncate: trunc.checked, methods }, "comparing");
      if (!data) return;
      pairOut.textContent = "";
      const A = data.a.prediction, B = data.b.prediction;
      pairOut.appendChild(el("p", { cls: "sentence", id: "pair-sentence" }, `A: ${q(A.label)} (p = ${fmt(A.prob)}); B: ${q(B.label)} (p = ${fmt(B.prob)}); ${data.explained}: A ${fmt(A.explained.prob)}, B `,
        el("b", { id: "pair-b-prob", "data-value": String(B.explained.prob), text: fmt(B.explained.prob) }), ` (change ${fmt(data.change)}).`));
      pairOut.appendChild(el("div", { cls: "kv" }, el("div", { cls: "k", text: "A" }), el("div", { cls: "v", id: "pair-a-text", text: data.a.text }),
        el("div", { cls: "k", text: "B" }), el("div", { cls: "v", id: "pair-b-text", text: data.b.text })));
      const orows = data.outputs.map((r) => [r.label, r.p_a, r.p_b, r.diff]);
      pairOut.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Difference of the outputs" }),
        el("div", { cls: "note", text: data.outputs_meaning }),
        L.table([{ title: "output", text: true }, { title: "p (A)" }, { title: "p (B)" }, { title: "p (B) - p (A)" }], orows, { id: "pair-outputs", key: (i) => String(data.outputs[i].index) })));
      if (!data.same_length) pairOut.appendChild(el("div", { cls: "note", id: "pair-note", text: data.note }));
      else {
        pairOut.appendChild(el("div", { cls: "note", text: `tokens that differ: ${data.differing.map((j) => `${j} ${q(data.a.tokens[j])} → ${q(data.b.tokens[j])}`).join(", ") || "none"}` }));
        const grid = (id, rows, title, note, signed) => {
          const Lh = rows.length, Hh = rows[0].length, flat = new Float32Array(Lh * Hh);
          rows.forEach((r, l) => r.forEach((v, h) => { flat[l * Hh + h] = v; }));
          return L.valueGrid(id, flat, Lh, Hh, { title, rowName: "layer", colName: "head", signed, hi: signed ? undefined : 1, note });
        };
        pairOut.appendChild(el("div", { cls: "pair-grids" },
          grid("pair-tv", data.row_tv, "How differently each head reads the two texts", data.tv_meaning, false),
          data.differing.length ? grid("pair-diff", data.on_differing, "Attention on the differing token(s), B minus A", data.on_differing_meaning, true) : null));
      }
      pairViews.hidden = false;
      await Promise.all([frameView(frames[0], data.a.view), frameView(frames[1], data.b.view)]);
      pairViews.dataset.shown = "1";
    }

    async function save() {
      if (!live.lastId) return;
      saveBtn.disabled = true;
      try {
        const r = await fetch("/api/save", { method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ id: live.lastId }) });
        const d = await r.json();
        if (!r.ok || d.error) { error.textContent = d.error || `the server answered ${r.status}`; return; }
        saved.textContent = `saved: ${d.folder} (open it with: streetlamp report ${d.folder})`; saved.dataset.folder = d.folder;
      } catch (e) { error.textContent = "the server cannot be reached"; } finally { saveBtn.disabled = false; }
    }
    showToken();
  };
})();
