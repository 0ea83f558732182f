// Ferry console. Every value from the server is put into the page with
// textContent (through el() below), never parsed as markup, so a payload or
// an error text holding <script> shows as text. Links are built from our
// own paths with encodeURIComponent.
"use strict";

const REFRESH_MS = 5000;
let me = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "onclick" || k === "onsubmit" || k === "onchange") e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function link(path, params, text) {
  const q = new URLSearchParams(params).toString();
  return el("a", { href: path + (q ? "?" + q : "") }, text);
}

function fmtTime(t) { return t ? String(t).replace("T", " ").replace(/\.\d+/, "").replace("Z", " UTC") : ""; }
function fmtAge(s) {
  if (!s) return "0s";
  if (s < 120) return s.toFixed(1) + "s";
  if (s < 7200) return (s / 60).toFixed(1) + "m";
  return (s / 3600).toFixed(1) + "h";
}
function badge(s) { return el("span", { class: "badge " + String(s) }, s); }

function table(headers, rows) {
  const t = el("table", {}, el("thead", {}, el("tr", {}, headers.map(h => el("th", {}, h)))));
  const body = el("tbody");
  for (const r of rows) body.append(el("tr", {}, r.map(c => (c instanceof Node && c.tagName === "TD") ? c : el("td", {}, c))));
  if (rows.length === 0) body.append(el("tr", {}, el("td", { colspan: headers.length, class: "note" }, "none")));
  t.append(body);
  return t;
}
function num(v) { return el("td", { class: "num" }, v); }

class Problem extends Error {
  constructor(p) { super(p.detail || p.title); this.problem = p; }
}

async function api(path, opts) {
  opts = opts || {};
  const headers = { "Accept": "application/json" };
  const tok = sessionStorage.getItem("ferry-token");
  if (tok) headers["Authorization"] = "Bearer " + tok;
  const init = { method: opts.method || "GET", headers, credentials: "same-origin" };
  if (opts.body !== undefined) { headers["Content-Type"] = "application/json"; init.body = JSON.stringify(opts.body); }
  const r = await fetch(path, init);
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = { title: "bad response", detail: text.slice(0, 200) }; }
  if (r.status === 401) showLogin();
  if (!r.ok) throw new Problem(data || { title: "HTTP " + r.status, status: r.status });
  return data;
}

function errorBox(err) {
  const p = err.problem || { title: "error", detail: String(err.message || err) };
  const box = el("div", { class: "error", role: "alert" }, el("strong", {}, p.title || "error"));
  if (p.detail) box.append(": ", p.detail);
  if (p.field) box.append(" (field ", el("code", {}, p.field), ")");
  return box;
}

function showLogin() {
  document.getElementById("login").hidden = false;
}

function query() { return new URLSearchParams(location.search); }

// filterForm renders inputs for fields [name, label, kind?] filled from the
// URL; on submit the URL is updated (a stable, pasteable link) and onQuery runs.
function filterForm(fields, onQuery, button) {
  const q = query();
  const f = el("form", { class: "filters" });
  for (const [name, label, kind] of fields) {
    let input;
    if (Array.isArray(kind)) {
      input = el("select", { name }, kind.map(o => el("option", { value: o, selected: q.get(name) === o }, o || "(any)")));
    } else if (kind === "bool") {
      input = el("input", { type: "checkbox", name, checked: q.get(name) === "true" });
    } else {
      input = el("input", { name, value: q.get(name) || "", size: kind === "wide" ? 38 : 16 });
    }
    f.append(el("label", {}, label, input));
  }
  f.append(el("button", { type: "submit" }, button || "Search"));
  f.addEventListener("submit", ev => {
    ev.preventDefault();
    const p = formParams(f);
    history.replaceState(null, "", location.pathname + (p.toString() ? "?" + p : ""));
    onQuery(p);
  });
  return f;
}

function formParams(f) {
  const p = new URLSearchParams();
  for (const i of f.querySelectorAll("input, select")) {
    if (i.type === "checkbox") { if (i.checked) p.set(i.name, "true"); }
    else if (i.value.trim() !== "") p.set(i.name, i.value.trim());
  }
  return p;
}

// pager lists pages of path: render(rows) gives the table; "Next page" follows next_cursor.
function pager(container, path, params, render, describe) {
  container.replaceChildren(el("p", { class: "note" }, "loading…"));
  api(path + "?" + params).then(p => {
    const parts = [];
    parts.push(el("p", { class: "note" }, describe(p)));
    parts.push(render(p.rows));
    if (p.next_cursor) {
      parts.push(el("button", { type: "button", id: "next-page", onclick: () => {
        const np = new URLSearchParams(params); np.set("after", p.next_cursor);
        pager(container, path, np, render, describe);
      } }, "Next page"));
    }
    container.replaceChildren(...parts);
  }).catch(e => container.replaceChildren(errorBox(e)));
}

// actionPanel: preview → approve with a required reason → result. Only for
// identities that may act; viewers get nothing to click.
function actionPanel(actions, getFilter, sampleCols) {
  if (!me || !me.can_act) return el("p", { class: "note", id: "no-actions" }, me && me.read_only ? "Read-only console: actions are disabled." : "Your role (" + (me ? me.role : "?") + ") can view but not act.");
  const sel = el("select", { id: "action" }, actions.map(a => el("option", { value: a.path }, a.label)));
  const all = el("input", { type: "checkbox", id: "action-all" });
  const out = el("div", { id: "action-result" });
  const panel = el("div", { class: "panel", id: "actions" }, el("h2", {}, "Action on the rows matching the filter"),
    el("label", {}, "Action ", sel), " ", el("label", {}, all, " every row (no filter)"), " ",
    el("button", { type: "button", id: "preview-btn", onclick: preview }, "Preview"), out);
  function body(approve, reason) {
    const f = getFilter();
    if (all.checked) f.all = true;
    return { filter: f, approve, reason };
  }
  async function preview() {
    out.replaceChildren(el("p", { class: "note" }, "previewing…"));
    try {
      const r = await api(sel.value, { method: "POST", body: body(false) });
      const reason = el("textarea", { id: "reason", rows: 2, cols: 60, placeholder: "why (recorded in the audit log)" });
      out.replaceChildren(
        el("p", { id: "preview-count" }, "Preview (nothing changed): ", el("strong", {}, r.rows + " row(s)"), " would change" + (r.more ? " in this batch; more match (run it again after)" : "") + "."),
        el("p", { class: "note" }, "Sample:"), table(sampleCols.map(c => c[0]), (r.sample || []).map(row => sampleCols.map(c => c[1](row)))),
        el("label", {}, "Reason (required) ", reason), " ",
        el("button", { type: "button", class: "approve", id: "approve-btn", onclick: async () => {
          try {
            const res = await api(sel.value, { method: "POST", body: body(true, reason.value) });
            out.replaceChildren(el("div", { class: "ok", id: "action-done" }, "Done: " + res.action + " changed " + res.rows + " row(s); audit #" + res.audit_id + ". ",
              link("/audit", {}, "audit log")));
          } catch (e) { out.append(errorBox(e)); }
        } }, "Approve"));
    } catch (e) { out.replaceChildren(errorBox(e)); }
  }
  return panel;
}

const outboxCols = [
  ["id", m => m.id], ["event", m => link("/message", { event_id: m.event_id }, m.event_id)],
  ["tenant", m => m.tenant_id], ["aggregate", m => m.aggregate_type + "/" + m.aggregate_id + " #" + m.aggregate_seq],
  ["type", m => m.event_type], ["topic/shard", m => m.topic + "/" + m.shard], ["status", m => badge(m.discarded_at ? "discarded" : m.status)],
  ["attempts", m => m.attempts], ["created", m => fmtTime(m.created_at)], ["last error", m => el("td", { class: "err" }, m.last_error || "")],
];
function outboxTable(rows) { return table(outboxCols.map(c => c[0]), rows.map(m => outboxCols.map(c => c[1](m)))); }

// ---- pages ----

async function overview(main) {
  main.append(el("h1", {}, "Overview"));
  const readAt = el("p", { class: "readat", id: "read-at" });
  const body = el("div", { id: "overview" });
  main.append(readAt, body);
  let timer = null;
  async function load() {
    try {
      const r = await api("/api/v1/status");
      renderStatus(body, r);
      readAt.replaceChildren("Read from the database at " + fmtTime(r.status.at) + " · refreshes every " + (REFRESH_MS / 1000) + " s");
    } catch (e) { body.replaceChildren(errorBox(e)); }
    timer = setTimeout(load, REFRESH_MS);
  }
  window.addEventListener("pagehide", () => clearTimeout(timer));
  load();
}

// atLeast shows a count read with a cap as "n+" (more rows exist).
function atLeast(n, capped) { return capped ? n + "+" : String(n); }

function renderStatus(body, r) {
  const st = r.status;
  const parts = [];
  if (r.error) parts.push(errorBox({ problem: { title: "status incomplete", detail: r.error } }));
  const o = st.outbox;
  parts.push(el("h2", {}, "Outbox"), table(["pending", "oldest pending", "dead letters", "discarded", "unowned shards with pending"],
    [[num(atLeast(o.pending, o.counts_capped)), fmtAge(o.oldest_pending_age_seconds), num(link("/dead", {}, atLeast(o.dead, o.counts_capped))), num(atLeast(o.discarded, o.counts_capped)), num(st.unowned_shards_with_pending)]]));
  if (o.counts_capped) parts.push(el("p", { class: "note", id: "counts-capped" }, "Counts per shard stop at " + r.count_cap + " (a shard with more shows " + r.count_cap + "+); the /metrics gauges and ferry status count exactly."));
  parts.push(el("h2", {}, "Topics"), table(["topic", "pending", "oldest pending", "dead"],
    (st.topics || []).map(t => [t.topic, num(atLeast(t.pending, t.counts_capped)), fmtAge(t.oldest_pending_age_seconds), num(atLeast(t.dead, t.counts_capped))])));
  parts.push(el("h2", {}, "Shards and leases"), table(["topic", "shard", "pending", "oldest", "dead", "lease owner", "fence", "lease"],
    (st.shards || []).map(s => [s.topic, num(s.shard), num(atLeast(s.pending, s.counts_capped)), fmtAge(s.oldest_pending_age_seconds), num(atLeast(s.dead, s.counts_capped)), s.lease_owner || "", s.lease_fence || "", badge(s.lease_live ? "live" : "none")])));
  parts.push(el("h2", {}, "Relay instances"), table(["instance", "started", "heartbeat", "live", "owned shards", "breaker"],
    (st.relays || []).map(x => [x.instance_id, fmtTime(x.started_at), fmtTime(x.heartbeat_at), badge(x.live ? "live" : "dead"), (x.owned_shards || []).join(", "), x.breaker])));
  parts.push(el("h2", {}, "Consumers"), table(["consumer", "applied last minute", "applied/s", "last applied", "parked by reason", "open gaps", "oldest gap"],
    (st.consumers || []).map(c => [c.consumer, num(c.applied_last_minute), num(c.applied_per_second.toFixed(2)), fmtTime(c.last_applied_at),
      (c.parked || []).map(p => p.reason + ": " + p.count + " (oldest " + fmtAge(p.oldest_age_seconds) + ")").join("; "), num(c.open_gaps), fmtAge(c.oldest_gap_age_seconds)])));
  parts.push(el("h2", {}, "Effects"), table(["consumer", "by state", "oldest unknown"],
    (st.effects || []).map(x => [x.consumer, Object.entries(x.by_state || {}).map(([k, v]) => k + ": " + v).join(", "), fmtAge(x.oldest_unknown_age_seconds)])));
  if (st.cdc && st.cdc.length) {
    parts.push(el("h2", {}, "CDC slots"), table(["slot", "exists", "active", "lag bytes", "lost", "last error"],
      st.cdc.map(c => [c.slot, String(c.exists), String(c.active), num(c.lag_bytes), num(c.lost_count), c.last_error || ""])));
  }
  parts.push(el("h2", {}, "Sections"), table(["section", "state", "migration", "error"],
    (st.sections || []).map(s => [s.name, badge(s.state), s.migration, el("td", { class: "err" }, s.error || "")])));
  body.replaceChildren(...parts);
}

function outbox(main) {
  main.append(el("h1", {}, "Outbox search"));
  const res = el("div", { id: "results" });
  const form = filterForm([["event_id", "event id", "wide"], ["tenant_id", "tenant"], ["aggregate_type", "aggregate type"], ["aggregate_id", "aggregate id"],
    ["correlation_id", "correlation id"], ["status", "status", ["", "pending", "sent", "dead", "discarded"]], ["since", "since (RFC 3339)"], ["until", "until"]], run);
  main.append(form, res);
  main.append(actionPanel([{ label: "Replay sent events", path: "/api/v1/outbox/replay" }], () => {
    const p = formParams(form); const f = {};
    if (p.get("event_id")) f.event_ids = [p.get("event_id")];
    for (const k of ["tenant_id", "aggregate_type", "aggregate_id", "since", "until"]) if (p.get(k)) f[k] = p.get(k);
    return f;
  }, outboxCols.slice(0, 7)));
  function run(p) { p = new URLSearchParams(p); if (!p.get("limit")) p.set("limit", "50");
    pager(res, "/api/v1/outbox", p, outboxTable, pg => pg.rows.length + " row(s), " + (pg.order === "id asc" ? "in sequence order" : "newest first")); }
  run(query());
}

async function message(main) {
  const id = query().get("event_id") || "";
  main.append(el("h1", {}, "Event ", el("code", {}, id)));
  try {
    const m = await api("/api/v1/outbox/" + encodeURIComponent(id));
    main.append(el("p", {}, link("/evidence", { q: m.event_id }, "Evidence for this event"), " · ",
      link("/outbox", { aggregate_type: m.aggregate_type, aggregate_id: m.aggregate_id, tenant_id: m.tenant_id }, "its aggregate in sequence order")));
    main.append(table(["field", "value"], Object.entries(m).map(([k, v]) => [k, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v)])));
    main.append(payloadPanel("Payload", m.payload_bytes, "/api/v1/outbox/" + encodeURIComponent(id) + "/reveal"));
  } catch (e) { main.append(errorBox(e)); }
}

// payloadPanel: hidden by default; an operator reveals it with a reason,
// itself an audited action (revealPath answers {payload_text, audit_id}).
function payloadPanel(what, bytes, revealPath) {
  const pay = el("div", { class: "panel", id: "payload" }, el("h2", {}, what), el("p", { class: "note" }, "Hidden (" + bytes + " bytes). Payloads may hold personal data."));
  if (me && me.can_act) {
    const reason = el("input", { id: "reveal-reason", size: 50, placeholder: "why (recorded in the audit log)" });
    pay.append(el("label", {}, "Reason ", reason), " ", el("button", { type: "button", id: "reveal-btn", onclick: async () => {
      try {
        const r = await api(revealPath, { method: "POST", body: { reason: reason.value } });
        if (r.withheld) {
          pay.append(el("p", { class: "note", id: "payload-withheld" }, "Withheld by the field mask, audit #" + r.audit_id + ": " + r.withheld_reason));
          return;
        }
        pay.append(el("p", { class: "note" }, "Revealed (" + (r.content_type || "no content type") + "), audit #" + r.audit_id + ":"), el("pre", { id: "payload-text" }, r.payload_text || "(binary; base64) " + r.payload_base64));
        if (r.masked) pay.append(el("p", { class: "note", id: "payload-masked" }, "Masked (" + r.masked_values + " values shown as ***): " + r.masked.join(", ")));
      } catch (e) { pay.append(errorBox(e)); }
    } }, "Reveal " + what.toLowerCase()));
  }
  return pay;
}

function fieldTable(m, skip) {
  return table(["field", "value"], Object.entries(m).filter(([k]) => !(skip || []).includes(k)).map(([k, v]) =>
    [k, el("td", { class: k === "last_error" ? "err" : undefined, id: "f-" + k }, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v))]));
}

// detailPage: one row of path/{id}: its fields (the last error as text),
// links, and its hidden payload.
async function detailPage(main, title, path, links, payload) {
  const id = query().get("id") || "";
  main.append(el("h1", {}, title + " ", el("code", {}, id)));
  try {
    const m = await api(path + "/" + encodeURIComponent(id));
    main.append(el("p", { id: "detail-links" }, ...links(m).flatMap((l, i) => i ? [" · ", l] : [l])));
    main.append(fieldTable(m));
    main.append(payloadPanel(payload[0], m[payload[1]], path + "/" + encodeURIComponent(id) + "/reveal"));
  } catch (e) { main.append(errorBox(e)); }
}

function parkedMessage(main) {
  detailPage(main, "Parked message", "/api/v1/parked", m => [
    m.event_id ? link("/evidence", { q: m.event_id }, "Evidence for this event") : "no event id (undecodable)",
    link("/parked", { consumer: m.consumer, aggregate_type: m.aggregate_type, aggregate_id: m.aggregate_id, include_resolved: "true" }, "parked messages of its aggregate"),
  ], ["Payload", "payload_bytes"]);
}

function effect(main) {
  detailPage(main, "Effect intent", "/api/v1/effects", m => [
    link("/evidence", { q: m.event_id }, "Evidence for its event"),
    m.state === "failed" ? link("/effects", { keys: m.idem_key }, "requeue it from the failed list") : "state " + m.state,
  ], ["Request", "request_bytes"]);
}

function listPage(main, title, path, fields, cols, actions, toFilter) {
  main.append(el("h1", {}, title));
  const res = el("div", { id: "results" });
  const form = filterForm(fields, run, "Filter");
  main.append(form, res);
  if (actions) main.append(actionPanel(actions, () => toFilter(formParams(form)), cols.slice(0, 6)));
  function run(p) { p = new URLSearchParams(p); if (!p.get("limit")) p.set("limit", "50");
    pager(res, path, p, rows => table(cols.map(c => c[0]), rows.map(r => cols.map(c => c[1](r)))),
      pg => (pg.total_capped ? pg.total.toLocaleString("en") + "+" : pg.total) + " matching in total; showing " + pg.rows.length + " (in id order)"); }
  run(query());
}

function listFilter(p, arrays) {
  const f = {};
  for (const [k, v] of p.entries()) {
    if (k === "include_discarded" || k === "include_resolved") continue;
    if (arrays.includes(k)) f[k] = v.split(",").map(s => s.trim()).filter(Boolean);
    else f[k] = v;
  }
  if (f.ids) f.ids = f.ids.map(Number);
  return f;
}

function dead(main) {
  listPage(main, "Dead letters", "/api/v1/dead",
    [["event_ids", "event ids (comma-separated)", "wide"], ["topic", "topic"], ["tenant_id", "tenant"], ["aggregate_type", "aggregate type"], ["aggregate_id", "aggregate id"],
      ["event_type", "event type"], ["error_contains", "error contains"], ["include_discarded", "include discarded", "bool"]],
    outboxCols, [{ label: "Retry (back to pending for the relay)", path: "/api/v1/dead/retry" }, { label: "Discard (keep as evidence)", path: "/api/v1/dead/discard" }],
    p => listFilter(p, ["event_ids"]));
}

const parkedCols = [["id", m => link("/parked-message", { id: m.id }, String(m.id))], ["consumer", m => m.consumer], ["reason", m => badge(m.reason)], ["event", m => m.event_id ? link("/evidence", { q: m.event_id }, m.event_id) : ""],
  ["aggregate", m => m.aggregate_type + "/" + m.aggregate_id + " #" + m.aggregate_seq], ["type", m => m.event_type], ["attempts", m => m.attempts],
  ["first seen", m => fmtTime(m.first_seen)], ["state", m => m.resolved_at ? "resolved " + m.resolution : (m.replay_request ? "requested " + m.replay_request : "open")],
  ["last error", m => el("td", { class: "err" }, m.last_error || "")]];

function parked(main) {
  listPage(main, "Parked messages", "/api/v1/parked",
    [["consumer", "consumer"], ["reason", "reason", ["", "gap", "schema", "unauthorized", "poison", "collision", "undecodable", "decrypt", "claimcheck"]], ["event_ids", "event ids", "wide"],
      ["tenant_id", "tenant"], ["aggregate_type", "aggregate type"], ["aggregate_id", "aggregate id"], ["event_type", "event type"], ["include_resolved", "include resolved", "bool"]],
    parkedCols, [{ label: "Replay (through the consumer's current code)", path: "/api/v1/parked/replay" }, { label: "Release gap", path: "/api/v1/parked/release-gap" }],
    p => listFilter(p, ["event_ids"]));
}

const effectCols = [["id", m => link("/effect", { id: m.id }, String(m.id))], ["key", m => m.idem_key], ["consumer", m => m.consumer], ["event", m => link("/evidence", { q: m.event_id }, m.event_id)],
  ["step", m => m.step], ["target → operation", m => m.target + " → " + m.operation], ["attempts", m => m.attempts], ["created", m => fmtTime(m.created_at)],
  ["last error", m => el("td", { class: "err" }, m.last_error || "")]];

function effects(main) {
  listPage(main, "Failed effect intents", "/api/v1/effects/failed",
    [["keys", "idempotency keys", "wide"], ["consumer", "consumer"], ["target", "target"], ["tenant_id", "tenant"], ["error_contains", "error contains"]],
    effectCols, [{ label: "Requeue (the provider provably did not apply it)", path: "/api/v1/effects/requeue" }], p => listFilter(p, ["keys"]));
}

function evidence(main) {
  main.append(el("h1", {}, "Evidence"));
  const res = el("div", { id: "results" });
  main.append(filterForm([["q", "event id, correlation id or command key", "wide"], ["kind", "kind", ["auto", "event_id", "correlation_id", "command_key"]]], run, "Show"), res);
  async function run(p) {
    if (!p.get("q")) { res.replaceChildren(el("p", { class: "note" }, "Give an event id, a correlation id or a command key. The page's URL is a stable link for a ticket.")); return; }
    res.replaceChildren(el("p", { class: "note" }, "reading…"));
    try {
      const r = await api("/api/v1/evidence?" + p);
      const ev = r.evidence;
      const parts = [el("p", {}, "Evidence for " + ev.kind + " ", el("code", {}, ev.query), ": " + ev.events.length + " event(s), from the tables alone. Link: ", el("code", { id: "stable-link" }, location.href))];
      for (const e of ev.events) parts.push(el("p", { class: "summary" }, el("code", {}, e.event_id), ": " + e.summary));
      parts.push(table(["time", "event", "step", "source table", "what the row says"],
        r.timeline.map(l => [fmtTime(l.at), l.event_id || "", l.step, el("td", {}, el("code", {}, l.source)), l.text])));
      if (ev.missing && ev.missing.length) parts.push(el("p", { class: "note" }, "Not installed (unknown, not negative): " + ev.missing.join(", ")));
      res.replaceChildren(...parts);
    } catch (e) { res.replaceChildren(errorBox(e)); }
  }
  run(query());
}

function audit(main) {
  main.append(el("h1", {}, "Audit log"));
  const res = el("div", { id: "results" });
  main.append(filterForm([["actor", "actor"], ["action", "action"], ["since", "since (RFC 3339)"], ["until", "until"]], run, "Filter"), res);
  function run(p) { p = new URLSearchParams(p); if (!p.get("limit")) p.set("limit", "50");
    pager(res, "/api/v1/audit", p, rows => table(["#", "at", "actor", "action", "rows", "reason", "filter", "ids"],
      rows.map(a => [a.id, fmtTime(a.at), a.actor, a.action, num(a.row_count), a.reason, el("td", {}, el("code", {}, a.filter)), el("td", {}, el("code", {}, a.ids.length > 120 ? a.ids.slice(0, 120) + "…" : a.ids))])),
      pg => pg.total + " audit row(s), newest first"); }
  run(query());
}

function cleanup(main) {
  main.append(el("h1", {}, "Cleanup preview"), el("p", { class: "note" }, "What ferry cleanup would delete with these retentions. The console only previews; deleting is the CLI's (ferry cleanup --approve)."));
  const res = el("div", { id: "results" });
  main.append(filterForm([["retention", "retention (e.g. 720h)"], ["inbox_retention", "inbox retention"], ["include_discarded", "include discarded", "bool"]], async p => {
    try {
      const r = await api("/api/v1/cleanup/preview", { method: "POST", body: { retention: p.get("retention") || "", inbox_retention: p.get("inbox_retention") || undefined, include_discarded: p.get("include_discarded") === "true" } });
      res.replaceChildren(table(["outbox", "discarded dead letters", "inbox", "resolved parked", "effects", "window"],
        [[num(r.outbox), num(r.discarded_dead_letters), num(r.inbox), num(r.resolved_parked), num(r.effects), JSON.stringify(r.window)]]));
    } catch (e) { res.replaceChildren(errorBox(e)); }
  }, "Preview"), res);
}

const pages = { "/": ["Overview", overview], "/outbox": ["Outbox", outbox], "/dead": ["Dead letters", dead], "/parked": ["Parked", parked],
  "/effects": ["Effects", effects], "/evidence": ["Evidence", evidence], "/audit": ["Audit", audit], "/cleanup": ["Cleanup", cleanup], "/message": [null, message],
  "/parked-message": [null, parkedMessage], "/effect": [null, effect] };

async function start() {
  const nav = document.getElementById("nav");
  for (const [path, [label]] of Object.entries(pages)) {
    if (label) nav.append(el("a", { href: path, class: location.pathname === path ? "active" : undefined }, label));
  }
  document.getElementById("login-btn").addEventListener("click", () => {
    sessionStorage.setItem("ferry-token", document.getElementById("token").value);
    location.reload();
  });
  const main = document.getElementById("main");
  try {
    me = await api("/api/v1/me");
    document.getElementById("who").replaceChildren(el("span", { id: "identity" }, me.name + " (" + me.role + (me.agent ? ", agent" : "") + ")" + (me.read_only ? " · read-only" : "")));
  } catch (e) { main.append(errorBox(e)); return; }
  const page = pages[location.pathname] || pages["/"];
  page[1](main);
}

start();
