"""`score --against-model --html PAGE`: a text scored against a base as one offline page: the text with
each scored token's background as strong as its KL divergence (hover for its figures), llama-perplexity's
main statistics above it, and the tails below. Every text from the models reaches the page only as JSON
inside a script element (with `<` escaped) and is inserted with textContent."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from tokenviz.files.atomic import write_file

CSS = """
body{font:15px/1.6 system-ui,sans-serif;margin:1.5em;background:#fbfbfa;color:#1d1f21}
.dim{color:#6b6f73} #text{white-space:pre-wrap;font-family:ui-monospace,monospace;border:1px solid #ccc;padding:1em}
.t{border-radius:2px} .unscored{color:#8a8e92} .changed{outline:1px solid #b00020}
table{border-collapse:collapse;margin-top:1em} td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:left}
#facts span{margin-right:1.5em}
"""

SCRIPT = """
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
const S = D.statistics, byKld = S.mean_kld !== null;  // (no KLD where a side gave its top N only: by |Δp|)
const measure = (k) => byKld ? D.scored.kld[k] : Math.abs(D.scored.dp[k]);
const largest = D.scored.index.reduce((most, _, k) => Math.max(most, measure(k)), 1e-12);
const scored = new Map(D.scored.index.map((index, k) => [index, k]));
const pct = (x) => (100 * x).toFixed(2) + "%";
const kldFacts = byKld ? [["mean KLD", S.mean_kld.toFixed(6)], ["max KLD", S.max_kld.toFixed(4)]]
  : [["KLD", "not given"]];
for (const [name, value] of [...kldFacts,
    ["RMS Δp", pct(S.rms_dp)], ["same top p", pct(S.same_top_p)], ["PPL(Q)/PPL(base)", S.ppl_ratio.toFixed(4)]]) {
  const span = document.createElement("span"); span.textContent = `${name}: ${value}`; $("facts").appendChild(span);
}
D.pieces.forEach((piece, index) => {
  const span = document.createElement("span");
  span.textContent = piece;
  span.dataset.index = index;
  const k = scored.get(index);
  if (k === undefined) { span.className = "t unscored"; }
  else {
    const kld = D.scored.kld[k];
    span.className = "t" + (D.scored.changed[k] ? " changed" : "");
    span.dataset.kld = kld;
    span.style.background = `rgba(214, 40, 40, ${Math.sqrt(Math.max(measure(k), 0) / largest).toFixed(3)})`;
    span.title = `token ${index}: KLD ${byKld ? kld.toFixed(4) : "not given"}`
      + ` · Δp ${(100 * D.scored.dp[k]).toFixed(2)}%`
      + (D.scored.changed[k] ? " · the top-1s differ" : "");
  }
  $("text").appendChild(span);
});
for (const t of byKld ? D.tails.by_kld : D.tails.by_dp) {
  const row = document.createElement("tr");
  const from = t.lens ? t.lens.parted_from : null;  // a lens row: 0 the embeddings, i after layer i - 1
  const lens = from === null ? "—" : from === 0 ? "emb" : `L${from - 1}`;
  for (const cell of [t.index, t.before + " ▸ " + t.text, byKld ? t.kld.toFixed(4) : "—", (100 * t.dp).toFixed(2) + "%",
      `${t.top[0].text} ${t.top[0].prob.toFixed(3)}`, `${t.base_top[0].text} ${t.base_top[0].prob.toFixed(3)}`, lens]) {
    const td = document.createElement("td"); td.textContent = String(cell); row.appendChild(td);
  }
  $("tails").appendChild(row);
}
"""


def quantization_page(document: dict[str, Any]) -> str:
    """The page of a score-against-base document (journey.against_base)."""
    payload = json.dumps(document, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")
    q, base = document["model"]["name"], document["base"]["name"]
    title = escape(f"tokenviz · {q} against {base}")
    by_kld = document["statistics"]["mean_kld"] is not None
    measure = "KL divergence KL(base ‖ Q)" if by_kld else "|Δp| (a side gave its top N only: no KLD)"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width"><title>{title}</title><style>{CSS}</style></head>'
        f'<body><header><h1>{title}</h1><div id="facts"></div>'
        f'<p class="dim">{document["windows"]} windows of {document["window"]} tokens, the second half of each '
        f"scored as llama-perplexity scores it; a token's background is as strong as its {escape(measure)} "
        "(√ of its share of the largest), outlined where the two top-1s differ; hover for its figures.</p></header>"
        '<div id="text"></div>'
        f"<h2>Where they differ most, by {'KLD' if by_kld else '|Δp|'}</h2><table><thead><tr><th>#</th>"
        "<th>text ▸ token</th><th>KLD</th>"
        "<th>Δp</th><th>Q's top</th><th>base's top</th><th>parted from</th></tr></thead><tbody id=\"tails\">"
        "</tbody></table>"
        '<footer class="dim">Made by tokenviz: every number is the one the models computed.</footer>'
        f'<script type="application/json" id="data">{payload}</script><script>{SCRIPT}</script></body></html>\n'
    )


def save_quantization_page(path: str | Path, document: dict[str, Any], replace: bool = False) -> Path:
    """Write the page atomically; an existing file is replaced only with `replace`."""
    return write_file(path, quantization_page(document), replace=replace)
