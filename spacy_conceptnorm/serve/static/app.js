// The curation page. Every element is built with createElement and text nodes: document text never becomes markup.
"use strict";

const PAGE_SIZE = 25;
const state = { offset: 0, total: 0, filters: {}, view: "mentions" };
let token = sessionStorage.getItem("token") || "";

(function readToken() {
  const match = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (match) {
    token = decodeURIComponent(match[1]);
    sessionStorage.setItem("token", token);
    history.replaceState(null, "", location.pathname + location.search);  // out of sight and history
  }
})();

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "onclick") node.addEventListener("click", value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path, body) {
  const headers = {};
  if (token) headers.Authorization = "Bearer " + token;
  const options = { headers };
  if (body !== undefined) {
    options.method = "POST";
    headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const response = await fetch(path, options);
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(data.error || "HTTP " + response.status);
  return data;
}

function notify(message, kind, extra) {
  const box = document.getElementById("notice");
  box.replaceChildren(el("p", { class: kind || "info" }, message), extra || "");
}

function fmt(value) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(3);
}

function concept(cid, name, matched, compact) {
  return el("span", { class: "concept", title: compact && matched ? `matched “${matched}”` : null },
    el("code", { class: "cid" }, cid || "NIL"),
    name ? el("span", { class: "cname" }, name) : null,
    matched && !compact ? el("span", { class: "matched", title: "the name that matched" }, "“" + matched + "”") : null);
}

function button(label, action, onclick, title) {
  return el("button", { type: "button", dataset: { action }, onclick, title }, label);
}

async function act(promise, describe) {
  try {
    const result = await promise;
    updateRows(result.rows || []);
    notify(describe(result), "ok", relinkedList(result));
    refreshStats();
    return result;
  } catch (error) {
    notify(error.message, "error");
  }
}

function relinkedList(result) {
  if (!result.event || result.event.action !== "synonym") return null;
  const others = (result.rows || []).filter((row) => row.relinked && row.id !== result.rows[0].id);
  const shown = 5;
  return el("ul", { class: "relinked-list" }, others.slice(0, shown).map((row) =>
    el("li", {}, "doc ", el("code", {}, row.doc_id), " ", el("mark", {}, row.text), " → ",
      concept(row.link.concept_id, row.link.concept_name))),
    others.length > shown ? el("li", {}, `and ${others.length - shown} more`) : null);
}

function decide(row, action, conceptId) {
  const body = conceptId ? { action, concept_id: conceptId } : { action };
  return act(api(`/api/mentions/${row.id}/decision`, body),
    (r) => `${r.event.action}: “${row.text}” → ${r.event.concept_id}`);
}

function addSynonym(row, conceptId) {
  return act(api(`/api/mentions/${row.id}/synonym`, { concept_id: conceptId }), (r) => {
    const n = r.rows.filter((x) => x.relinked).length;
    return `“${row.text}” is now a synonym of ${r.event.concept_id}; ${n} mention(s) of it re-linked.`;
  });
}

function conceptActions(row, cid, isLink) {
  return [
    isLink ? button("Accept", "accept", () => decide(row, "accept"))
           : button("Choose", "choose", () => decide(row, "choose", cid)),
    cid && cid !== "NIL" && !cid.includes("|")
      ? button("+ synonym", "synonym", () => addSynonym(row, cid), `add “${row.text}” as a name of ${cid}`) : null,
  ];
}

function searchBox(row) {
  const results = el("ul", { class: "results" });
  const input = el("input", { type: "search", placeholder: "search the KB by text or id", maxlength: 200,
    size: 28 });
  const run = async () => {
    if (!input.value.trim()) return;
    try {
      const data = await api("/api/search?" + new URLSearchParams({ q: input.value, limit: 8 }));
      results.replaceChildren(...data.results.map((c) =>
        el("li", {}, concept(c.concept_id, c.name, c.matched), el("span", { class: "score" }, fmt(c.score)),
          ...conceptActions(row, c.concept_id, false))));
      if (!data.results.length) results.replaceChildren(el("li", {}, "nothing found"));
    } catch (error) {
      notify(error.message, "error");
    }
  };
  input.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); run(); } });
  return el("div", { class: "search" }, input, button("Search", "search", run), results);
}

function contextOf(row) {
  const c = row.context;
  if (!c) return el("p", { class: "context" }, el("mark", {}, row.text));
  return el("p", { class: "context" }, c.cut_left ? "… " : "", c.left, el("mark", {}, c.mention), c.right,
    c.cut_right ? " …" : "");
}

function renderRow(row) {
  const link = row.link;
  const decision = row.decision;
  const others = row.candidates.filter((c) => c.concept_id !== link.concept_id);
  return el("article", { class: `row status-${row.status}${row.relinked ? " relinked" : ""}`,
    dataset: { id: row.id } },
    el("div", { class: "meta" },
      el("span", { class: "doc" }, "doc ", el("code", {}, row.doc_id)),
      el("span", { class: "label" }, row.label),
      row.assertion ? el("span", { class: `badge assertion assertion-${row.assertion}`,
        title: "assertion status (clinical_context)" }, row.assertion) : null,
      el("span", { class: "badge status" }, row.status),
      row.relinked ? el("span", { class: "badge relinked-badge",
        title: `was ${row.original_concept_id} in the annotate output` }, "re-linked") : null),
    contextOf(row),
    el("div", { class: "link" + (link.nil ? " nil" : "") },
      el("span", { class: "what" }, "linked"),
      concept(link.concept_id, link.concept_name, link.nil ? null : link.matched),
      el("span", { class: "score", title: "confidence (score)" }, `p=${fmt(link.confidence)} (s=${fmt(link.score)})`),
      ...conceptActions(row, link.concept_id, true),
      button("NIL", "nil", () => decide(row, "nil"), "no concept of the KB fits")),
    decision ? el("div", { class: "decision" }, el("span", { class: "what" }, decision.action),
      concept(decision.concept_id, decision.concept_name)) : null,
    row.parts && row.parts.length > 1 ? el("div", { class: "parts" }, "parts: ",
      row.parts.map((p) => el("span", { class: "part" }, p.text, " → ", el("code", {}, p.concept_id)))) : null,
    others.length ? el("ul", { class: "candidates" }, others.map((c) =>
      el("li", {}, concept(c.concept_id, c.name, c.matched, true), el("span", { class: "score" }, fmt(c.score)),
        ...conceptActions(row, c.concept_id, false)))) : null,
    searchBox(row));
}

function updateRows(rows) {
  for (const row of rows) {
    const old = document.querySelector(`#mentions article[data-id="${row.id}"]`);
    if (old) {
      const fresh = renderRow(row);
      fresh.classList.add("flash");
      old.replaceWith(fresh);
    }
  }
}

async function loadMentions() {
  const params = new URLSearchParams({ offset: state.offset, limit: PAGE_SIZE, ...state.filters });
  try {
    const data = await api("/api/mentions?" + params);
    state.total = data.total;
    const list = document.getElementById("mentions");
    list.replaceChildren(...data.rows.map(renderRow));
    if (!data.rows.length) list.append(el("p", { class: "empty" }, "No mention matches."));
    const last = Math.min(state.offset + PAGE_SIZE, data.total);
    document.getElementById("position").textContent =
      data.total ? `${state.offset + 1}–${last} of ${data.total}, worst first` : "";
    document.getElementById("prev").disabled = state.offset === 0;
    document.getElementById("next").disabled = last >= data.total;
  } catch (error) {
    notify(error.message, "error");
  }
}

async function loadNil() {
  try {
    const data = await api("/api/nil-clusters?limit=100");
    const method = data.method === "coder" ? "CODER++ term clustering" : "identical normalized text";
    document.getElementById("nil").replaceChildren(
      el("p", { class: "what" }, `${data.mentions} NIL mentions in ${data.total} groups (${method}); `,
        "each is a candidate new concept."),
      ...data.clusters.map((c) => el("article", { class: "cluster" },
        el("h3", {}, c.name, el("span", { class: "score" }, ` ${c.size} mentions, ${c.documents} documents`)),
        el("p", {}, c.texts.map((t) => el("span", { class: "term" }, `${t.text} ×${t.count}`))),
        button("Show", "show-cluster", () => { setFilters({ q: c.name, status: "all" }); showView("mentions"); }))));
  } catch (error) {
    notify(error.message, "error");
  }
}

async function refreshStats() {
  try {
    const info = await api("/api/info");
    document.getElementById("stats").textContent =
      `${info.reviewed} of ${info.mentions} mentions reviewed · ${info.documents} documents · ` +
      `${info.synonyms} synonym${info.synonyms === 1 ? "" : "s"} added`;
    document.getElementById("undo").disabled = !info.undo;
    document.getElementById("undo").title = info.undo ? `take back the latest decision (${info.undo})` : "";
    document.getElementById("save").hidden = !info.can_save;
    return info;
  } catch (error) {
    notify(error.message, "error");
  }
}

function setFilters(values) {
  const form = document.getElementById("filters");
  for (const [key, value] of Object.entries(values)) form.elements[key].value = value;
  readFilters();
}

function readFilters() {
  const form = document.getElementById("filters");
  state.filters = {};
  for (const key of ["concept", "label", "document", "status", "q"]) {
    const value = form.elements[key].value.trim();
    if (value) state.filters[key] = value;
  }
  state.offset = 0;
}

function showView(view) {
  state.view = view;
  document.getElementById("mentions").hidden = view !== "mentions";
  document.getElementById("pager").hidden = view !== "mentions";
  document.getElementById("filters").hidden = view !== "mentions";
  document.getElementById("nil").hidden = view !== "nil";
  document.getElementById("show-mentions").classList.toggle("active", view === "mentions");
  document.getElementById("show-nil").classList.toggle("active", view === "nil");
  return view === "nil" ? loadNil() : loadMentions();
}

async function start() {
  const info = await refreshStats();
  if (!info) return;
  const form = document.getElementById("filters");
  form.elements.label.append(...info.labels.map((l) => el("option", { value: l }, l)));
  form.elements.status.append(...info.statuses.map((s) => el("option", { value: s }, s)));
  form.addEventListener("submit", (e) => { e.preventDefault(); readFilters(); loadMentions(); });
  document.getElementById("prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - PAGE_SIZE); loadMentions();
  });
  document.getElementById("next").addEventListener("click", () => { state.offset += PAGE_SIZE; loadMentions(); });
  document.getElementById("show-mentions").addEventListener("click", () => showView("mentions"));
  document.getElementById("show-nil").addEventListener("click", () => showView("nil"));
  document.getElementById("undo").addEventListener("click", () => act(api("/api/undo", {}), (r) =>
    `undone: ${r.undone.action} of “${r.undone.text}” (${r.undone.concept_id})`));
  document.getElementById("save").addEventListener("click", async () => {
    try {
      const data = await api("/api/pipeline/save", {});
      notify(`pipeline saved to ${data.path}`, "ok");
    } catch (error) {
      notify(error.message, "error");
    }
  });
  await loadMentions();
  document.body.dataset.ready = "1";
}

start();
