"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
const el = (tag, text, cls) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls; return e; };
const visible = (t) => t === "" ? "∅" : t.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "⇥");
const p4 = (p) => p === null || p === undefined ? "·" : p.toFixed(4);
const V = D.view || {};
const GIVER = D.model.numbers_of || D.model.name;  // whose top N a step's is (ModelInfo.giver)
// Where the app was: its cursor (else, as the app, the newest token a step was made after: a stopped
// journey's last token has none), layer (else the last) and head.
const newest = Math.min(D.chips.length - 1, D.prompt_len - 2 + D.steps.length);
let selected = V.cursor === null || V.cursor === undefined ? newest : Math.min(V.cursor, D.chips.length - 1);
let weights = null;

function facts() {
  const m = D.model, s = D.settings;
  // A served model's shape is known only where its internals were read; its distribution is a top N.
  const shape = m.layers ? `${m.layers} layers · ${m.heads} heads · ` : "";
  const served = m.covers ? `${GIVER}'s top ${m.covers} log-probabilities a step · ` : "";
  $("facts").textContent = `${m.device} · ${m.dtype} · ${shape}${served}`
    + (s.temperature === 0 ? "greedy" : `temperature ${s.temperature} · top-k ${s.top_k || "off"} · top-p ${s.top_p}`)
    + ` · seed ${s.seed}` + (s.grammar ? ` · grammar ${s.grammar.kind} ${s.grammar.source}` : "")
    + (D.steps.some((step) => step.interventions.length) ? " · interventions (see each step)" : "");
  $("text").textContent = D.chips.map((c) => c[1]).join("");
}

function chips() {
  D.chips.forEach((c, i) => {
    const b = el("button", visible(c[2] && c[3] ? `⟨${c[1]}⟩` : c[1]), "chip" + (c[2] ? "" : " gen"));
    b.appendChild(el("span", String(c[0]), "id"));
    b.dataset.index = i;
    b.addEventListener("click", () => select(i));
    $("tokens").appendChild(b);
  });
}

function bar(p, cls) { const d = el("div", undefined, cls); d.style.width = `${Math.max(0, Math.min(1, p || 0)) * 100}%`; return d; }

function candidates(rows, chosenId, withFinal) {
  const t = el("table"), head = el("tr");
  ["#", "token", "id", "raw p", ...(withFinal ? ["final p"] : []), ""].forEach((h, k) => head.appendChild(el("th", h, k === 1 ? "tok" : "")));
  t.appendChild(head);
  rows.forEach((r, k) => {
    const tr = el("tr", undefined, r[0] === chosenId ? "chosen" : "");
    tr.appendChild(el("td", String(k + 1)));
    tr.appendChild(el("td", visible(r[1]), "tok"));
    tr.appendChild(el("td", String(r[0])));
    tr.appendChild(el("td", p4(r[2]), "raw"));
    if (withFinal) tr.appendChild(el("td", r[3] === 0 ? "—" : p4(r[3]), "final"));  // (dropped by a stage: as the app)
    const cell = el("td", undefined, "barcell");
    cell.appendChild(bar(r[2], "bar"));
    if (withFinal) cell.appendChild(bar(r[3], "bar final"));
    tr.appendChild(cell);
    t.appendChild(tr);
  });
  return t;
}

// The logit lens the journey kept at a position: each layer's top token and the chosen token's rank and p.
function lensTable(rows, chosen) {
  const wrap = el("div", undefined, "lens");
  wrap.appendChild(el("h3", `logit lens: each layer's residual through the output head (${visible(chosen[1])}'s rank and p)`));
  const t = el("table"), head = el("tr");
  ["layer", "top-1", "p", "rank", `p(${visible(chosen[1])})`].forEach((h, k) => head.appendChild(el("th", h, k === 1 ? "tok" : "")));
  t.appendChild(head);
  rows.forEach((r) => {
    const tr = el("tr", undefined, r[1] === chosen[0] ? "chosen" : "");
    tr.appendChild(el("td", r[6]));  // (the row's label as the app shows it: emb, L0, ...)
    tr.appendChild(el("td", visible(r[2]), "tok"));
    tr.appendChild(el("td", p4(r[3])));
    tr.appendChild(el("td", String(r[4])));
    tr.appendChild(el("td", p4(r[5])));
    t.appendChild(tr);
  });
  wrap.appendChild(t);
  return wrap;
}

// A sparse autoencoder's reading of the residual at a position: its strongest features, each labelled by
// the tokens its decoder row promotes (or its description, where the trace had one).
function featureTable(r) {
  const wrap = el("div", undefined, "lens");
  wrap.appendChild(el("h3", `SAE ${r.sae}, the residual after layer ${r.layer}: L0 ${r.l0}, `
    + `error ${(r.error * 100).toFixed(1)}%`));
  const t = el("table"), head = el("tr");
  ["feature", "activation", "share", "promotes"].forEach((h, k) => head.appendChild(el("th", h, k === 3 ? "tok" : "")));
  t.appendChild(head);
  r.features.slice(0, 12).forEach((f) => {
    const label = D.features.labels[`${r.sae}#${f.id}`];
    const tr = el("tr");
    tr.appendChild(el("td", `#${f.id}`));
    tr.appendChild(el("td", f.activation.toFixed(3)));
    tr.appendChild(el("td", `${(f.share * 100).toFixed(1)}%`));
    const said = !label ? "" : label.description || label.promotes.map(visible).join(" ");
    tr.appendChild(el("td", said, "tok"));
    t.appendChild(tr);
  });
  wrap.appendChild(t);
  return wrap;
}

// As in the app, a token shows what the model predicted after it: the last prompt token, the first step;
// the newest token, the step pending (computed, its token not taken yet).
function showStep(i) {
  const box = $("step"); box.replaceChildren();
  const step = D.steps[i - D.prompt_len + 1];
  if (step) {
    // Numbered as the app numbers them: the step that chose the k-th generated token is step k, and the
    // one pending after k tokens (the status line's "step k") is the next, not yet a step of its own.
    const pending = step.index >= D.chips.length - D.prompt_len;
    const named = pending ? `pending, after step ${step.index}` : `step ${step.index + 1}`;
    box.appendChild(el("h2", `${named}: ${visible(step.chosen[1])} (id ${step.chosen[0]}), after `
      + `${visible(D.chips[i][1])} at position ${i}` + (pending ? " · computed, not taken yet" : "")));
    box.appendChild(el("p", `${step.mode} · final p ${p4(step.chosen_prob)} (rank ${step.chosen_rank}) · raw p ${p4(step.raw_prob)} `
      + `(rank ${step.raw_rank}) · entropy ${D.model.covers ? "≥ " : ""}${step.entropy.toFixed(2)} bits`
      + (step.u === null ? "" :
      ` · draw u = ${step.u.toFixed(4)} in band [${step.band[0].toFixed(4)}, ${step.band[1].toFixed(4)})`)));
    if (step.interventions.length) {  // the distribution above is the intervened model's, not its own
      box.appendChild(el("p", `interventions in force: ${step.interventions.join("; ")}`, "intervened"));
    }
    box.appendChild(candidates(step.top, step.chosen[0], true));
    if (step.own) {
      const kl = (step.own.floor ? "≥ " : "") + (step.own.kl === null ? "∞" : step.own.kl.toFixed(3));
      box.appendChild(el("h3", `the model's own distribution, without the interventions (KL from it: ${kl} bits)`));
      box.appendChild(candidates(step.own.top, step.chosen[0], false));
    }
    const stages = el("ol");
    const topN = D.model.covers;  // a top N (a server's): the stages are recomputed here over it
    stages.appendChild(el("li", topN ? `raw: ${GIVER}'s top ${topN} log-probabilities (the rest of the vocabulary `
      + `unknown); the stages below are recomputed here over them, the draw is ${GIVER}'s` : "raw: the model's softmax"));
    const of = topN ? `of the top ${topN}'s mass` : "of the mass";
    step.stages.forEach((s) => stages.appendChild(el("li", `${s[0]} ${s[1]}: ${s[2]} tokens kept, ${(s[3] * 100).toFixed(1)}% ${of}`)));
    if (step.mode === "greedy") stages.appendChild(el("li", "greedy: the top token, with certainty"));
    box.appendChild(el("h3", "sampling stages")); box.appendChild(stages);
    const lens = D.lens[String(i)];
    if (lens) box.appendChild(lensTable(lens, step.chosen));
    const readings = D.features.at ? D.features.at[String(i)] : undefined;
    if (readings) readings.forEach((r) => box.appendChild(featureTable(r)));
    if (step.watch.length) {
      box.appendChild(el("h3", "watched tokens"));
      step.watch.forEach((w) => box.appendChild(el("p", `${visible(w[1])} (id ${w[0]}): raw p ${p4(w[2])}, final p ${p4(w[3])}, rank ${w[4]}`)));
    }
  } else {
    const pred = D.predictions[i];
    if (pred) {
      box.appendChild(el("h2", `prompt token ${i}: ${visible(D.chips[i][1])}`));
      box.appendChild(el("p", `the prefill's prediction after it, of the prompt's next token ${visible(D.chips[i + 1][1])}: `
        + `raw p ${p4(pred[3])}, rank ${pred[4]}`));
      box.appendChild(candidates(pred[1], pred[2], false));
    } else box.appendChild(el("p", "no prediction after this token was kept", "dim"));
  }
}

function select(i) {
  selected = Math.max(0, Math.min(D.chips.length - 1, i));
  document.querySelectorAll(".chip").forEach((b) => b.classList.toggle("sel", Number(b.dataset.index) === selected));
  showStep(selected);
  drawHeatmap();
}

async function inflate(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

function color(v) {  // v in 0..1 along the theme's heatmap stops
  const stops = D.heatmap.map((h) => [1, 3, 5].map((k) => parseInt(h.slice(k, k + 2), 16)));
  const x = v * (stops.length - 1), k = Math.min(Math.floor(x), stops.length - 2), f = x - k;
  return `rgb(${stops[k].map((c, j) => Math.round(c + (stops[k + 1][j] - c) * f)).join(",")})`;
}

function rowOf(pos, layer, head) {  // √weights of position pos over keys 0..pos, for one head or mean / max
  const a = D.attention, H = a.heads, n = pos + 1;
  let offset = weights.offsets[pos] + layer * H * n;
  const out = new Float32Array(n);
  for (let h = 0; h < H; h++, offset += n) {
    if (head !== "mean" && head !== "max" && Number(head) !== h) continue;
    for (let k = 0; k < n; k++) {
      const w = (weights.bytes[offset + k] / 255) ** 2;
      out[k] = head === "max" ? Math.max(out[k], w) : head === "mean" ? out[k] + w / H : w;
    }
  }
  return out;
}

function drawHeatmap() {
  const a = D.attention, canvas = $("heatmap"), ctx = canvas.getContext("2d");
  if (!a || !weights) { $("attention-note").textContent = a ? "" : "this journey carries no attention rows"; return; }
  const layer = Number($("layer").value), head = $("head").value, rows = a.positions;
  // Cells wide enough for a label each: a long journey's map is larger than its panel, which scrolls.
  const keys = rows[rows.length - 1] + 1, cell = Math.max(10, Math.min(14, Math.floor(560 / keys)));
  const left = 90, top = 70;  // room for the query labels (left) and the key labels (top)
  canvas.width = left + keys * cell; canvas.height = top + rows.length * cell;
  ctx.fillStyle = getComputedStyle(document.body).backgroundColor; ctx.fillRect(0, 0, canvas.width, canvas.height);
  rows.forEach((pos, r) => {
    const w = rowOf(pos, layer, head);
    for (let k = 0; k <= pos; k++) { ctx.fillStyle = color(Math.sqrt(w[k])); ctx.fillRect(left + k * cell, top + r * cell, cell, cell); }
    if (pos === selected) { ctx.strokeStyle = "white"; ctx.strokeRect(left, top + r * cell, (pos + 1) * cell, cell); }
  });
  ctx.fillStyle = getComputedStyle(document.body).color; ctx.font = "10px monospace";
  rows.forEach((pos, r) => ctx.fillText(visible(D.chips[pos][1]).slice(0, 12), 2, top + r * cell + cell - 2));
  for (let k = 0; k < keys; k++) { ctx.save(); ctx.translate(left + k * cell + cell - 2, top - 2); ctx.rotate(-Math.PI / 2);
    ctx.fillText(visible(D.chips[k][1]).slice(0, 10), 0, 0); ctx.restore(); }
  $("attention-note").textContent = `rows: the token reading (query), columns: the token read (key); colour by √weight; `
    + `${rows.length} of ${D.chips.length} rows kept; hover for a cell's weight`;
  const row = rows.indexOf(Math.max(selected, rows[0]));  // the selected token's row (its query) in view
  if (row >= 0) $("map").scrollTop = Math.max(0, top + row * cell - 120);
  canvas.onmousemove = (e) => {
    const box = canvas.getBoundingClientRect(), sx = canvas.width / box.width;
    const k = Math.floor(((e.clientX - box.left) * sx - left) / cell), r = Math.floor(((e.clientY - box.top) * sx - top) / cell);
    if (r < 0 || r >= rows.length || k < 0 || k > rows[r]) { $("hover").textContent = ""; return; }
    $("hover").textContent = `${visible(D.chips[rows[r]][1])} → ${visible(D.chips[k][1])}: ${rowOf(rows[r], layer, head)[k].toFixed(4)}`;
  };
}

async function attention() {
  const a = D.attention;
  if (!a) { drawHeatmap(); return; }
  for (let l = 0; l < a.layers; l++) $("layer").appendChild(new Option(`layer ${l}`, l));
  ["mean", "max"].forEach((h) => $("head").appendChild(new Option(h, h)));
  for (let h = 0; h < a.heads; h++) $("head").appendChild(new Option(`head ${h}`, h));
  $("layer").value = String(V.layer === null || V.layer === undefined ? a.layers - 1 : Math.min(V.layer, a.layers - 1));
  if ([...$("head").options].some((o) => o.value === String(V.head))) $("head").value = String(V.head);
  $("ramp").style.background = `linear-gradient(to right, ${D.heatmap.join(", ")})`;
  const bytes = await inflate(a.data), offsets = {};
  let at = 0;
  a.positions.forEach((p) => { offsets[p] = at; at += a.layers * a.heads * (p + 1); });
  weights = { bytes, offsets };
  $("layer").onchange = $("head").onchange = drawHeatmap;
  drawHeatmap();
}

document.addEventListener("keydown", (e) => {
  if (e.key === "ArrowLeft") select(selected - 1);
  if (e.key === "ArrowRight") select(selected + 1);
});
facts(); chips(); select(selected); attention();
