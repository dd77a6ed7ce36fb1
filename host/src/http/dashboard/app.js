// The baton dashboard: one page, no dependencies. It watches GET /api/v1/stream (Server-Sent
// Events: a snapshot of the whole cluster at most 4 times a second, plus the events not seen
// yet) and acts through the same HTTP API as the CLI.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
};

// ---- numbers for people -------------------------------------------------------------------
const fmtNum = (n) => {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const a = Math.abs(n);
  if (a < 1000) return String(Math.round(n * 10) / 10);
  for (const [d, u] of [[1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
    if (a >= d) { const v = n / d; return `${v >= 100 ? Math.round(v) : v.toFixed(1)} ${u}`; }
  }
  return String(n);
};
const fmtRate = (n) => `${fmtNum(n)} records/s`;
const fmtBytes = (b) => {
  if (b === null || b === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0; let v = b;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${i === 0 ? v : v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
};
const fmtMs = (ms) => {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 10) return `${ms.toFixed(1)} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.round(ms / 60000)} min`;
};
const fmtAgo = (at) => {
  if (!at) return "–";
  const s = Math.max(0, (Date.now() - at) / 1000);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return new Date(at).toLocaleString();
};
const fmtTime = (at) => (at ? new Date(at).toLocaleTimeString() : "–");
const slotsText = (s) => `${s[0]}–${s[1] - 1}`;

// ---- connection ---------------------------------------------------------------------------
let base = location.origin; // the host the page talks to now
let source = null;
let lastId = "";
let state = null; // the last snapshot's state
let lastMessage = 0;
let failing = null; // timer while the stream is down
const events = []; // events kept, newest last
const seenEvents = new Set();

function token() { return sessionStorage.getItem("baton.token") || ""; }

async function api(method, path, body, opts = {}) {
  const headers = {};
  if (token()) headers.Authorization = `Bearer ${token()}`;
  let payload;
  if (body instanceof Blob || body instanceof ArrayBuffer) { payload = body; headers["Content-Type"] = "application/wasm"; }
  else if (body !== undefined) { payload = JSON.stringify(body); headers["Content-Type"] = "application/json"; }
  let resp;
  try { resp = await fetch(base + path, { method, headers, body: payload }); }
  catch (e) { throw new Error(`host ${state ? state.host : base} did not answer: ${e.message}`); }
  const text = await resp.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = null; }
  if (!resp.ok) {
    const msg = (json && json.error) || text || resp.statusText;
    if (resp.status === 401 && !opts.quiet) askToken(`The API refused the token: ${msg}`);
    const err = new Error(msg); err.status = resp.status; throw err;
  }
  return json;
}

function connect(to, why) {
  if (source) source.close();
  const url = `${to}/api/v1/stream${lastId ? `?last_event_id=${encodeURIComponent(lastId)}` : ""}`;
  const es = new EventSource(url);
  source = es;
  let opened = false;
  es.addEventListener("open", () => {
    opened = true;
    if (to !== base) {
      const from = state ? state.host : base;
      base = to;
      notice(why || `Switched to ${to}.`, "info");
      void from;
    }
  });
  es.addEventListener("snapshot", (m) => {
    lastMessage = Date.now();
    clearTimeout(failing); failing = null;
    const data = JSON.parse(m.data);
    onSnapshot(data.state, data.events || []);
    // Only once its events are in: a message that failed is asked for again.
    lastId = m.lastEventId || lastId;
  });
  es.addEventListener("error", () => {
    if (failing) return;
    // EventSource retries by itself (the host asks for 1 s); if nothing comes within 3 s, try the other live hosts.
    failing = setTimeout(() => switchHost(to), 3000);
    setConn(`lost the stream from ${state ? `host ${state.host}` : to}; retrying…`, true);
    void opened;
  });
}

async function switchHost(dead) {
  failing = null;
  if (Date.now() - lastMessage < 3000 && source && source.readyState === EventSource.OPEN) return;
  const deadId = state ? state.host : dead;
  const others = (state ? state.hosts : []).filter((h) => h.address && h.id !== deadId && h.alive);
  for (const h of others) {
    const addr = h.address.replace(/\/$/, "");
    try {
      const r = await fetch(`${addr}/healthz`, { cache: "no-store" });
      if (!r.ok) continue;
    } catch { continue; }
    connect(addr, `Host ${deadId} stopped answering: this page now shows the cluster from host ${h.id} (${addr}).`);
    return;
  }
  // Nobody else answers: keep trying the one we had.
  connect(dead);
}

function setConn(text, bad) {
  const c = $("#conn");
  c.textContent = text;
  c.classList.toggle("bad", !!bad);
}

function notice(text, kind) {
  const n = $("#notice");
  n.textContent = text;
  n.hidden = !text;
  n.classList.toggle("info", kind === "info");
  n.dataset.kind = kind || "error";
}
function progress(text) { $("#progress").textContent = text; }

// ---- token --------------------------------------------------------------------------------
function askToken(msg) {
  const f = $("#token-form");
  f.hidden = false;
  $("#token-msg").textContent = msg || "";
  $("#token").focus();
}
$("#token-open").addEventListener("click", () => askToken(""));
$("#token-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const given = $("#token").value.trim();
  const headers = { Authorization: `Bearer ${given}` };
  let resp;
  try { resp = await fetch(`${base}/api/v1/auth/check`, { method: "POST", headers }); }
  catch (e) { $("#token-msg").textContent = `The host did not answer: ${e.message}`; return; }
  if (resp.status === 204) {
    sessionStorage.setItem("baton.token", given);
    $("#token-form").hidden = true;
    $("#token").value = "";
    $("#token-open").hidden = false;
    progress("Token accepted: actions are enabled.");
  } else {
    let msg = resp.statusText;
    try { msg = (await resp.json()).error || msg; } catch { /* not JSON */ }
    $("#token-msg").textContent = `That token is wrong (${resp.status}): ${msg}`;
  }
});

// ---- confirmation -------------------------------------------------------------------------
function confirmAction(title, text, extra) {
  const d = $("#confirm");
  $("#confirm-title").textContent = title;
  $("#confirm-text").textContent = text;
  const slot = $("#confirm-extra");
  slot.replaceChildren(...(extra ? [extra] : []));
  d.returnValue = "";
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.showModal();
    $("#confirm-ok").focus();
  });
}

async function act(label, fn) {
  notice("");
  progress(`${label}…`);
  try {
    const out = await fn();
    return out;
  } catch (e) {
    progress("");
    notice(`${label} failed: ${e.message}`);
    return undefined;
  }
}

// ---- keyed tables -------------------------------------------------------------------------
// Rows are kept per key so that open menus, typed values and focus survive every update.
function keyed(tbody, items, keyOf, make, update) {
  const old = new Map([...tbody.children].map((tr) => [tr.dataset.key, tr]));
  let prev = null;
  for (const item of items) {
    const key = keyOf(item);
    let tr = old.get(key);
    if (!tr) { tr = make(item); tr.dataset.key = key; }
    old.delete(key);
    update(tr, item);
    const want = prev ? prev.nextSibling : tbody.firstChild;
    if (want !== tr) tbody.insertBefore(tr, want);
    prev = tr;
  }
  for (const tr of old.values()) tr.remove();
}
function setCells(tr, values) {
  values.forEach((v, i) => {
    const td = tr.children[i];
    if (v instanceof Node) { if (td.firstChild !== v) td.replaceChildren(v); }
    else if (td.textContent !== String(v)) td.textContent = v;
  });
}
function plainRows(id, rows) {
  const tbody = $(`#${id} tbody`);
  keyed(tbody, rows, (r) => r.key, (r) => el("tr", {}, ...r.cells.map((_, i) => el("td", { class: r.wrap && r.wrap.includes(i) ? "wrap" : null }))), (tr, r) => setCells(tr, r.cells));
}

// Gives `sel` one option per value (labelled by `label`) when the values changed, keeping the
// choice when it is still there; answers whether it changed.
function fillOptions(sel, values, label = (v) => v) {
  if (sel.dataset.sig === values.join(",")) return false;
  const keep = sel.value;
  sel.dataset.sig = values.join(",");
  sel.replaceChildren(...values.map((v) => el("option", { value: v, text: label(v) })));
  if (values.includes(keep)) sel.value = keep;
  return true;
}

// ---- owners' colours ----------------------------------------------------------------------
const palette = ["#1d4ed8", "#15803d", "#b45309", "#7e22ce", "#b91c1c", "#0e7490", "#4d7c0f", "#be185d"];
function colourOf(host) {
  const ids = (state ? state.hosts : []).map((h) => h.id).sort();
  const i = ids.indexOf(host);
  return palette[(i < 0 ? 0 : i) % palette.length];
}

// ---- the snapshot -------------------------------------------------------------------------
const tracked = []; // actions whose progress the snapshots tell

function onSnapshot(s, fresh) {
  state = s;
  document.body.dataset.live = "1";
  const me = s.hosts.find((h) => h.id === s.host);
  setConn(`live from host ${s.host}${me && me.controller ? " (the controller)" : ""} · ${s.transport} · updated ${new Date().toLocaleTimeString()}`);
  if (s.token_required && !token() && $("#token-form").hidden && !askedOnce) { askedOnce = true; askToken("Reads need no token; moves, uploads and every other change do."); }
  if (s.token_required && token()) $("#token-open").hidden = false;
  for (const e of fresh) {
    const k = `${e.log}/${e.seq}`;
    if (seenEvents.has(k)) continue;
    seenEvents.add(k);
    events.push(e);
  }
  if (events.length > 400) {
    for (const e of events.splice(0, events.length - 400)) seenEvents.delete(`${e.log}/${e.seq}`);
  }
  renderHosts(s);
  renderStrips(s);
  renderPartitions(s);
  renderHistory(s);
  renderPipelines(s);
  renderModules(s);
  renderBalancer(s);
  renderEvents();
  renderForms(s);
  followProgress(s);
}
let askedOnce = false;

function renderHosts(s) {
  const tbody = $("#hosts tbody");
  const count = {};
  for (const p of s.partitions) count[p.owner] = (count[p.owner] || 0) + 1;
  keyed(tbody, s.hosts, (h) => h.id,
    (h) => {
      const tr = el("tr", { id: `host-${h.id}` }, ...Array.from({ length: 8 }, () => el("td")));
      tr.addEventListener("dragover", (ev) => { ev.preventDefault(); tr.classList.add("drop-over"); });
      tr.addEventListener("dragleave", () => tr.classList.remove("drop-over"));
      tr.addEventListener("drop", (ev) => {
        ev.preventDefault(); tr.classList.remove("drop-over");
        const id = ev.dataTransfer.getData("text/plain");
        if (id) movePartition(id, h.id);
      });
      return tr;
    },
    (tr, h) => {
      const m = h.memory || {};
      const load = h.load ? `${fmtRate(h.load.records_per_s)} · ${(h.load.guest_cpu_s_per_s * 100).toFixed(0)} % guest CPU` : "–";
      const name = el("span", {}, el("i", { class: "dot", style: `background:${colourOf(h.id)};display:inline-block;width:.7rem;height:.7rem;margin-right:.3rem`, "aria-hidden": "true" }), `${h.id}${h.this ? " (this page's host)" : ""}`);
      setCells(tr, [
        tr.children[0].textContent === name.textContent ? tr.children[0].firstChild : name,
        `${h.alive ? "alive" : "gone"}${h.controller ? " · controller" : ""}`,
        load,
        count[h.id] || 0,
        m.bound !== undefined ? fmtBytes(m.bound) : "–",
        m.block_cache_usage !== undefined ? fmtBytes(m.block_cache_usage + (m.hot_cache_usage || 0)) : "–",
        m.block_cache && m.block_cache.hit_rate !== null && m.block_cache.hit_rate !== undefined ? `${(m.block_cache.hit_rate * 100).toFixed(1)} %` : "–",
        h.address || "(embedded)",
      ]);
    });
}

function renderStrips(s) {
  const root = $("#strips");
  const wraps = s.pipelines.map((pl) => {
    const name = pl.name;
    const parts = s.partitions.filter((p) => p.pipeline === name).sort((a, b) => a.slots[0] - b.slots[0]);
    const slots = pl.slots || (parts.length ? parts[parts.length - 1].slots[1] : 1);
    const strip = el("div", { class: "strip", role: "list", "aria-label": `${name}: slots 0–${slots - 1} by owner` });
    const reps = el("div", { class: "replicas" });
    for (const p of parts) {
      const w = p.slots[1] - p.slots[0];
      strip.append(el("div", { class: "seg", role: "listitem", style: `flex:${w};background:${colourOf(p.owner)}`, title: `${p.id} on ${p.owner}: slots ${slotsText(p.slots)}, ${p.state}` },
        el("span", { text: p.id }), el("span", { text: `${p.owner} · ${slotsText(p.slots)}` })));
      const r = (p.replicas || []).map((x) => `${x.role} on ${x.host}, lag ${fmtNum(x.lag)}`).join("; ");
      reps.append(el("div", { style: `flex:${w}`, text: r || "\u00a0", title: r }));
    }
    const owners = [...new Set(parts.map((p) => p.owner))].sort();
    const legend = el("div", { class: "legend" }, ...owners.map((o) => el("span", {}, el("i", { style: `background:${colourOf(o)}`, "aria-hidden": "true" }), `host ${o}`)));
    return el("div", { class: "strip-wrap" }, el("h3", { text: `${name} · ${slots} slots · ${parts.length} partitions` }), strip, reps, legend);
  });
  if (!wraps.length) wraps.push(el("p", { class: "muted", text: "No pipeline yet: upload a module and create one below." }));
  root.replaceChildren(...wraps);
}

function sparkline(rates) {
  const w = 80; const h = 20;
  const pts = rates.length ? rates : [0];
  const max = Math.max(1, ...pts);
  const step = pts.length > 1 ? w / (pts.length - 1) : w;
  const d = pts.map((v, i) => `${(i * step).toFixed(1)},${(h - 1 - (v / max) * (h - 2)).toFixed(1)}`).join(" ");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `records/s over the last ${pts.length} s, peak ${fmtNum(max)}`);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", d); line.setAttribute("fill", "none"); line.setAttribute("stroke", "#1d4ed8"); line.setAttribute("stroke-width", "1.5");
  svg.append(line);
  return svg;
}

function progressBar(done, total, label) {
  const pct = total > 0 ? Math.min(100, (done / total) * 100) : 0;
  return el("span", {}, el("span", { class: "bar", role: "progressbar", "aria-label": label, "aria-valuemin": "0", "aria-valuemax": String(total), "aria-valuenow": String(Math.min(done, total)), style: "display:inline-block;vertical-align:middle" }, el("div", { style: `width:${pct}%` })),
    ` ${fmtNum(done)} done, ${fmtNum(Math.max(0, total - done))} to go`);
}

const warmStart = new Map(); // per partition and warming host: the most lag seen

function partitionProgress(p) {
  if (p.restore && !p.restore.finished) return progressBar(p.restore.done, p.restore.total, `${p.id} restore`);
  const warming = (p.replicas || []).find((r) => r.role === "warming");
  if (warming) {
    // The replica's lag when first seen is the work; what it caught up since is done.
    const key = `${p.id}@${warming.host}`;
    const most = Math.max(warmStart.get(key) || 0, warming.lag);
    warmStart.set(key, most);
    return el("span", {}, `warming on ${warming.host}: `, progressBar(most - warming.lag, most, `${p.id} warm-up on ${warming.host}`));
  }
  if (p.splitting) return `splitting at slot ${p.splitting.slot}`;
  if (p.merging) return `merging into ${p.merging.left}`;
  const mv = (p.moves || []).find((m) => m.phase === "warming" || m.phase === "handoff");
  if (mv) return `moving to ${mv.to}: ${mv.phase}`;
  return "–";
}

function renderPartitions(s) {
  const tbody = $("#partitions tbody");
  const rows = [...s.partitions].sort((a, b) => (a.pipeline === b.pipeline ? a.slots[0] - b.slots[0] : a.pipeline < b.pipeline ? -1 : 1));
  keyed(tbody, rows, (p) => p.id, makePartitionRow, updatePartitionRow);
}

function makePartitionRow(p) {
  const id = p.id;
  const handle = el("span", { class: "handle", draggable: "true", tabindex: "0", role: "button", "aria-label": `Drag ${id} onto a host to move it`, text: "⠿" });
  handle.addEventListener("dragstart", (ev) => { ev.dataTransfer.setData("text/plain", id); ev.dataTransfer.effectAllowed = "move"; });
  handle.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); tr.querySelector("details").open = true; tr.querySelector(".move-to").focus(); } });

  const moveTo = el("select", { class: "move-to", id: `move-to-${id}` });
  const moveBtn = el("button", { type: "button", class: "move", text: "Move" });
  moveBtn.addEventListener("click", () => movePartition(id, moveTo.value));
  const splitAt = el("input", { class: "split-at", id: `split-at-${id}`, type: "number" });
  const splitBtn = el("button", { type: "button", class: "split", text: "Split" });
  splitBtn.addEventListener("click", () => splitPartition(id, splitAt.value));
  const mergeBtn = el("button", { type: "button", class: "merge", text: "Merge with the next" });
  mergeBtn.addEventListener("click", () => mergeWithNext(id));
  const ckptBtn = el("button", { type: "button", class: "checkpoint", text: "Checkpoint" });
  ckptBtn.addEventListener("click", () => checkpoint(id));
  const acts = el("details", { class: "acts" }, el("summary", { text: "Actions" }),
    el("div", { class: "row" }, el("label", { for: `move-to-${id}`, text: "Move to" }), moveTo, moveBtn),
    el("div", { class: "row" }, el("label", { for: `split-at-${id}`, text: "Split at slot" }), splitAt, splitBtn),
    el("div", { class: "row" }, mergeBtn, ckptBtn));
  // The menu sits under the partition's id, so that it is at hand without scrolling.
  const idCell = el("td", { class: "pcell" }, handle, el("span", { class: "pid", text: id }), acts);
  const tr = el("tr", { id: `part-${id}` }, idCell, ...Array.from({ length: 10 }, () => el("td")));
  return tr;
}

function updatePartitionRow(tr, p) {
  const role = p.role && p.role !== "active" ? `${p.role}, ` : "";
  const stateText = `${role}${p.state}${p.error ? `: ${p.error}` : ""}`;
  const rateCell = tr.children[6];
  const rates = p.rates || [];
  const rateText = fmtRate(p.records_per_s || 0);
  if (rateCell.dataset.sig !== `${rates.join(",")}|${rateText}`) {
    rateCell.dataset.sig = `${rates.join(",")}|${rateText}`;
    rateCell.replaceChildren(sparkline(rates), el("span", { text: rateText }));
  }
  const ck = p.last_checkpoint;
  const ckText = ck ? `#${ck.seq} · ${fmtAgo(ck.taken_at)} · ${fmtBytes(ck.uploaded_bytes)} up of ${fmtBytes(ck.size_bytes)} · ${fmtMs(ck.duration_ms)}` : p.checkpoint_error ? `failed: ${p.checkpoint_error}` : "none yet";
  const prog = tr.children[8];
  const progValue = partitionProgress(p);
  const sig = typeof progValue === "string" ? progValue : progValue.textContent;
  if (prog.dataset.sig !== sig) { prog.dataset.sig = sig; prog.replaceChildren(progValue); }
  setCells(tr, [tr.children[0].firstChild, slotsText(p.slots), p.owner, stateText, p.epoch, fmtNum(p.lag), rateCell.firstChild, `${fmtBytes(p.state_bytes)} disk · ${fmtBytes(p.memory_bytes || 0)} memory`, prog.firstChild, ckText, fmtMs(p.last_pause_ms)]);
  tr.children[0].children[1].textContent = p.id;
  tr.children[3].className = p.state === "failed" ? "bad" : "";
  // Menus: the hosts it may move to, the slots it may split at, and its right neighbour.
  const sel = tr.querySelector(".move-to");
  const hosts = state.hosts.filter((h) => h.alive && h.id !== p.owner).map((h) => h.id);
  fillOptions(sel, hosts, (h) => `host ${h}`);
  tr.querySelector(".move").disabled = hosts.length === 0;
  const at = tr.querySelector(".split-at");
  at.min = p.slots[0] + 1; at.max = p.slots[1] - 1;
  if (!at.value && p.slots[1] - p.slots[0] > 1) at.placeholder = String(Math.floor((p.slots[0] + p.slots[1]) / 2));
  tr.querySelector(".split").disabled = p.slots[1] - p.slots[0] < 2;
  const next = state.partitions.find((q) => q.pipeline === p.pipeline && q.slots[0] === p.slots[1]);
  const mb = tr.querySelector(".merge");
  mb.disabled = !next;
  mb.textContent = next ? `Merge with ${next.id}` : "Merge with the next";
}

function historyRows(s) {
  const rows = [];
  const moves = new Map();
  for (const p of [...s.partitions, ...(s.retired || [])]) for (const m of p.moves || []) moves.set(m.id, m);
  for (const m of moves.values()) rows.push({ at: m.at, key: `m:${m.id}`, what: `move ${m.partition}: ${m.from} → ${m.to}`, outcome: m.phase, pause: m.pause_ms, reason: m.reason || "" });
  for (const sp of s.splits || []) rows.push({ at: sp.at, key: `s:${sp.id}`, what: `split ${sp.partition} at slot ${sp.slot}${sp.halves && sp.halves.length ? ` into ${sp.halves.join(", ")}` : ""}`, outcome: sp.phase, pause: sp.pause_ms, reason: [sp.reason, sp.cause].filter(Boolean).join("; ") });
  for (const mg of s.merges || []) rows.push({ at: mg.at, key: `g:${mg.id}`, what: `merge ${mg.left} + ${mg.right}${mg.merged ? ` into ${mg.merged}` : ""}`, outcome: mg.phase, pause: mg.pause_ms, reason: [mg.reason, mg.cause].filter(Boolean).join("; ") });
  rows.sort((a, b) => b.at - a.at);
  return rows;
}

function renderHistory(s) {
  const rows = historyRows(s);
  plainRows("history", rows.slice(0, 100).map((r) => ({ key: r.key, wrap: [4], cells: [fmtTime(r.at), r.what, r.outcome, fmtMs(r.pause), r.reason || "–"] })));
  // The pauses' histogram.
  const pauses = rows.map((r) => r.pause).filter((x) => typeof x === "number");
  const bins = [[0, 5], [5, 10], [10, 20], [20, 50], [50, 100], [100, Infinity]];
  const counts = bins.map(([lo, hi]) => pauses.filter((x) => x >= lo && x < hi).length);
  const max = Math.max(1, ...counts);
  const sorted = [...pauses].sort((a, b) => a - b);
  const q = (f) => (sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(f * sorted.length))] : null);
  const hist = el("div", { class: "hist", role: "img", "aria-label": `pauses: ${bins.map(([lo, hi], i) => `${counts[i]} from ${lo} to ${hi === Infinity ? "more" : hi} ms`).join(", ")}` },
    ...bins.map(([lo, hi], i) => el("figure", {}, el("div", { class: "col", style: `height:${(counts[i] / max) * 80}%` }), el("figcaption", { text: `${hi === Infinity ? `≥${lo}` : `${lo}–${hi}`} ms: ${counts[i]}` }))));
  $("#pauses").replaceChildren(hist, el("p", { class: "muted", text: sorted.length ? `${sorted.length} handoffs · p50 ${fmtMs(q(0.5))} · p99 ${fmtMs(q(0.99))} · max ${fmtMs(sorted[sorted.length - 1])}` : "No handoff yet." }));
}

function renderPipelines(s) {
  const tbody = $("#pipelines tbody");
  keyed(tbody, s.pipelines, (p) => p.name,
    (p) => {
      const name = p.name;
      const sel = el("select", { class: "swap-to", id: `swap-to-${name}`, "aria-label": `Version of ${name} to swap to` });
      const swapBtn = el("button", { type: "button", class: "swap", text: "Hot-swap" });
      swapBtn.addEventListener("click", () => swap(name, sel.value));
      const rollBtn = el("button", { type: "button", class: "rollback", text: "Roll back" });
      rollBtn.addEventListener("click", () => rollback(name));
      const replayBtn = el("button", { type: "button", class: "replay", text: "Replay dead letters" });
      replayBtn.addEventListener("click", () => replay(name));
      const delBtn = el("button", { type: "button", class: "delete danger", text: "Delete" });
      delBtn.addEventListener("click", () => deletePipeline(name));
      return el("tr", { id: `pipe-${name}` }, ...Array.from({ length: 6 }, () => el("td")),
        el("td", {}, el("div", { class: "acts" }, el("div", { class: "row" }, sel, swapBtn, rollBtn), el("div", { class: "row" }, replayBtn, delBtn))));
    },
    (tr, p) => {
      const spec = p;
      setCells(tr, [spec.name, spec.module, `${spec.version}${p.phase && p.phase !== "running" ? ` (${p.phase})` : ""}`, `${(spec.inputs || []).join(", ")} → ${(spec.outputs || []).join(", ") || "–"}`, (spec.stores || []).join(", ") || "–", spec.guarantee || "–"]);
      const versions = s.modules.filter((m) => m.name === spec.module).map((m) => m.version);
      const sel = tr.querySelector(".swap-to");
      fillOptions(sel, versions, (v) => `version ${v}`);
      const last = (p.swaps || [])[p.swaps.length - 1];
      tr.querySelector(".rollback").disabled = !last;
    });
  const swaps = [];
  for (const p of s.pipelines) for (const w of p.swaps || []) swaps.push({ ...w, pipeline: p.name });
  swaps.sort((a, b) => b.at - a.at);
  plainRows("swaps", swaps.slice(0, 50).map((w, i) => ({ key: `${w.pipeline}/${w.at}/${i}`, wrap: [4], cells: [fmtTime(w.at), w.pipeline, w.from, w.version, w.rollback_reason ? `rolled back: ${w.rollback_reason}` : "swapped"] })));
}

function renderModules(s) {
  const usedBy = (m) => s.pipelines.filter((p) => p.module === m.name && p.version === m.version).map((p) => p.name);
  keyed($("#modules tbody"), s.modules, (m) => `${m.name}@${m.version}`,
    (m) => {
      const del = el("button", { type: "button", class: "delete danger", text: "Delete", "aria-label": `Delete ${m.name} version ${m.version}` });
      del.addEventListener("click", () => deleteModule(m.name, m.version));
      return el("tr", {}, ...Array.from({ length: 5 }, () => el("td")), el("td", {}, del));
    },
    (tr, m) => {
      const used = usedBy(m);
      setCells(tr, [m.name, m.version, used.length ? `${used.join(", ")} (running)` : "–", fmtBytes(m.size), m.wit || m.contract || "–"]);
    });
}

function renderBalancer(s) {
  const rows = [...(s.balancer || [])].reverse();
  plainRows("balancer", rows.map((d, i) => ({ key: `${d.at}/${i}`, wrap: [3, 4], cells: [fmtTime(d.at), d.pipeline, `${d.action} ${(d.partitions || []).join(", ")}${d.to ? ` → ${d.to}` : ""}`, d.reason, d.outcome || "–"] })));
  if (!rows.length) plainRows("balancer", [{ key: "none", cells: ["–", "–", "no decision yet (auto-balance is per pipeline, off by default)", "", ""] }]);
}

function renderEvents() {
  const where = (e) => (e.topic !== undefined ? `${e.topic} · slot ${e.slot} · offset ${e.offset}` : "–");
  const logs = events.filter((e) => e.kind === "log" || e.kind === "error" || e.kind === "trap").slice(-150).reverse();
  plainRows("logs", logs.map((e) => ({ key: `${e.log}/${e.seq}`, wrap: [3], cells: [fmtTime(e.at), `${e.pipeline} · ${e.partition} on ${e.host}`, e.kind === "log" ? e.level || "info" : e.kind, e.message, where(e)] })));
  const dead = events.filter((e) => e.kind === "error" || e.kind === "trap").slice(-100).reverse();
  plainRows("dead", dead.map((e) => ({ key: `${e.log}/${e.seq}`, wrap: [2], cells: [fmtTime(e.at), e.pipeline, e.message, where(e)] })));
}

function renderForms(s) {
  // Create: modules and their versions.
  const modSel = $("#c-module");
  const names = [...new Set(s.modules.map((m) => m.name))];
  if (fillOptions(modSel, names)) fillVersions();
  const vs = s.modules.filter((m) => m.name === modSel.value).map((m) => m.version);
  if ($("#c-version").dataset.sig !== vs.join(",")) fillVersions();
  // Query: pipelines and stores.
  const qp = $("#q-pipeline");
  const pnames = s.pipelines.map((p) => p.name);
  fillOptions(qp, pnames);
  fillStores();
  const topics = [...new Set(s.pipelines.flatMap((p) => [...(p.inputs || []), ...(p.outputs || [])]))];
  const dl = $("#topic-list");
  if (dl.dataset.sig !== topics.join(",")) { dl.dataset.sig = topics.join(","); dl.replaceChildren(...topics.map((t) => el("option", { value: t }))); }
}
function fillVersions() {
  const vsel = $("#c-version");
  const vs = state.modules.filter((m) => m.name === $("#c-module").value).map((m) => m.version);
  const keep = vsel.value;
  vsel.dataset.sig = "";
  fillOptions(vsel, vs);
  if (!vs.includes(keep) && vs.length) vsel.value = vs[vs.length - 1];
}
function fillStores() {
  const p = state.pipelines.find((x) => x.name === $("#q-pipeline").value);
  const stores = p ? p.stores || [] : [];
  fillOptions($("#q-store"), stores);
}
$("#c-module").addEventListener("change", fillVersions);
$("#q-pipeline").addEventListener("change", fillStores);

// ---- progress of what the page started -----------------------------------------------------
function followProgress(s) {
  for (const t of [...tracked]) {
    if (t.kind !== "move") continue;
    let m = null;
    for (const p of [...s.partitions, ...(s.retired || [])]) for (const x of p.moves || []) if (x.id === t.id) m = x;
    if (!m) { progress(`Moving ${t.partition} to ${t.to}: requested (move ${t.id})`); continue; }
    if (m.phase === "done") {
      progress(`Moved ${t.partition} to ${t.to}: done, paused ${fmtMs(m.pause_ms)}.`);
      tracked.splice(tracked.indexOf(t), 1);
    } else if (m.phase === "abandoned") {
      notice(`Moving ${t.partition} to ${t.to} was abandoned${m.reason ? `: ${m.reason}` : ""}.`);
      progress("");
      tracked.splice(tracked.indexOf(t), 1);
    } else {
      progress(`Moving ${t.partition} to ${t.to}: ${m.phase === "warming" ? "warming up the target" : "handing off"}…`);
    }
  }
}

// ---- actions -------------------------------------------------------------------------------
async function movePartition(id, to) {
  if (!to) return;
  const r = await act(`Moving ${id} to ${to}`, () => api("POST", `/api/v1/partitions/${encodeURIComponent(id)}/move`, { to }));
  if (r && r.move) { tracked.push({ kind: "move", id: r.move, partition: id, to }); progress(`Moving ${id} to ${to}: warming up the target…`); followProgress(state); }
}

async function splitPartition(id, at) {
  const body = at === "" || at === undefined ? undefined : { at: Number(at) };
  progress(`Splitting ${id}${body ? ` at slot ${body.at}` : ""}: warming the halves…`);
  const r = await act(`Splitting ${id}`, () => api("POST", `/api/v1/partitions/${encodeURIComponent(id)}/split`, body));
  if (r) progress(`Split ${id} at slot ${r.slot} into ${(r.halves || []).join(" and ")}: paused ${fmtMs(r.pause_ms)}.`);
}

async function mergeWithNext(id) {
  const p = state.partitions.find((x) => x.id === id);
  const next = p && state.partitions.find((q) => q.pipeline === p.pipeline && q.slots[0] === p.slots[1]);
  if (!next) { notice(`${id} has no neighbour on its right to merge with.`); return; }
  progress(`Merging ${id} and ${next.id}${next.owner !== p.owner ? ` (moving ${next.id} to ${p.owner} first)` : ""}…`);
  const r = await act(`Merging ${id} and ${next.id}`, () => api("POST", "/api/v1/partitions/merge", { left: id, right: next.id }));
  if (r) progress(`Merged ${id} and ${next.id} into ${r.merged}: paused ${fmtMs(r.pause_ms)}.`);
}

async function checkpoint(id) {
  const r = await act(`Checkpointing ${id}`, () => api("POST", `/api/v1/partitions/${encodeURIComponent(id)}/checkpoint`));
  if (r) progress(`Checkpoint of ${id}: ${fmtBytes(r.uploaded_bytes)} uploaded, ${r.files_reused} files reused, ${fmtBytes(r.size_bytes)} in all, in ${fmtMs(r.duration_ms)}.`);
}

async function swap(name, version) {
  progress(`Swapping ${name} to version ${version}…`);
  const r = await act(`Swapping ${name} to version ${version}`, () => api("PUT", `/api/v1/pipelines/${encodeURIComponent(name)}/module`, { version }));
  if (r) {
    if (r.outcome === "rolled-back") notice(`Swapping ${name} to version ${version} was rolled back: ${r.reason || "a partition refused it"}.`);
    else progress(`${name} runs version ${r.running} (${r.outcome}).`);
  }
}

async function rollback(name) {
  const p = state.pipelines.find((x) => x.name === name);
  const last = p && (p.swaps || [])[p.swaps.length - 1];
  if (!last) return;
  const ok = await confirmAction(`Roll back ${name}?`, `${name} runs version ${p.version}; it goes back to version ${last.from}, at a batch boundary on every partition.`);
  if (ok) await swap(name, last.from);
}

async function replay(name) {
  const r = await act(`Replaying the dead letters of ${name}`, () => api("POST", `/api/v1/pipelines/${encodeURIComponent(name)}/dead-letters/replay`, {}));
  if (r) progress(`Replayed the dead letters of ${name}: ${JSON.stringify(r)}`);
}

async function deletePipeline(name) {
  const purge = el("input", { type: "checkbox", id: "purge" });
  const extra = el("p", {}, purge, " ", el("label", { for: "purge", text: "Also purge its state, changelogs and dead letters" }));
  const ok = await confirmAction(`Delete pipeline ${name}?`, `Its partitions stop on every host. Input and output topics stay.`, extra);
  if (!ok) return;
  const r = await act(`Deleting ${name}`, () => api("DELETE", `/api/v1/pipelines/${encodeURIComponent(name)}?purge=${purge.checked}`));
  if (r !== undefined) progress(`Deleted pipeline ${name}${purge.checked ? " and purged its state" : ""}.`);
}

async function deleteModule(name, version) {
  const ok = await confirmAction(`Delete ${name} version ${version}?`, "A version a pipeline runs cannot be deleted.");
  if (!ok) return;
  const r = await act(`Deleting ${name} version ${version}`, () => api("DELETE", `/api/v1/modules/${encodeURIComponent(name)}/${encodeURIComponent(version)}`));
  if (r !== undefined) progress(`Deleted module ${name} version ${version}.`);
}

async function upload(file) {
  const name = $("#u-name").value.trim() || file.name.replace(/\.wasm$/, "").replace(/_/g, "-");
  const version = $("#u-version").value.trim();
  $("#upload-msg").textContent = "";
  if (!version) { $("#upload-msg").textContent = "Give the version to upload as."; $("#u-version").focus(); return; }
  progress(`Uploading ${file.name} (${fmtBytes(file.size)}) as ${name} version ${version}…`);
  const bytes = await file.arrayBuffer();
  const r = await act(`Uploading ${name} version ${version}`, () => api("POST", `/api/v1/modules?name=${encodeURIComponent(name)}&version=${encodeURIComponent(version)}`, bytes));
  if (r) { progress(`Uploaded ${r.name} version ${r.version} (${fmtBytes(r.size)}).`); $("#upload-msg").textContent = `Uploaded ${r.name} version ${r.version}.`; }
  else $("#upload-msg").textContent = $("#notice").textContent;
}
$("#upload-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const f = $("#u-file").files[0];
  if (!f) { $("#upload-msg").textContent = "Choose a component file first, or drop one below."; return; }
  void upload(f);
});
$("#u-file").addEventListener("change", () => {
  const f = $("#u-file").files[0];
  if (f && !$("#u-name").value) $("#u-name").value = f.name.replace(/\.wasm$/, "").replace(/_/g, "-");
});
const drop = $("#drop");
drop.addEventListener("dragover", (ev) => { ev.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (ev) => {
  ev.preventDefault(); drop.classList.remove("over");
  const f = ev.dataTransfer.files[0];
  if (f) void upload(f);
});

$("#create-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = ev.target;
  const msg = $("#create-msg");
  msg.textContent = "";
  const list = (v) => v.split(",").map((x) => x.trim()).filter(Boolean);
  const bad = (input, text) => { input.setAttribute("aria-invalid", "true"); input.focus(); msg.textContent = text; };
  for (const i of f.querySelectorAll("[aria-invalid]")) i.removeAttribute("aria-invalid");
  const name = f.name.value.trim();
  if (!/^[a-z0-9][a-z0-9-]*$/.test(name)) return bad(f.name, "The name must be lower-case letters, digits and dashes, starting with a letter or digit.");
  if (!f.module.value) return bad(f.module, "Upload a module first: a pipeline runs one.");
  const inputs = list(f.inputs.value);
  if (!inputs.length) return bad(f.inputs, "Name at least one input topic.");
  const slots = Number(f.slots.value); const partitions = Number(f.partitions.value);
  if (!Number.isInteger(slots) || slots < 1) return bad(f.slots, "Slots must be a whole number, 1 or more.");
  if (!Number.isInteger(partitions) || partitions < 1 || partitions > slots) return bad(f.partitions, `Partitions must be a whole number from 1 to the ${slots} slots.`);
  const spec = { name, module: f.module.value, version: f.version.value, inputs, slots, partitions, guarantee: f.guarantee.value };
  const outputs = list(f.outputs.value); if (outputs.length) spec.outputs = outputs;
  const stores = list(f.stores.value); if (stores.length) spec.stores = stores;
  if (f.config.value.trim()) {
    try { spec.config = JSON.parse(f.config.value); } catch (e) { return bad(f.config, `The config is not JSON: ${e.message}`); }
    if (typeof spec.config !== "object" || Array.isArray(spec.config) || spec.config === null) return bad(f.config, "The config must be a JSON object.");
  }
  const r = await act(`Creating pipeline ${name}`, () => api("POST", "/api/v1/pipelines", spec));
  if (r) { progress(`Created pipeline ${name}: its partitions start.`); msg.textContent = `Created ${name}.`; }
  else msg.textContent = $("#notice").textContent;
});

$("#produce-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const topic = $("#p-topic").value.trim();
  const lines = $("#p-records").value.split("\n").map((l) => l.trim()).filter(Boolean);
  if (!topic || !lines.length) { $("#produce-msg").textContent = "Give a topic and at least one record."; return; }
  const records = lines.map((l) => { const i = l.indexOf(" "); return i < 0 ? { key: l, value: l } : { key: l.slice(0, i), value: l.slice(i + 1) }; });
  const r = await act(`Producing ${records.length} records to ${topic}`, () => api("POST", `/api/v1/topics/${encodeURIComponent(topic)}/records`, records));
  if (r) { $("#produce-msg").textContent = `Produced ${r.length} records to ${topic}.`; progress(`Produced ${r.length} records to ${topic}.`); }
});

function showLookup(items, restoring) {
  const out = $("#query-out");
  if (!items.length) { out.replaceChildren(el("p", { text: "Nothing found." })); return; }
  const table = el("table", {}, el("thead", {}, el("tr", {}, ...["key", "value", "slot", "partition", "owner"].map((h) => el("th", { scope: "col", text: h })))),
    el("tbody", {}, ...items.map((x) => el("tr", {}, ...[x.key, x.value_i64 !== undefined ? String(x.value_i64) : x.value ?? `(base64) ${x.value_base64}`, x.slot, x.partition, x.owner].map((v) => el("td", { text: String(v) }))))));
  out.replaceChildren(el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": "Query results" }, table), restoring ? el("p", { class: "muted", text: "A partition was restoring: values may be older than the changelog." }) : "");
}
$("#query-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const p = $("#q-pipeline").value; const s = $("#q-store").value; const k = $("#q-key").value;
  if (!p || !s || !k) { $("#query-out").textContent = "Choose a pipeline and a store, and give a key."; return; }
  try {
    const r = await api("GET", `/api/v1/pipelines/${encodeURIComponent(p)}/stores/${encodeURIComponent(s)}/keys/${encodeURIComponent(k)}`);
    showLookup([r], r.restoring);
  } catch (e) {
    $("#query-out").textContent = e.status === 404 ? `No key “${k}” in ${p}/${s}.` : `Lookup failed: ${e.message}`;
  }
});
$("#q-scan").addEventListener("click", async () => {
  const p = $("#q-pipeline").value; const s = $("#q-store").value; const k = $("#q-key").value;
  if (!p || !s) { $("#query-out").textContent = "Choose a pipeline and a store."; return; }
  try {
    const r = await api("GET", `/api/v1/pipelines/${encodeURIComponent(p)}/stores/${encodeURIComponent(s)}/keys?prefix=${encodeURIComponent(k)}&limit=100`);
    showLookup(r.items, r.restoring);
  } catch (e) { $("#query-out").textContent = `Browsing failed: ${e.message}`; }
});

// Relative times age between snapshots too.
setInterval(() => { if (state && Date.now() - lastMessage > 5000 && !failing) setConn(`live from host ${state.host} · no change for ${Math.round((Date.now() - lastMessage) / 1000)} s`); }, 1000);

connect(base);
