// Moment's planning page: talks to the service's JSON API (v1/...) and draws the answers.
// Plain DOM code, no framework and nothing fetched from elsewhere, so the package serves it as is.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);

const state = {
  profiles: [],       // GET v1/profiles
  models: [],         // GET v1/models
  uploaded: null,     // {name, field, text}: an uploaded profile YAML, NCCL XML or hwloc XML
  targets: [],        // links a what-if can change (v1/whatif/targets)
  changes: [],        // what-if `set` overrides
  original: null,     // {req, plan}
  whatif: null,       // {req, plan}
  diagramUrls: [],
};

// ---- talking to the service ------------------------------------------------------------------------

function token() {
  return new URLSearchParams(location.hash.slice(1)).get("token");
}

// A readable sentence for a failed response: FastAPI's {detail: "..."} or {detail: [{loc, msg}]},
// {error, hint}, or the raw text.
function errorMessage(status, statusText, data, text) {
  let msg = "";
  const d = data && (data.detail !== undefined ? data.detail : data);
  if (typeof d === "string") msg = d;
  else if (Array.isArray(d)) {
    msg = d.map((e) => {
      const loc = Array.isArray(e.loc) ? e.loc.filter((p) => p !== "body").join(".") : "";
      return (loc ? loc + ": " : "") + (e.msg || JSON.stringify(e));
    }).join("; ");
  } else if (d && typeof d === "object") {
    msg = d.message || d.error || JSON.stringify(d);
    if (d.hint) msg += " (hint: " + d.hint + ")";
  } else msg = (text || "").trim().slice(0, 300);
  if (data && typeof data.hint === "string" && data.hint && !msg.includes(data.hint)) msg += "\nhint: " + data.hint;
  if (status === 401 || status === 403) {
    msg += " (this service needs a token: open the page as …/#token=YOUR_TOKEN)";
  }
  return `${status}${statusText ? " " + statusText : ""}: ${msg || "no details given"}`;
}

async function api(method, path, body) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  let resp;
  try {
    resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new Error(`cannot reach the Moment service (${e.message})`);
  }
  const text = await resp.text();
  let data = null;
  try { data = JSON.parse(text); } catch (_) { data = null; }
  if (!resp.ok) throw new Error(errorMessage(resp.status, resp.statusText, data, text));
  if (data === null) throw new Error(`${path}: the service answered something that is not JSON`);
  return data;
}

function showError(where, err) {
  const box = $("#error");
  box.textContent = "";
  const b = document.createElement("b");
  b.textContent = where + " failed: ";
  box.append(b, document.createTextNode(err.message || String(err)));
  const close = el("button", { class: "close", type: "button", title: "dismiss" }, "×");
  close.addEventListener("click", clearError);
  box.append(close);
  box.hidden = false;
}

function clearError() {
  $("#error").hidden = true;
}

let busyCount = 0;
async function busy(text, fn) {
  busyCount++;
  $("#busy-text").textContent = text;
  $("#busy").hidden = false;
  document.querySelectorAll("button.primary, #compare-btn, #advise-btn").forEach((b) => { b.disabled = true; });
  try {
    return await fn();
  } finally {
    busyCount--;
    if (!busyCount) {
      $("#busy").hidden = true;
      document.querySelectorAll("button.primary, #compare-btn, #advise-btn").forEach((b) => { b.disabled = false; });
    }
  }
}

// ---- small DOM helpers -----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function option(value, text, selected) {
  const o = el("option", { value }, text);
  if (selected) o.selected = true;
  return o;
}

const fmt = (x, d = 2) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d));
const natural = (a, b) => a.localeCompare(b, undefined, { numeric: true });

// ---- the form --------------------------------------------------------------------------------------

function source() {
  return document.querySelector("input[name=source]:checked").value;
}

function profileLabel() {
  return source() === "upload" ? (state.uploaded ? state.uploaded.name : "uploaded profile") : $("#profile").value;
}

// The POST v1/plan body of the form, with what-if changes on top when given.
/** The GPU/SSD counts (left out when blank) and models of the inventory form, into `req`. */
function countsAndModels(req) {
  const gpus = $("#gpus").value.trim();
  if (gpus !== "") req.gpus = parseInt(gpus, 10);
  const ssds = $("#ssds").value.trim();
  if (ssds !== "") req.ssds = parseInt(ssds, 10);
  req.gpu_model = $("#gpu-model").value;
  req.ssd_model = $("#ssd-model").value;
}

function planRequest(whatif) {
  const req = machineFields();
  const inv = $("#inventory").value.trim();
  if (inv) {
    req.inventory = inv;
  } else {
    countsAndModels(req);
    if (whatif) {
      req.gpu_model = $("#wi-gpu-model").value || req.gpu_model;
      req.ssd_model = $("#wi-ssd-model").value || req.ssd_model;
    }
  }
  req.set = whatif ? state.changes.slice() : [];
  req.diagram = true;
  return req;
}

function fillModels() {
  const gpus = state.models.filter((m) => m.kind === "gpu");
  const ssds = state.models.filter((m) => m.kind === "ssd");
  const fill = (sel, list, def, keepLabel) => {
    sel.textContent = "";
    if (keepLabel) sel.append(option("", keepLabel, true));
    for (const m of list) {
      const extra = m.kind === "gpu" ? `PCIe ${m.gen} x${m.lanes}, ${m.memory_gib} GiB`
        : `${m.read_gbps} GB/s read, PCIe ${m.gen} x${m.lanes}`;
      sel.append(option(m.name, `${m.name} (${extra})`, !keepLabel && m.name === def));
    }
  };
  fill($("#gpu-model"), gpus, "A100-PCIe-40GB");
  fill($("#ssd-model"), ssds, "P5510");
  fill($("#wi-gpu-model"), gpus, null, "unchanged");
  fill($("#wi-ssd-model"), ssds, null, "unchanged");
  const checks = (box, list, on) => {
    box.textContent = "";
    for (const m of list) {
      const cb = el("input", { type: "checkbox", value: m.name });
      cb.checked = on.includes(m.name);
      box.append(el("label", {}, cb, " " + m.name));
    }
  };
  checks($("#budget-gpus"), gpus, ["A100-PCIe-40GB"]);
  checks($("#budget-ssds"), ssds, ["P5510"]);
}

function fillProfiles() {
  const sel = $("#profile");
  sel.textContent = "";
  for (const p of state.profiles) sel.append(option(p.name, p.name, p.name === "paper-machine-b"));
  describeProfile();
  const list = $("#compare-list");
  list.textContent = "";
  for (const p of state.profiles) {
    const cb = el("input", { type: "checkbox", value: p.name });
    cb.checked = p.name.startsWith("paper-machine");
    list.append(el("label", { title: p.description || "" }, cb, " " + p.name));
  }
}

function describeProfile() {
  const p = state.profiles.find((x) => x.name === $("#profile").value);
  if (!p) { $("#profile-desc").textContent = ""; return; }
  const c = p.counts || {};
  const parts = [];
  if (c.gpu) parts.push(`${c.gpu} GPU${c.gpu > 1 ? "s" : ""} built in`);
  parts.push(`${p.empty_slots} empty slot${p.empty_slots === 1 ? "" : "s"}`);
  if (c.switch) parts.push(`${c.switch} switch${c.switch > 1 ? "es" : ""}`);
  $("#profile-desc").textContent = `${p.description || p.name} (${parts.join(", ")})`;
}

const MACHINE_FIELDS = ["profile", "profile_yaml", "nccl_xml", "hwloc_xml"];

// Which request field an uploaded file goes in: an XML is NCCL's (<system>) or hwloc's (<topology>).
function uploadField(name, text) {
  const head = text.slice(0, 4096);
  if (/\.xml$/i.test(name) || /^\s*<(\?xml|system|topology)/.test(head)) {
    return /<topology[\s>]/.test(head) ? "hwloc_xml" : "nccl_xml";
  }
  return "profile_yaml";
}

function readUpload() {
  const f = $("#profile-file").files[0];
  state.uploaded = null;
  if (!f) return;
  if (f.size > 8 * 1048576) {
    showError("Upload", new Error(`${f.name} is ${(f.size / 1048576).toFixed(1)} MiB; the service takes at most 8 MiB`));
    return;
  }
  const reader = new FileReader();
  reader.onload = () => {
    const text = String(reader.result);
    const field = uploadField(f.name, text);
    state.uploaded = { name: f.name, field, text };
    const what = { profile_yaml: "a profile (YAML)", nccl_xml: "an NCCL topology XML", hwloc_xml: "an hwloc XML" }[field];
    $("#upload-desc").textContent = `${f.name} (${f.size.toLocaleString()} bytes), read as ${what}, is sent with each request.`;
  };
  reader.onerror = () => showError("Upload", new Error(`cannot read ${f.name}`));
  reader.readAsText(f);
}

// ---- plan, what-if, compare ------------------------------------------------------------------------

async function runPlan(ev) {
  if (ev) ev.preventDefault();
  clearError();
  let req;
  try { req = planRequest(false); } catch (e) { showError("Plan", e); return; }
  await busy(`Planning ${profileLabel()}…`, async () => {
    try {
      const plan = await api("POST", "v1/plan", req);
      state.original = { req, plan, label: profileLabel() };
      state.whatif = null;
      state.changes = [];
      $("#wi-gpu-model").value = "";
      $("#wi-ssd-model").value = "";
      renderChanges();
      renderResults();
      await loadTargets(req);
    } catch (e) {
      showError("Plan", e);
    }
  });
}

async function loadTargets(planReq) {
  const body = {};
  for (const k of MACHINE_FIELDS) if (planReq[k] !== undefined) body[k] = planReq[k];
  try {
    const res = await api("POST", "v1/whatif/targets", body);
    state.targets = res.links || [];
  } catch (e) {
    state.targets = [];
    showError("Listing the machine's links", e);
  }
  const sel = $("#wi-target");
  sel.textContent = "";
  let group = null;
  let last = "";
  for (const [i, t] of state.targets.entries()) {
    if (t.group !== last) {
      group = el("optgroup", { label: t.group });
      sel.append(group);
      last = t.group;
    }
    group.append(option(String(i), t.label, t.target === (state.targets.find((x) => x.suggested) || {}).target));
  }
  $("#whatif-fields").disabled = false;
  $("#whatif-card").setAttribute("aria-disabled", "false");
  $("#whatif-hint").textContent = `Change ${state.original.label}: pick a link and a new value, or other device models.`;
  targetChanged();
}

const PROPS = {
  gen: { text: "PCIe generation", hint: "1-6" },
  width: { text: "lanes (width)", hint: "1, 2, 4, 8, 16" },
  bandwidth_gbps: { text: "bandwidth, GB/s", hint: "measured one-direction GB/s" },
  count: { text: "parallel links", hint: "how many" },
  gts: { text: "transfer rate, GT/s", hint: "UPI/QPI GT/s" },
};

function currentTarget() {
  return state.targets[parseInt($("#wi-target").value, 10)];
}

function targetChanged() {
  const t = currentTarget();
  const sel = $("#wi-prop");
  sel.textContent = "";
  if (!t) return;
  for (const p of t.props) sel.append(option(p, PROPS[p] ? PROPS[p].text : p));
  propChanged();
}

function propChanged() {
  const t = currentTarget();
  const p = $("#wi-prop").value;
  if (!t || !p) return;
  const cur = t.current || {};
  const now = cur[p];
  let suggest = "";
  if (p === "gen" && now) suggest = String(Math.min(6, now + 1));
  else if (p === "bandwidth_gbps" && t.bandwidth_gbps) suggest = String(Math.round(t.bandwidth_gbps * 2));
  else if (p === "width" && now) suggest = String(Math.min(32, now * 2));
  else if (now !== undefined && now !== null) suggest = String(now);
  $("#wi-value").value = suggest;
  $("#wi-value").placeholder = PROPS[p] ? PROPS[p].hint : "";
  const bits = [];
  if (cur.gen) bits.push(`PCIe ${cur.gen}`);
  if (cur.width) bits.push(`x${cur.width}`);
  if (cur.count) bits.push(`${cur.count} link${cur.count > 1 ? "s" : ""}`);
  if (cur.gts) bits.push(`${cur.gts} GT/s`);
  if (t.bandwidth_gbps) bits.push(`${fmt(t.bandwidth_gbps, 1)} GB/s${cur.bandwidth_gbps ? " (measured)" : ""}`);
  $("#wi-current").textContent = bits.length ? `Now: ${bits.join(", ")}.` : "";
}

function addChange(text) {
  text = text.trim();
  if (!text) return;
  if (!/^[^=]+=.+$/.test(text)) {
    showError("What-if", new Error(`"${text}" is not PATH=VALUE, e.g. nodes.sw1.link.gen=5`));
    return;
  }
  const key = text.split("=")[0].replace(/\+$/, "");
  // one value per path: a new value for the same field replaces the old one
  state.changes = state.changes.filter((c) => c.includes("+=") || c.split("=")[0] !== key);
  state.changes.push(text);
  clearError();
  renderChanges();
}

function addPickedChange() {
  const t = currentTarget();
  const p = $("#wi-prop").value;
  const v = $("#wi-value").value.trim();
  if (!t || !p) return;
  if (v === "" || Number.isNaN(Number(v))) {
    showError("What-if", new Error(`${PROPS[p] ? PROPS[p].text : p} of ${t.label}: give a number`));
    return;
  }
  addChange(`${t.target}.${p}=${v}`);
}

function renderChanges() {
  const ul = $("#wi-changes");
  ul.textContent = "";
  for (const c of state.changes) {
    const rm = el("button", { type: "button", class: "x", title: "remove this change" }, "×");
    rm.addEventListener("click", () => {
      state.changes = state.changes.filter((x) => x !== c);
      renderChanges();
    });
    ul.append(el("li", {}, el("code", {}, c), rm));
  }
}

async function runWhatif() {
  clearError();
  if (!state.original) { showError("What-if", new Error("plan first")); return; }
  const req = planRequest(true);
  const sameModels = req.gpu_model === state.original.req.gpu_model && req.ssd_model === state.original.req.ssd_model;
  if (!state.changes.length && sameModels) {
    showError("What-if", new Error("add a change (a link or a device model) first"));
    return;
  }
  // the what-if keeps the machine and inventory of the plan it is compared with
  for (const k of [...MACHINE_FIELDS, "inventory", "gpus", "ssds"]) {
    if (state.original.req[k] === undefined) delete req[k];
    else req[k] = state.original.req[k];
  }
  await busy("Planning the what-if…", async () => {
    try {
      const plan = await api("POST", "v1/plan", req);
      state.whatif = { req, plan, label: state.original.label };
      renderResults();
    } catch (e) {
      showError("What-if", e);
    }
  });
}

async function runCompare() {
  clearError();
  const names = [...document.querySelectorAll("#compare-list input:checked")].map((c) => c.value);
  if (names.length < 1) { showError("Compare", new Error("tick at least one machine")); return; }
  const req = { profiles: names };
  const inv = $("#inventory").value.trim();
  if (inv) req.inventories = [inv];
  else countsAndModels(req);
  await busy(`Comparing ${names.length} machines…`, async () => {
    try {
      const rows = await api("POST", "v1/compare", req);
      renderCompare(rows);
    } catch (e) {
      showError("Compare", e);
    }
  });
}

// The machine part of a request (a built-in name or the uploaded text), as planRequest sends it.
function machineFields() {
  if (source() === "upload") {
    if (!state.uploaded) throw new Error("choose a profile YAML file to upload first");
    return { [state.uploaded.field]: state.uploaded.text };
  }
  return { profile: $("#profile").value };
}

async function runAdvise() {
  clearError();
  let req;
  try {
    req = machineFields();
  } catch (e) { showError("Advice", e); return; }
  const num = (id) => { const v = $(id).value.trim(); return v === "" ? undefined : Number(v); };
  req.budget = num("#budget");
  if (!(req.budget > 0)) { showError("Advice", new Error("give a budget in USD, e.g. 60000")); return; }
  req.years = num("#budget-years");
  req.max_gpus = num("#budget-max-gpus");
  req.max_ssds = num("#budget-max-ssds");
  req.models = [...document.querySelectorAll("#budget-gpus input:checked, #budget-ssds input:checked")]
    .map((c) => c.value);
  for (const k of Object.keys(req)) if (req[k] === undefined) delete req[k];
  await busy(`Pricing and placing inventories under $${req.budget.toLocaleString()}…`, async () => {
    try {
      renderAdvice(await api("POST", "v1/advise", req));
    } catch (e) {
      showError("Advice", e);
    }
  });
}

const usd = (x) => "$" + Math.round(x).toLocaleString("en-US");
const invSpec = (c) => c.items.map((i) => `${i.count}x${i.model}`).join(",");

// A mixed inventory names the devices itself: the count and model fields are then not used.
function syncInventory() {
  const mixed = $("#inventory").value.trim() !== "";
  for (const id of ["#wi-gpu-model", "#wi-ssd-model", "#gpus", "#ssds", "#gpu-model", "#ssd-model"]) {
    $(id).disabled = mixed;
    $(id).title = mixed ? "the mixed inventory names the devices" : "";
  }
}

function planCandidate(c) {
  $("#inventory").value = invSpec(c);
  syncInventory();
  window.scrollTo({ top: 0, behavior: "smooth" });
  runPlan();
}

function renderAdvice(r) {
  const out = $("#advise-out");
  out.textContent = "";
  const pick = (title, c) => {
    const btn = el("button", { type: "button", title: `plan ${invSpec(c)} on this machine` }, "Plan this");
    btn.addEventListener("click", () => planCandidate(c));
    return el("div", { class: "pick", "data-testid": "pick" },
      el("div", { class: "col-kind" }, title),
      el("h4", {}, c.inventory),
      el("dl", {},
        el("dt", {}, "epoch read"), el("dd", {}, `${fmt(c.epoch_s)} s`),
        el("dt", {}, "throughput"), el("dd", {}, `${Math.round(c.throughput_samples_per_s).toLocaleString()} samples/s`),
        el("dt", {}, "hardware"), el("dd", {}, usd(c.hardware_usd)),
        el("dt", {}, `TCO, ${r.params.years} years`), el("dd", {}, usd(c.tco_usd)),
        el("dt", {}, "samples/s per TCO $"), el("dd", {}, fmt(c.tpc, 3))),
      btn);
  };
  const same = r.best_throughput_per_dollar.inventory === r.best_throughput.inventory;
  const picks = el("div", { class: "picks" },
    pick(same ? "Best per dollar and best throughput" : "Best throughput per dollar", r.best_throughput_per_dollar),
    same ? null : pick("Best throughput", r.best_throughput));
  const tbody = el("tbody");
  const rows = r.candidates.slice(0, 12);
  for (const c of rows) {
    const btn = el("button", { type: "button", class: "small" }, "Plan");
    btn.addEventListener("click", () => planCandidate(c));
    const rank = [c.rank_per_dollar ? `#${c.rank_per_dollar} per $` : "", c.rank_throughput ? `#${c.rank_throughput} speed` : ""]
      .filter(Boolean).join(", ");
    tbody.append(el("tr", { class: c.inventory === r.best_throughput_per_dollar.inventory ? "rec" : null },
      el("td", {}, rank || "–"), el("td", {}, c.inventory),
      el("td", { class: "num" }, fmt(c.epoch_s)),
      el("td", { class: "num" }, Math.round(c.throughput_samples_per_s).toLocaleString()),
      el("td", { class: "num" }, usd(c.hardware_usd)), el("td", { class: "num" }, usd(c.tco_usd)),
      el("td", { class: "num" }, fmt(c.tpc, 3)), el("td", {}, btn)));
  }
  const prices = r.prices || {};
  const server = prices.server || {};
  out.append(el("h2", {}, `What to buy for ${r.machine} under ${usd(r.budget_usd)}`), picks,
    el("div", { class: "scroll" }, el("table", { class: "tbl advise", "data-testid": "advise" },
      el("thead", {}, el("tr", {}, ["rank", "inventory", "epoch read, s", "samples/s", "hardware", "TCO",
        "samples/s per TCO $", ""].map((h, i) => el("th", { class: i >= 2 && i <= 6 ? "num" : null }, h)))),
      tbody)),
    el("p", { class: "hint" },
      `${r.searched} inventories fit the chassis: ${r.over_budget} over budget, ${r.pruned} ruled out by a bound, `
      + `${r.solved} placed by the planner${r.unplaceable ? ` (${r.unplaceable} could not be placed)` : ""}, `
      + `in ${fmt(r.elapsed_s, 1)} s. ${rows.length < r.candidates.length ? `The best ${rows.length} of ${r.candidates.length} shown. ` : ""}`
      + `Prices: ${prices.origin || "shipped"} table${server.date ? `, server price of ${server.date}` : ""}; `
      + "the budget covers the server, GPUs and SSDs."));
  out.hidden = false;
  out.scrollIntoView({ behavior: "smooth", block: "start" });
}

// ---- drawing the results ---------------------------------------------------------------------------

function renderResults() {
  $("#welcome").hidden = true;
  const box = $("#results");
  box.hidden = false;
  box.textContent = "";
  for (const u of state.diagramUrls) URL.revokeObjectURL(u);
  state.diagramUrls = [];
  const both = [state.original, state.whatif].filter(Boolean);
  const scale = Math.max(1, ...both.flatMap((r) => r.plan.predicted.per_gpu_inlet_gbps || []));
  const left = columnCards(state.original, null, scale, "original");
  if (!state.whatif) {
    box.classList.remove("two");
    box.append(...left);
    return;
  }
  // two columns, section by section, so that the same section of both plans sits on one row
  const right = columnCards(state.whatif, state.original, scale, "whatif");
  box.classList.add("two");
  left.forEach((card, i) => box.append(card, right[i]));
}

function slotsByDevice(plan) {
  const out = {};
  for (const [slot, dev] of Object.entries(plan.devices || {})) out[dev] = slot;
  return out;
}

function deltaBanner(plan, base) {
  const a = base.plan.predicted.epoch_read_s;
  const b = plan.predicted.epoch_read_s;
  const rel = (b - a) / a;
  let cls = "same";
  let words = "about the same";
  if (rel < -0.005) { cls = "faster"; words = `${fmt(-rel * 100, 1)}% faster (${fmt(a / b, 2)}×)`; }
  else if (rel > 0.005) { cls = "slower"; words = `${fmt(rel * 100, 1)}% slower`; }
  return el("div", { class: "delta " + cls, "data-testid": "delta" },
    el("span", { class: "delta-label" }, "Epoch read vs the original"),
    el("span", { class: "delta-val" }, `${fmt(a)} s → ${fmt(b)} s`),
    el("span", { class: "delta-words" }, words));
}

// The cards of one plan (head, why, placement, bandwidth, usual layouts, diagram), marked with its side.
function columnCards(run, base, scale, side) {
  const { plan, req } = run;
  const p = plan.predicted;
  const cards = [];
  const col = { append: (...c) => cards.push(...c) };
  const head = el("div", { class: "card head" },
    el("div", { class: "col-kind" }, base ? "What-if" : "Recommended plan"),
    el("h2", {}, `${plan.machine}`),
    el("p", { class: "inv" }, plan.inventory, builtInNote(plan)),
  );
  if (base) {
    const list = el("ul", { class: "changes ro" });
    for (const c of req.set || []) list.append(el("li", {}, el("code", {}, c)));
    if (req.gpu_model && req.gpu_model !== base.req.gpu_model) list.append(el("li", {}, `GPU model ${req.gpu_model}`));
    if (req.ssd_model && req.ssd_model !== base.req.ssd_model) list.append(el("li", {}, `SSD model ${req.ssd_model}`));
    head.append(list, deltaBanner(plan, base));
  }
  const best = bestBaseline(plan);
  head.append(el("div", { class: "kpis" },
    kpi("epoch read", `${fmt(p.epoch_read_s)} s`, "epoch"),
    kpi("all GPUs read", `${fmt(p.aggregate_gbps, 1)} GB/s`),
    kpi("vs best usual layout", best ? `${fmt(best.predicted.epoch_read_s / p.epoch_read_s)}×` : "–",
      null, best ? `best usual layout: ${best.name}, ${fmt(best.predicted.epoch_read_s)} s` : null),
  ));
  col.append(head);

  // the reason in words
  const rec = (plan.explanation || []).find((e) => e.layout === "recommended") || (plan.explanation || [])[0];
  const why = el("div", { class: "card" }, el("h3", {}, "Why"));
  if (rec) {
    why.append(el("p", { class: "why", "data-testid": "why" }, sentence(rec.text)));
    const limits = (rec.limits || []).map((l) => l.text).filter(Boolean);
    if (limits.length) {
      why.append(el("p", { class: "sub" }, "Limited by:"),
        el("ul", { class: "limits" }, limits.map((t) => el("li", {}, t))));
    }
  } else {
    why.append(el("p", { class: "why" }, "The service gave no explanation for this plan."));
  }
  col.append(why);

  // placement
  const bySlot = slotsByDevice(plan);
  const baseSlots = base ? slotsByDevice(base.plan) : null;
  const devs = Object.keys(bySlot).sort(natural);
  const tbody = el("tbody");
  for (const d of devs) {
    const slot = bySlot[d];
    const moved = baseSlots && baseSlots[d] !== slot;
    tbody.append(el("tr", { class: moved ? "moved" : null, title: moved ? `was in ${baseSlots[d] || "no slot"}` : null },
      el("td", {}, d), el("td", {}, el("code", {}, slot)), el("td", { class: "muted" }, plan.placement[slot] || "")));
  }
  const placement = el("div", { class: "card" }, el("h3", {}, "Placement"),
    el("table", { class: "tbl placement", "data-testid": "placement" },
      el("thead", {}, el("tr", {}, el("th", {}, "device"), el("th", {}, "slot"), el("th", {}, "model"))), tbody));
  if (baseSlots) placement.append(el("p", { class: "hint" }, "Highlighted rows moved compared with the original plan."));
  col.append(placement);

  // per-GPU bandwidth bars
  const bars = el("div", { class: "bars", "data-testid": "bars" });
  (p.gpus || []).forEach((g, i) => {
    const v = (p.per_gpu_inlet_gbps || [])[i] || 0;
    bars.append(el("div", { class: "bar-row" },
      el("span", { class: "bar-label" }, g, el("small", {}, bySlot[g] ? " " + bySlot[g] : "")),
      el("span", { class: "bar-track" }, el("span", { class: "bar-fill", style: `width:${(100 * v / scale).toFixed(1)}%` })),
      el("span", { class: "bar-val" }, `${fmt(v)} GB/s`)));
  });
  col.append(el("div", { class: "card" }, el("h3", {}, "Read bandwidth per GPU"), bars));

  // baselines
  col.append(baselinesCard(plan));

  // diagram
  const dia = el("div", { class: "card" }, el("h3", {}, "Diagram"));
  if (plan.diagram_svg) {
    const url = URL.createObjectURL(new Blob([plan.diagram_svg], { type: "image/svg+xml" }));
    state.diagramUrls.push(url);
    dia.append(el("a", { href: url, target: "_blank", rel: "noopener", class: "diagram-link", title: "open full size" },
      el("img", { src: url, alt: `diagram of ${plan.machine}: ${plan.inventory}`, class: "diagram" })),
    el("p", { class: "hint" }, "Click the diagram to open it full size."));
  } else {
    dia.append(el("p", { class: "hint" }, "The service sent no diagram."));
  }
  col.append(dia);

  const s = plan.search;
  if (s) {
    dia.append(el("p", { class: "foot" },
      `Searched ${s.raw_candidates.toLocaleString()} placements: ${s.distinct_candidates.toLocaleString()} distinct, `
      + `${s.solved} solved, in ${fmt(s.seconds_total)} s.`));
  }
  for (const c of cards) {
    c.classList.add("col-" + side);
    c.dataset.col = side;
    const h3 = c.querySelector("h3");
    if (h3 && side === "whatif") h3.append(el("span", { class: "tag" }, "what-if"));
  }
  return cards;
}

// GPUs the planner read from but did not place: the machine's own (SXM modules).
function builtInNote(plan) {
  const placed = new Set(Object.values(plan.devices || {}));
  const own = (plan.predicted.gpus || []).filter((g) => !placed.has(g)).length;
  return own ? `, plus ${own} built-in GPU${own > 1 ? "s" : ""} (not moved)` : "";
}

function sentence(t) {
  t = String(t || "").trim();
  if (!t) return t;
  t = t[0].toUpperCase() + t.slice(1);
  return /[.!?]$/.test(t) ? t : t + ".";
}

function kpi(label, value, id, title) {
  return el("div", { class: "kpi", title, "data-kpi": id },
    el("span", { class: "kpi-val" }, value), el("span", { class: "kpi-label" }, label));
}

function bestBaseline(plan) {
  let best = null;
  for (const b of plan.baselines || []) {
    if (!best || b.predicted.epoch_read_s < best.predicted.epoch_read_s) best = b;
  }
  return best;
}

function baselinesCard(plan) {
  const rec = plan.predicted.epoch_read_s;
  const why = {};
  for (const e of plan.explanation || []) why[e.layout] = e.text;
  const tbody = el("tbody");
  tbody.append(el("tr", { class: "rec" },
    el("td", {}, el("b", {}, "recommended")), el("td", { class: "num" }, fmt(rec)), el("td", { class: "num" }, "1.00×")));
  const rows = (plan.baselines || []).slice().sort((a, b) =>
    a.predicted.epoch_read_s - b.predicted.epoch_read_s || natural(a.name, b.name));
  for (const b of rows) {
    const t = b.predicted.epoch_read_s;
    const ratio = t / rec;
    const name = el("details", {}, el("summary", {}, b.name),
      el("p", {}, b.description || ""), why[b.name] ? el("p", { class: "muted" }, sentence(why[b.name])) : null);
    tbody.append(el("tr", {},
      el("td", {}, name), el("td", { class: "num" }, fmt(t)),
      el("td", { class: "num " + (ratio > 1.005 ? "worse" : "") }, `${fmt(ratio)}×`)));
  }
  return el("div", { class: "card" }, el("h3", {}, "Usual layouts"),
    el("table", { class: "tbl baselines", "data-testid": "baselines" },
      el("thead", {}, el("tr", {}, el("th", {}, "layout (click for why)"), el("th", { class: "num" }, "epoch read, s"),
        el("th", { class: "num" }, "vs recommended"))), tbody));
}

function renderCompare(rows) {
  const out = $("#compare-out");
  out.textContent = "";
  const fastest = Math.min(...rows.map((r) => r.epoch_read_s));
  const tbody = el("tbody");
  for (const r of rows) {
    const per = r.per_gpu_inlet_gbps || [];
    tbody.append(el("tr", { class: r.epoch_read_s === fastest ? "rec" : null },
      el("td", { class: "name" }, el("b", {}, r.profile), r.built_in ? el("div", { class: "muted" }, r.built_in) : null),
      el("td", {}, r.inventory),
      el("td", { class: "num" }, fmt(r.epoch_read_s)),
      el("td", { class: "num" }, `${fmt(r.epoch_read_s / fastest)}×`),
      el("td", { class: "num" }, per.length ? fmt(Math.min(...per)) : "–"),
      el("td", { class: "num" }, fmt(r.aggregate_gbps, 1)),
      el("td", {}, r.bottleneck_summary || "–"),
      el("td", {}, r.best_baseline ? `${fmt(r.gain_vs_best_baseline)}× (${r.best_baseline})` : "–")));
  }
  out.append(el("h2", {}, "Machines compared"),
    el("div", { class: "scroll" }, el("table", { class: "tbl compare", "data-testid": "compare" },
      el("thead", {}, el("tr", {},
        ["machine", "inventory", "epoch read, s", "vs fastest", "slowest GPU, GB/s", "all GPUs, GB/s",
          "limited by", "gain over usual layouts"].map((h, i) => el("th", { class: i >= 2 && i <= 5 ? "num" : null }, h)))),
      tbody)),
    el("p", { class: "hint" }, "Each machine with its own recommended placement for the same inventory."));
  out.hidden = false;
  out.scrollIntoView({ behavior: "smooth", block: "start" });
}

// ---- start -----------------------------------------------------------------------------------------

async function start() {
  $("#plan-form").addEventListener("submit", runPlan);
  $("#profile").addEventListener("change", describeProfile);
  $("#profile-file").addEventListener("change", readUpload);
  for (const r of document.querySelectorAll("input[name=source]")) {
    r.addEventListener("change", () => {
      $("#builtin-box").hidden = source() !== "builtin";
      $("#upload-box").hidden = source() !== "upload";
    });
  }
  $("#wi-target").addEventListener("change", targetChanged);
  $("#wi-prop").addEventListener("change", propChanged);
  $("#wi-add").addEventListener("click", addPickedChange);
  $("#wi-raw-add").addEventListener("click", () => { addChange($("#wi-raw").value); $("#wi-raw").value = ""; });
  $("#wi-raw").addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); addChange($("#wi-raw").value); $("#wi-raw").value = ""; }
  });
  $("#whatif-btn").addEventListener("click", runWhatif);
  $("#inventory").addEventListener("input", syncInventory);
  $("#inventory").addEventListener("change", syncInventory);
  $("#compare-btn").addEventListener("click", runCompare);
  $("#advise-btn").addEventListener("click", runAdvise);
  try {
    const [profiles, models] = await Promise.all([api("GET", "v1/profiles"), api("GET", "v1/models")]);
    state.profiles = profiles;
    state.models = models;
    fillProfiles();
    fillModels();
    document.body.dataset.ready = "1";
  } catch (e) {
    showError("Loading the machines and models", e);
  }
}

start();
