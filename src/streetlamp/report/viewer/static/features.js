/* streetlamp report viewer: the feature dashboard (streetlamp features). The text's tokens as a strip shaded by
 * the chosen feature's activation (click a token for its top features), the shown features as a table, and a
 * feature's dashboard: its density and decile boundaries over the corpus, the tokens its decoder direction
 * promotes and suppresses, its top activating contexts and contexts by decile, each token shaded by the
 * feature's activation there and the context's largest outlined. Every token is text (textContent), never HTML. */
(function () {
  "use strict";
  const S = window.streetlamp, L = S.lib, el = L.el, fmt = L.fmt, MAN = L.MAN, state = L.state;

  S.views.features = async function (root) {
    const D = MAN.dashboard || {}, feats = D.features || [], toks = D.text_tokens || [], tops = D.token_top || [];
    const C = MAN.corpus || {};
    root.appendChild(L.header("streetlamp features", `${MAN.model || ""}; feature set ${(MAN.feature_set || {}).source || ""} (${(MAN.feature_set || {}).format || ""})`));
    root.appendChild(el("p", { cls: "sub", text: `corpus ${C.spec}: ${C.sequences} texts, ${C.tokens} tokens (at most ${C.seq_len} per text, the separator included); seed ${MAN.seed}; shown: ${MAN.selection || ""}` }));
    const textActs = await L.arr("text_activations"), F = textActs.shape[1];
    const ctxSeq = await L.arr("context_sequence"), ctxGroup = await L.arr("context_group"), ctxActs = await L.arr("context_activations");
    const slots = ctxSeq.shape[1], W = ctxActs.shape[2];
    const byName = {}; feats.forEach((f, i) => { byName[f.name] = i; });
    let cur = Math.max(0, Math.min(F - 1, parseInt(state.feature, 10) || 0));
    const scaleOf = (i) => Math.max(feats[i].max_activation || 0, feats[i].max_activation_on_text || 0) || 1;
    const tokSpan = (text, v, scale, extra) => {
      const c = L.seq(Math.max(0, v) / scale);
      return el("span", { cls: "tok" + (extra || ""), text, title: `activation ${fmt(v)}`, "data-value": String(v), style: `background:${L.css(c)};color:${L.ink(c)}` });
    };

    // ---------- the text's tokens ----------
    const strip = el("div", { cls: "tokens", id: "feat-strip" });
    const tokInfo = el("div", { id: "feat-token", cls: "note", text: "click a token for its most active features (over every dictionary of the set)" });
    function drawStrip() {
      strip.textContent = "";
      const sc = scaleOf(cur);
      toks.forEach((t, p) => {
        const s = tokSpan(t, textActs.data[p * F + cur], sc, state.token === String(p) ? " lock" : "");
        s.setAttribute("data-position", String(p));
        s.addEventListener("click", () => { state.token = String(p); L.writeHash(); drawStrip(); openToken(p); });
        strip.appendChild(s); strip.appendChild(document.createTextNode(" "));
      });
    }
    function openToken(p) {
      tokInfo.textContent = "";
      tokInfo.appendChild(el("div", { text: `token ${p} (${toks[p]}): its ${(tops[p] || []).length} most active features` }));
      const rows = (tops[p] || []).map(([n, v]) => [n, v, n in byName ? "shown" : ""]);
      tokInfo.appendChild(L.table([{ title: "feature", text: true }, { title: "activation" }, { title: "dashboard", text: true }], rows,
        { id: "feat-token-table", onclick: (r) => { if (rows[r][0] in byName) openFeature(byName[rows[r][0]]); }, key: (r) => rows[r][0] }));
    }
    const stripNote = el("div", { cls: "note", id: "feat-strip-note" });
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "The text, shaded by the chosen feature's activation" }), stripNote, strip, tokInfo));

    // ---------- the shown features ----------
    const list = feats.map((f) => [f.name, f.max_activation_on_text, f.density, f.sequence_density, f.mean_activation_when_active, f.max_activation]);
    root.appendChild(el("div", { cls: "panel" }, el("h2", { text: "Shown features (click one for its dashboard)" }),
      L.table([{ title: "feature", text: true }, { title: "max on text" }, { title: "density (tokens)" }, { title: "density (texts)" }, { title: "mean when active" }, { title: "max over corpus" }], list,
        { id: "feat-list", onclick: (r) => openFeature(r), key: (r) => feats[r].name })));

    // ---------- a feature's dashboard ----------
    const dash = el("div", { cls: "panel", id: "feat-dash" });
    root.appendChild(dash);
    function context(i, j) {
      const q = ctxSeq.data[i * slots + j], g = ctxGroup.data[i * slots + j];
      const sq = (D.sequences || {})[String(q)] || { tokens: [], source: "" };
      const n = Math.min(sq.tokens.length, W), sc = scaleOf(i);
      let best = 0; for (let k = 1; k < n; k++) if (ctxActs.data[(i * slots + j) * W + k] > ctxActs.data[(i * slots + j) * W + best]) best = k;
      const line = el("div", { cls: "tokens feat-ctx", "data-sequence": String(q), "data-group": String(g), "data-max-index": String(best) });
      for (let k = 0; k < n; k++) {
        line.appendChild(tokSpan(sq.tokens[k], ctxActs.data[(i * slots + j) * W + k], sc, k === best ? " sel" : ""));
      }
      return el("div", {}, el("div", { cls: "note", text: `text ${q} (${sq.source}); largest activation ${fmt(ctxActs.data[(i * slots + j) * W + best])} at ${JSON.stringify(sq.tokens[best] ?? "")}` }), line);
    }
    function openFeature(i) {
      cur = i; state.feature = String(i); L.writeHash();
      const f = feats[i];
      stripNote.textContent = `shaded by ${f.name}: 0 .. ${fmt(scaleOf(i), 3)} (its largest activation on the text or the corpus)`;
      drawStrip();
      dash.textContent = ""; dash.setAttribute("data-feature", f.name);
      dash.appendChild(el("h2", { text: `${f.name}: layer ${f.layer}, ${f.site === "mlp" ? "transcoder (mlp)" : "SAE (resid_pre)"}, latent ${f.index}` }));
      dash.appendChild(L.kv({
        "max on the text": fmt(f.max_activation_on_text), "density": `${fmt(100 * f.density, 3)}% of tokens (${f.tokens_active} tokens)`,
        "texts where it fires": `${fmt(100 * f.sequence_density, 3)}%`, "mean when active": fmt(f.mean_activation_when_active), "max over the corpus": fmt(f.max_activation),
        "decile boundaries (q10..q90)": (f.decile_bounds || []).map((x) => fmt(x, 3)).join(", ") + (f.deciles_exact ? " (every firing text)" : " (estimated on a uniform sample)"),
      }, 0));
      dash.appendChild(L.legend("seq", 0, scaleOf(i)));
      const lists = el("div", { cls: "row" });
      for (const [what, items, id] of [["promotes", f.promoted || [], "feat-promoted"], ["suppresses", f.suppressed || [], "feat-suppressed"]]) {
        lists.appendChild(el("div", {}, el("h3", { text: `its decoder direction ${what}` }),
          L.table([{ title: "token", text: true }, { title: "logit effect" }], items.map(([t, v]) => [t, v]), { id })));
      }
      dash.appendChild(el("div", { cls: "note", text: `through the unembedding: ${MAN.logits || ""}` }));
      dash.appendChild(lists);
      const groups = [[0, "Top activating contexts"]];
      for (let d = 10; d >= 1; d--) groups.push([d, `Decile ${d} of the texts where it fires${d === 10 ? " (the top tenth)" : ""}`]);
      for (const [g, title] of groups) {
        const js = []; for (let j = 0; j < slots; j++) if (ctxSeq.data[i * slots + j] >= 0 && ctxGroup.data[i * slots + j] === g) js.push(j);
        if (!js.length) continue;
        dash.appendChild(el("div", { cls: "feat-group", "data-group": String(g) }, el("h3", { text: title }), js.map((j) => context(i, j))));
      }
    }
    drawStrip();
    if (F > 0) openFeature(cur);
    const t0 = parseInt(state.token, 10);
    if (Number.isFinite(t0) && t0 >= 0 && t0 < toks.length) openToken(t0);
    S.featuresOpen = openFeature;
  };
})();
