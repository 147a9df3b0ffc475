// Moment's planning page: talks to the service's JSON API (v1/...) and draws the answers.
// Plain DOM code, no framework and nothing fetched from elsewhere, so the package serves it as is.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => [...root.querySelectorAll(sel)];

const state = {
  profiles: [],       // GET v1/profiles
  models: [],         // GET v1/models
  uploaded: null,     // {name, field, text}: an uploaded profile YAML, NCCL XML or hwloc XML
  machine: null,      // {key, name, summary}: what the chosen machine holds (v1/whatif/targets)
  machineSeq: 0,
  targets: [],        // links a what-if can change (v1/whatif/targets)
  changes: [],        // what-if `set` overrides
  original: null,     // {req, plan, label}
  whatif: null,       // {req, plan, label}
  diagramUrls: [],
};

// ---- talking to the service ------------------------------------------------------------------------

function token() {
  return new URLSearchParams(location.hash.slice(1)).get("token");
}

// A failed request: the service's words, the fields it names ({detail, errors: [{field, message}], hint}).
class ApiError extends Error {
  constructor(status, message, fields, hint, remedies) {
    super(message);
    this.status = status;
    this.fields = fields || [];
    this.hint = hint || "";
    this.remedies = remedies || [];  // the hint's alternatives, each {field, message}: the field it changes
  }
}

function apiError(status, statusText, data, text) {
  let msg = "";
  let fields = [];
  const d = data && (data.detail !== undefined ? data.detail : data);
  if (typeof d === "string") msg = d;
  else if (Array.isArray(d)) {  // FastAPI's own [{loc, msg}]
    fields = d.map((e) => ({
      field: Array.isArray(e.loc) ? e.loc.filter((p) => p !== "body").join(".") : "",
      message: e.msg || JSON.stringify(e),
    }));
    msg = fields.map((f) => (f.field ? f.field + ": " : "") + f.message).join("; ");
  } else if (d && typeof d === "object") msg = d.message || d.error || JSON.stringify(d);
  else msg = (text || "").trim().slice(0, 300);
  if (data && Array.isArray(data.errors)) fields = data.errors.filter((e) => e && e.field);
  if (status === 401 || status === 403) msg += " (this service needs a token: open the page as `…/#token=YOUR_TOKEN`)";
  if (status !== 422) msg = `${status}${statusText ? " " + statusText : ""}: ${msg || "no details given"}`;
  const remedies = data && Array.isArray(data.remedies) ? data.remedies.filter((r) => r && r.field && r.message) : [];
  return new ApiError(status, msg || "the service gave no reason", fields,
    data && typeof data.hint === "string" ? data.hint : "", remedies);
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
  if (!resp.ok) throw apiError(resp.status, resp.statusText, data, text);
  if (data === null) throw new Error(`${path}: the service answered something that is not JSON`);
  return data;
}

// ---- errors where they were caused -------------------------------------------------------------------
// Each card has its own error box by its button; an error that names a request field is shown under
// that field when the field is in the card the user acted on. The banner at the top is only for the
// page failing to load.

const CARDS = {
  plan: "#plan-form", whatif: "#whatif-card", compare: "#compare-card", advise: "#budget-card", cluster: "#cluster-card",
};
const UPLOAD_FIELDS = ["profile_yaml", "nccl_xml", "hwloc_xml", "lspci", "lspci_vvv", "dmidecode", "nvidia_smi"];
const FIELD_INPUTS = {
  plan: {
    profile: "#profile", gpus: "#gpus", ssds: "#ssds", gpu_model: "#gpu-model", ssd_model: "#ssd-model",
    inventory: "#inventory", ...Object.fromEntries(UPLOAD_FIELDS.map((f) => [f, "#profile-file"])),
  },
  whatif: { set: "#wi-changes", gpu_model: "#wi-gpu-model", ssd_model: "#wi-ssd-model" },
  compare: { machines: "#compare-list", profiles: "#compare-list" },
  advise: {
    budget: "#budget", years: "#budget-years", max_gpus: "#budget-max-gpus", max_ssds: "#budget-max-ssds",
    models: "#budget-gpus",
  },
  cluster: { remote_fraction: "#cl-remote", servers: "#cl-servers", nics: "#cl-nics", switch_gbit: "#cl-switch", nic: "#cl-nic" },
};
const WHAT = { plan: "Plan", whatif: "What-if", compare: "Compare", advise: "Advice", cluster: "Cluster plan" };

function visible(e) {
  return !!e && e.offsetParent !== null;
}

function clearErrors(kind) {
  const card = $(CARDS[kind]);
  for (const e of $$(".field-error", card)) e.remove();
  for (const e of $$("[aria-invalid]", card)) e.removeAttribute("aria-invalid");
  for (const e of $$(".invalid", card)) e.classList.remove("invalid");
  const box = $(".card-error", card);
  box.hidden = true;
  box.textContent = "";
}

// Where a field's message goes: in its label, or under the row of narrow fields it sits in (the
// counts beside the models), named by the field's label.
function messageSpot(input) {
  const label = input.closest("label");
  const narrow = label && label.closest(".grid2.count");
  if (narrow) return { after: narrow, prefix: label.firstChild.textContent.trim() + ": " };
  return label ? { inside: label, prefix: "" } : { after: input, prefix: "" };
}

function clearFieldError(input) {
  input.removeAttribute("aria-invalid");
  const spot = messageSpot(input);
  const old = spot.inside ? $(":scope > .field-error", spot.inside)
    : $$(":scope > .field-error", spot.after.parentElement).find((e) => e.dataset.for === input.id);
  if (old) old.remove();
}

function showFieldError(input, message, cls = "field-error", field = "") {
  if (cls === "field-error") clearFieldError(input);
  if (cls === "field-error") input.setAttribute("aria-invalid", "true");
  const spot = messageSpot(input);
  const p = el("p", { class: cls, "data-testid": cls, "data-for": input.id }, spot.prefix, richText(message));
  if (spot.inside) spot.inside.append(p);
  else spot.after.after(p);
  if (input.id === "wi-changes") {  // mark the change the error names: set.N, its text, or an id it quotes
    const items = $$("li", input);
    const index = /^set\.(\d+)/.exec(field);
    const quoted = [...message.matchAll(/'([^']+)'/g)].map((m) => m[1]);
    const named = index && items[+index[1]] ? [items[+index[1]]]
      : items.filter((li) => message.includes(li.dataset.change) || quoted.some((q) => li.dataset.change.includes(q)));
    for (const li of named) li.classList.add("invalid");
  }
}

// "gpus: Input should be ..." -> the field and the rest, when the message starts with a request field
// (or with the CLI's `--flag`, as some messages still do).
function leadingField(message, map) {
  const m = /^(--)?([a-z][a-z0-9_-]*)((?:\.[\w.-]*)?:)?\s+(.*)$/s.exec(message);
  const key = m ? m[2].replace(/-/g, "_") : null;
  if (!key || !map[key] || !(m[1] || m[3])) return [];
  return [{ field: key, message: m[3] ? m[4] : message.replace(/^--/, "") }];
}

// The input of a request field in any card (`max_gpus` -> #budget-max-gpus), or null.
function pageInput(field) {
  const key = String(field).split(".")[0];
  const map = Object.values(FIELD_INPUTS).find((m) => m[key]);
  return map ? $(map[key]) : null;
}

// How the page names a request field: its input's label ("Max GPUs"), or null where it has none.
function fieldLabel(field) {
  const input = pageInput(field);
  const label = input && input.closest("label");
  const first = label && label.firstChild;
  const text = first && first.nodeType === Node.TEXT_NODE ? first.textContent.trim() : "";
  return text || null;
}

// The service's words as the page shows them: `text in backticks` as code, a request field it spells
// (max_gpus, or `gpus` in backticks) as the label of the page's input for it.
function richText(text) {
  return String(text).split(/`([^`]+)`/).map((part, i) => {
    if (i % 2) return fieldLabel(part) || el("code", {}, part);
    return part.replace(/\b[a-z]+(?:_[a-z]+)+\b/g, (w) => fieldLabel(w) || w);
  });
}

// A note of the service's (a plan's `notes`) as the page shows it: text nodes, `text in backticks` as code.
function noteText(text) {
  return String(text).split(/`([^`]+)`/).map((part, i) => (i % 2 ? el("code", {}, part) : part));
}

// What a plan says beside its figures (a link its CPU caps, a rate above its wire rate, a usual layout the
// inventory does not fit, ...), or null when it says nothing.
function notesBox(notes) {
  if (!notes || !notes.length) return null;
  return el("div", { class: "notes", "data-testid": "notes" }, el("p", { class: "sub" }, notes.length > 1 ? "Notes:" : "Note:"),
    el("ul", {}, notes.map((n) => el("li", {}, noteText(/[.!?)]$/.test(n) ? n : n + ".")))));
}

// The advice of an error the page can follow: the hint's alternatives whose input the page has (the
// service names each one's field), else the hint as it is.
function hintOf(err) {
  const remedies = err.remedies || [];
  if (!remedies.length) return err.hint || "";
  return remedies.filter((r) => pageInput(r.field)).map((r) => r.message).join(" or ");
}

function sentence(t) {
  t = String(t || "").trim();
  if (!t) return t;
  t = t[0].toUpperCase() + t.slice(1);
  return /[.!?)]$/.test(t) ? t : t + ".";
}

// Show `err` in the card of `kind` (plan, whatif, compare, advise): under the fields it names when
// they are in that card, the rest (and the hint) in the card's box by its button.
function report(kind, err) {
  clearErrors(kind);
  const card = $(CARDS[kind]);
  const map = FIELD_INPUTS[kind];
  const message = err.message || String(err);
  const fields = err.fields && err.fields.length ? err.fields : leadingField(message, map);
  const rest = [];
  let placed = 0;
  for (const f of fields) {
    const key = String(f.field).split(".")[0];
    const input = map[key] ? $(map[key]) : null;
    if (input && card.contains(input) && (visible(input) || input.id === "wi-changes")) {
      const text = String(f.message || "").replace(new RegExp("^" + String(f.field).replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + ":\\s*"), "");
      showFieldError(input, sentence(text), "field-error", String(f.field));
      placed++;
    } else if (!f.field || f.field === "body") rest.push(f.message);  // the request as a whole: no field to name
    else rest.push(`${f.field}: ${String(f.message).replace(f.field + ": ", "")}`);
  }
  const box = $(".card-error", card);
  const hint = hintOf(err);
  box.textContent = "";
  box.append(el("b", {}, `${WHAT[kind]} failed: `));
  if (!fields.length) box.append(...richText(sentence(message)));
  else if (rest.length) box.append(...richText(sentence(rest.join("; "))));
  else box.append(placed > 1 ? "see the fields marked in red." : "see the field marked in red.");
  box.dataset.fieldsOnly = fields.length && !rest.length && !hint ? "1" : "";
  if (hint) box.append(el("span", { class: "hint-line" }, "Hint: ", richText(hint)));
  box.hidden = false;
  const first = $(".field-error", card) || box;
  if (!inView(first)) first.scrollIntoView({ block: "center" });
  if (!inView(box)) box.scrollIntoView({ block: "nearest" });  // the reason and hint by the button, too
}

function inView(e) {
  const r = e.getBoundingClientRect();
  return r.top >= 0 && r.bottom <= window.innerHeight;
}

// Inputs the browser cannot read as numbers (letters in a number field): said at the field, no request.
function checkNumbers(kind, ids) {
  let ok = true;
  for (const id of ids) {
    const input = $(id);
    if (!input.disabled && input.validity.badInput) {
      showFieldError(input, "Enter a number.");
      ok = false;
    }
  }
  if (!ok) {
    const box = $(".card-error", $(CARDS[kind]));
    box.textContent = "";
    box.append(el("b", {}, `${WHAT[kind]}: `), "correct the field marked in red.");
    box.dataset.fieldsOnly = "1";
    box.hidden = false;
  }
  return ok;
}

// A result the last request failed to replace: dimmed, with a note saying which one it is.
function markStale(container, note) {
  if (!container || container.hidden) return;
  for (const n of $$(":scope > .stale-note", container)) n.remove();
  container.classList.add("stale");
  container.prepend(el("div", { class: "stale-note", "data-testid": "stale" }, note));
}

function showBanner(where, err) {
  const box = $("#error");
  box.textContent = "";
  box.append(el("b", {}, where + " failed: "), ...richText(err.message || String(err)));
  box.hidden = false;
}

let busyCount = 0;
async function busy(text, fn) {
  busyCount++;
  $("#busy-text").textContent = text;
  $("#busy").hidden = false;
  $$("button.primary, #compare-btn, #advise-btn, #cluster-btn").forEach((b) => { b.disabled = true; });
  try {
    return await fn();
  } finally {
    busyCount--;
    if (!busyCount) {
      $("#busy").hidden = true;
      $$("button.primary, #compare-btn, #advise-btn, #cluster-btn").forEach((b) => { b.disabled = false; });
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

function option(value, text, selected, title) {
  const o = el("option", { value, title }, text);
  if (selected) o.selected = true;
  return o;
}

const fmt = (x, d = 2) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d));
const natural = (a, b) => a.localeCompare(b, undefined, { numeric: true });
const plural = (n, one, many) => `${n} ${n === 1 ? one : many || one + "s"}`;

// ---- the machine -----------------------------------------------------------------------------------

function source() {
  return document.querySelector("input[name=source]:checked").value;
}

function profileLabel() {
  return source() === "upload" ? (state.uploaded ? state.uploaded.name : "uploaded profile") : $("#profile").value;
}

// The machine part of a request (a built-in name or the uploaded text).
function machineFields() {
  if (source() === "upload") {
    if (!state.uploaded) throw new ApiError(0, "choose a machine file to upload first", [{ field: "profile_yaml", message: "choose a file first" }]);
    return { [state.uploaded.field]: state.uploaded.text };
  }
  return { profile: $("#profile").value };
}

const MACHINE_FIELDS = ["profile", ...UPLOAD_FIELDS];
const machineKey = (req) => JSON.stringify(MACHINE_FIELDS.map((k) => req[k] || null));

function modelText(m) {
  return m.kind === "gpu" ? `PCIe ${m.gen} x${m.lanes}, ${m.memory_gib} GiB` : `${m.read_gbps} GB/s read, PCIe ${m.gen} x${m.lanes}`;
}

function describeModels() {
  const pick = (id) => state.models.find((m) => m.name === $(id).value);
  const parts = [pick("#gpu-model"), pick("#ssd-model")].filter(Boolean).map((m) => `${m.name}: ${modelText(m)}`);
  $("#model-spec").textContent = parts.join(" · ");
}

// What the chosen machine holds (asked of the service, which reads uploads too), then the inventory
// fields made to fit it.
async function loadMachine() {
  let req;
  try { req = machineFields(); } catch (_) { state.machine = null; $("#machine-desc").textContent = ""; return; }
  const seq = ++state.machineSeq;
  clearErrors("plan");
  try {
    const res = await api("POST", "v1/whatif/targets", req);
    if (seq !== state.machineSeq) return;
    state.machine = { key: machineKey(req), name: res.profile, summary: res.machine };
    describeMachine();
    fitInventory();
  } catch (e) {
    if (seq !== state.machineSeq) return;
    state.machine = null;
    $("#machine-desc").textContent = "";
    const up = state.uploaded;
    if (up && up.field === "profile_yaml" && !/\.(ya?ml|json)$/i.test(up.name) && e instanceof ApiError) {
      // not a profile, nor XML: saved command output (`lspci -tv`, ...), which `moment scan` reads
      e.remedies = [];
      e.hint = "the page reads a profile YAML, an NCCL XML or an hwloc XML: for saved `lspci -tv` output, run "
        + "`moment scan --from-lspci FILE --out machine.yaml` (`moment scan --help`: the other outputs) and upload machine.yaml";
    }
    report("plan", e);
  }
  renderCompareList();
}

function describeMachine() {
  const m = state.machine;
  if (!m) return;
  const s = m.summary;
  const parts = [];
  if (s.built_in_gpus) {
    parts.push(`${s.built_in_gpus} built-in ${s.built_in_models.join(" + ")} GPU${s.built_in_gpus > 1 ? "s" : ""} (SXM: kept where they are)`);
  }
  const held = Object.entries(s.in_slots || {}).map(([k, n]) => plural(n, k.toUpperCase()));
  if (held.length) parts.push(`${held.join(" and ")} in slots now, which the plan replaces with your inventory`);
  parts.push(s.free_slots ? `${plural(s.free_slots, "slot")} to fill: ${s.take_gpu} take a GPU, ${s.take_ssd} an SSD`
    : "no free slot, so there is nothing to place");
  const emptied = Object.values(s.in_slots || {}).reduce((a, b) => a + b, 0);
  if (emptied && emptied === s.free_slots) parts.push("no empty bay is listed (an NCCL or hwloc dump shows the cards, not free bays): SSDs share the slots the cards leave");
  let head;
  if (source() === "upload" && state.uploaded) {
    const what = { profile_yaml: "a profile (YAML)", nccl_xml: "an NCCL topology XML", hwloc_xml: "an hwloc XML" }[state.uploaded.field];
    head = `${state.uploaded.name} (${state.uploaded.size.toLocaleString("en-US")} bytes, sent with each request), read as ${what}: machine ${m.name}`;
  } else {
    const p = state.profiles.find((x) => x.name === $("#profile").value);
    head = (p && p.description) || m.name;
  }
  $("#machine-desc").textContent = `${head.replace(/\.$/, "")}. ${sentence(parts.join("; "))}`;
  $("#gpus-hint").textContent = `GPUs left blank: ${s.default_gpus} on this machine${s.built_in_gpus ? " (its own GPUs are built in)" : ""}.`;
}

// A new machine may hold fewer slots than the inventory asks: lower the SSD count to what is left, and
// say so under the field (the user can change it back).
function fitInventory() {
  const s = state.machine && state.machine.summary;
  clearFieldError($("#ssds"));
  for (const n of $$(".field-note")) n.remove();
  if (!s || $("#inventory").value.trim()) return;
  const g = $("#gpus").value.trim() === "" ? s.default_gpus : Number($("#gpus").value);
  const want = Number($("#ssds").value);
  if (!Number.isFinite(g) || !Number.isFinite(want)) return;
  if (g > s.take_gpu) return;  // the GPUs do not fit: the plan says so at their field
  const room = Math.max(0, Math.min(s.take_ssd, s.free_slots - g));
  if (want <= room) return;
  $("#ssds").value = String(room);
  const name = state.machine.name;
  let why;
  if (!s.free_slots) why = `${name} has no free slot`;
  else if (!s.take_ssd) why = `no slot of ${name} takes an SSD`;
  else if (!room) why = `${name} has ${plural(s.free_slots, "slot")} to fill, and the ${plural(g, "GPU")} take ${g === 1 ? "it" : "them all"}: plan fewer GPUs to leave room for SSDs`;
  else why = `${name} has ${plural(s.free_slots, "slot")} to fill; ${plural(g, "GPU")} leave room for ${plural(room, "SSD")}`;
  showFieldError($("#ssds"), `set to ${room}: ${why}.`, "field-note");
}

function fillModels() {
  const gpus = state.models.filter((m) => m.kind === "gpu");
  const ssds = state.models.filter((m) => m.kind === "ssd");
  const fill = (sel, list, def, keepLabel) => {
    sel.textContent = "";
    if (keepLabel) sel.append(option("", keepLabel, true));
    for (const m of list) sel.append(option(m.name, m.name, !keepLabel && m.name === def, modelText(m)));
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
      box.append(el("label", { title: modelText(m) }, cb, " " + m.name));
    }
  };
  $("#cl-nic").textContent = "";
  for (const m of state.models.filter((x) => x.kind === "nic")) {
    $("#cl-nic").append(option(m.name, m.name, m.name === "CX6-Dx-100GbE",
      `${m.ports} x ${m.port_gbit} Gb/s, PCIe ${m.gen} x${m.lanes}`));
  }
  checks($("#budget-gpus"), gpus, ["A100-PCIe-40GB"]);
  checks($("#budget-ssds"), ssds, ["P5510"]);
  describeModels();
}

function fillProfiles() {
  const sel = $("#profile");
  sel.textContent = "";
  for (const p of state.profiles) sel.append(option(p.name, p.name, p.name === "paper-machine-b", p.description));
  renderCompareList();
}

// The machines Compare can take: the built-in ones, the upload, the last plan with its what-if.
function renderCompareList() {
  const list = $("#compare-list");
  const was = Object.fromEntries($$("input", list).map((c) => [c.value, c.checked]));
  list.textContent = "";
  const add = (value, text, title, on) => {
    const cb = el("input", { type: "checkbox", value });
    cb.checked = value in was ? was[value] : on;
    list.append(el("label", { title: title || "" }, cb, " ", text));
  };
  for (const p of state.profiles) add("profile:" + p.name, p.name, p.description, p.name.startsWith("paper-machine"));
  if (state.uploaded) add("upload", `${state.uploaded.name} (uploaded)`, "the machine you uploaded", true);
  const wi = whatifSpec();
  if (wi) add("whatif", `${state.original.plan.machine} with the what-if`, wi.what.join(", "), true);
}

// The what-if as a machine to compare: the planned machine with the changes and models of card 3.
function whatifSpec() {
  if (!state.original) return null;
  const spec = {};
  for (const k of MACHINE_FIELDS) if (state.original.req[k] !== undefined) spec[k] = state.original.req[k];
  const what = [];
  if (state.changes.length) { spec.set = state.changes.slice(); what.push(...state.changes); }
  const inventory = state.original.req.inventory;
  for (const [id, key, kind] of [["#wi-gpu-model", "gpu_model", "gpu"], ["#wi-ssd-model", "ssd_model", "ssd"]]) {
    const model = $(id).value;
    if (!model) continue;
    what.push(`${key.replace("_", " ")} ${model}`);
    // a mixed inventory names every device: the model replaces its devices of that kind
    if (inventory) spec.inventory = withModel(spec.inventory || inventory, kind, model);
    else spec[key] = model;
  }
  return what.length ? { spec, what } : null;
}

// The catalogue's model named in an inventory (by name or alias, as the service reads it), or undefined.
function findModel(name) {
  const key = name.trim().toLowerCase();
  return state.models.find((m) => m.name.toLowerCase() === key || (m.aliases || []).includes(key));
}

// `inventory` (COUNTxMODEL,...) with every device of `kind` made `model`: 2xA100,2xP5510 -> 2xA100,2xPM1743.
function withModel(inventory, kind, model) {
  const kept = [];
  let count = 0;
  for (const part of inventory.split(",").map((p) => p.trim()).filter(Boolean)) {
    const m = /^(\d+)\s*[xX*]\s*(\S+)$/.exec(part);
    const found = m && findModel(m[2]);
    if (found && found.kind === kind) count += parseInt(m[1], 10);
    else kept.push(part);
  }
  return count ? [...kept, `${count}x${model}`].join(",") : inventory;
}

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
  clearErrors("plan");
  if (!f) { loadMachine(); return; }
  if (f.size > 8 * 1048576) {
    report("plan", new ApiError(0, "", [{ field: "profile_yaml", message: `${f.name} is ${(f.size / 1048576).toFixed(1)} MiB; the service takes at most 8 MiB` }]));
    return;
  }
  const reader = new FileReader();
  reader.onload = () => {
    const text = String(reader.result);
    const field = uploadField(f.name, text);
    state.uploaded = { name: f.name, field, text, size: f.size };
    loadMachine();
  };
  reader.onerror = () => report("plan", new ApiError(0, "", [{ field: "profile_yaml", message: `cannot read ${f.name}` }]));
  reader.readAsText(f);
}

// ---- plan, what-if, compare ------------------------------------------------------------------------

/** The GPU/SSD counts (left out when blank) and models of the inventory form, into `req`. */
function countsAndModels(req) {
  const gpus = $("#gpus").value.trim();
  if (gpus !== "") req.gpus = Number(gpus);
  const ssds = $("#ssds").value.trim();
  if (ssds !== "") req.ssds = Number(ssds);
  req.gpu_model = $("#gpu-model").value;
  req.ssd_model = $("#ssd-model").value;
}

function inventoryFields(req) {
  const inv = $("#inventory").value.trim();
  if (inv) req.inventory = inv;
  else countsAndModels(req);
  return req;
}

async function runPlan(ev) {
  if (ev) ev.preventDefault();
  clearErrors("plan");
  if (!checkNumbers("plan", ["#gpus", "#ssds"])) return;
  let req;
  try { req = inventoryFields(machineFields()); } catch (e) { report("plan", e); return; }
  req.set = [];
  req.diagram = true;
  const label = profileLabel();
  await busy(`Planning ${label}…`, async () => {
    try {
      const plan = await api("POST", "v1/plan", req);
      state.original = { req, plan, label };
      state.whatif = null;
      state.changes = [];
      $("#wi-gpu-model").value = "";
      $("#wi-ssd-model").value = "";
      clearErrors("whatif");
      renderChanges();
      renderResults();
      await loadTargets(req, plan);
    } catch (e) {
      report("plan", e);
      if (state.original) {
        markStale($("#results"), `Not updated: the plan of ${label} failed (the reason is in card 1). `
          + `Shown: the last plan, of ${state.original.label}.`);
      }
    }
  });
}

async function loadTargets(planReq, plan) {
  const body = {};
  for (const k of MACHINE_FIELDS) if (planReq[k] !== undefined) body[k] = planReq[k];
  try {
    const res = await api("POST", "v1/whatif/targets", body);
    state.targets = res.links || [];
  } catch (e) {
    state.targets = [];
    report("whatif", e);
  }
  const hint = suggestWhatif(plan);
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
    group.append(option(String(i), t.label, i === hint.target, t.label));
  }
  if (hint.ssd) $("#wi-ssd-model").value = hint.ssd;
  $("#whatif-fields").disabled = false;
  $("#whatif-card").setAttribute("aria-disabled", "false");
  $("#whatif-hint").textContent = `Change ${state.original.label}. ${hint.why}`;
  targetChanged();
  renderCompareList();
}

// Where a what-if is worth trying: the link that limits the plan; when the SSDs themselves are the
// limit, a faster SSD model (and the busiest link in the picker).
function suggestWhatif(plan) {
  const links = plan.links || [];
  const targetOf = (l) => state.targets.findIndex((t) => t.nodes.length === 2
    && ((t.nodes[0] === l.src && t.nodes[1] === l.dst) || (t.nodes[0] === l.dst && t.nodes[1] === l.src)));
  for (const l of links.filter((x) => x.bottleneck)) {
    const i = targetOf(l);
    if (i >= 0) return { target: i, why: `${state.targets[i].label} limits this plan: the picker starts there.` };
  }
  let busiest = state.targets.length ? 0 : -1;
  let use = -1;
  for (const l of links) {
    const i = targetOf(l);
    if (i >= 0 && l.utilisation > use) { busiest = i; use = l.utilisation; }
  }
  const ssds = Object.values(plan.placement || {}).map((n) => state.models.find((m) => m.name === n))
    .filter((m) => m && m.kind === "ssd").sort((a, b) => a.read_gbps - b.read_gbps);
  const cur = ssds[0];
  if (links.some((l) => l.bottleneck && l.kind === "ssd")) {
    const faster = state.models.filter((m) => m.kind === "ssd" && (!cur || m.read_gbps > cur.read_gbps))
      .sort((a, b) => b.read_gbps - a.read_gbps)[0];
    if (faster) {
      return { target: busiest, ssd: faster.name,
        why: `Its SSDs limit this plan (each is read at its limit): the what-if starts with faster SSDs, ${faster.name}; the picker shows the busiest link.` };
    }
  }
  return { target: busiest, why: "Pick a link and a new value, or other device models; the picker starts at the busiest link." };
}

const PROPS = {
  gen: { text: "PCIe generation", hint: "1-6", noun: "generation" },
  width: { text: "lanes (width)", hint: "1, 2, 4, 8, 16", noun: "lanes" },
  bandwidth_gbps: { text: "bandwidth, GB/s", hint: "measured one-direction GB/s", noun: "bandwidth" },
  count: { text: "parallel links", hint: "how many", noun: "number of links" },
  gts: { text: "transfer rate, GT/s", hint: "UPI/QPI GT/s", noun: "transfer rate" },
};

function currentTarget() {
  return state.targets[parseInt($("#wi-target").value, 10)];
}

// The newest PCIe generation the page suggests (where it capped gen + 1 before; a profile takes 1-6).
const NEWEST_GEN = 6;

// The PCIe generations link `t` can still gain: none past its CPU's (`gen_cap`: a root port's link runs at
// its CPU's generation, so a what-if above it is planned at it and changes nothing) or the newest.
function genRoom(t) {
  const now = (t.current || {}).gen;
  const cap = t.gen_cap || null;
  const most = cap ? Math.min(cap.gen, NEWEST_GEN) : NEWEST_GEN;
  return { now, cap, most, full: t.props.includes("gen") && !!now && now >= most };
}

// Why a higher generation changes nothing on `t`, and what a what-if can raise instead (null: it can gain one).
function genCapNote(t, p) {
  const room = genRoom(t);
  if (!room.full) return null;
  const { now, cap } = room;
  const why = cap && cap.gen <= NEWEST_GEN
    ? `The CPU (${cap.cpu}) drives PCIe ${cap.gen}.0 at most` + (now > cap.gen
      ? `: this link's PCIe ${now}.0 runs at ${cap.gen}.0, and a higher generation changes nothing.`
      : `, and this link runs at it: a higher generation changes nothing.`)
    : `PCIe ${NEWEST_GEN}.0 is the newest generation.`;
  const other = rateProp(t);
  if (!other) return `${why} Nothing else of this link can change.`;
  return `${why} ${p === "gen" ? `Change its ${PROPS[other].noun} instead.` : `The picker offers its ${PROPS[other].noun} instead.`}`;
}

// The figure of link `t` a what-if raises when its generation cannot rise: its rate (its lanes may not grow
// past its slot's), or null.
function rateProp(t) {
  return t.props.includes("bandwidth_gbps") ? "bandwidth_gbps"
    : t.props.find((x) => x !== "gen" && PROPS[x] && !(x === "width" && widthRoom(t).full)) || null;
}

// The lanes link `t` can still gain: widths PCIe has (`widths`, the service's list), none past its slot's
// (`max_width`: a link wider than its slot is refused); `next` the one a what-if suggests, double or the widest.
function widthRoom(t) {
  const now = (t.current || {}).width;
  const most = t.max_width || null;
  const wider = now ? (t.widths || []).filter((w) => w > now) : [];
  const next = wider.find((w) => w >= now * 2) || wider[wider.length - 1] || null;
  return { now, most, next, slot: t.max_width_slot || null, full: t.props.includes("width") && !!now && !!most && !next };
}

// Why a wider link does not fit `t`, and what a what-if can raise instead (null: it can take more lanes).
function widthCapNote(t) {
  const room = widthRoom(t);
  if (!room.full) return null;
  const why = room.slot
    ? `Slot ${room.slot} takes x${room.most} at most, and this link is x${room.now} already: a wider link does not fit it.`
    : `x${room.most} is the widest PCIe link.`;
  const other = t.props.includes("gen") && !genRoom(t).full ? "gen" : rateProp(t);
  return other ? `${why} Change its ${PROPS[other].noun} instead.` : `${why} Nothing else of this link can change.`;
}

// Whether a what-if of `p` on link `t` changes nothing: its generation or lanes are at their most.
function atMost(t, p) {
  return (p === "gen" && genRoom(t).full) || (p === "width" && widthRoom(t).full);
}

function targetChanged() {
  const t = currentTarget();
  const sel = $("#wi-prop");
  sel.textContent = "";
  $("#wi-target").title = t ? t.label : "";
  if (!t) return;
  for (const p of t.props) sel.append(option(p, PROPS[p] ? PROPS[p].text : p));
  // a generation or lanes the link cannot gain change nothing: start at its rate, which a what-if can raise
  if (atMost(t, sel.value) && rateProp(t)) sel.value = rateProp(t);
  propChanged();
}

function propChanged() {
  const t = currentTarget();
  const p = $("#wi-prop").value;
  if (!t || !p) return;
  const cur = t.current || {};
  const now = cur[p];
  let suggest = "";
  if (p === "gen" && now) suggest = genRoom(t).full ? "" : String(Math.min(genRoom(t).most, now + 1));
  else if (p === "bandwidth_gbps" && t.bandwidth_gbps) suggest = String(Math.round(t.bandwidth_gbps * 2));
  else if (p === "width" && now) suggest = widthRoom(t).next ? String(widthRoom(t).next) : "";
  else if (now !== undefined && now !== null) suggest = String(now);
  $("#wi-value").value = suggest;
  $("#wi-value").placeholder = PROPS[p] ? PROPS[p].hint : "";
  const capNote = (p === "width" && widthCapNote(t)) || genCapNote(t, p);
  $("#wi-cap").textContent = capNote || "";
  $("#wi-cap").hidden = !capNote;
  const bits = [];
  const room = genRoom(t);
  if (cur.gen) bits.push(`PCIe ${cur.gen}` + (room.cap && cur.gen > room.cap.gen ? ` (runs at ${room.cap.gen}: its CPU's)` : ""));
  if (cur.width) bits.push(`x${cur.width}`);
  if (cur.count) bits.push(`${cur.count} link${cur.count > 1 ? "s" : ""}`);
  if (cur.gts) bits.push(`${cur.gts} GT/s`);
  if (t.bandwidth_gbps) bits.push(`${fmt(t.bandwidth_gbps, 1)} GB/s${cur.bandwidth_gbps ? " (measured)" : ""}`);
  $("#wi-current").textContent = bits.length ? `Now: ${bits.join(", ")}.` : "";
}

// A change joins the list once the service has read the machine with it, by the rules a plan reads it
// by: a value out of range (PCIe generation 0) is said at once, under the field it was typed in.
async function addChange(text, input) {
  text = text.trim();
  if (!text) return false;
  clearErrors("whatif");
  const at = input || $("#wi-changes");
  if (!/^[^=]+=.+$/.test(text)) {
    showFieldError(at, `"${text}" is not PATH=VALUE, e.g. nodes.sw1.link.gen=5.`);
    return false;
  }
  const key = text.split("=")[0].replace(/\+$/, "");
  // one value per path: a new value for the same field replaces the old one
  const changes = [...state.changes.filter((c) => c.includes("+=") || c.split("=")[0] !== key), text];
  if (state.original) {
    const body = { set: changes };
    for (const k of MACHINE_FIELDS) if (state.original.req[k] !== undefined) body[k] = state.original.req[k];
    try {
      await api("POST", "v1/whatif/targets", body);
    } catch (e) {
      const bad = (e.fields || []).find((f) => /^set(\.|$)/.test(f.field));
      if (!bad) report("whatif", e);
      else showFieldError(at, sentence(overrideProblem(bad.message, text, key)));
      return false;
    }
  }
  state.changes = changes;
  renderChanges();
  return true;
}

// The service's message about override `text` without the override and its path, which the field
// beside the message already shows: "set P=0: P: PCIe generation must be 1-6, got 0" -> the reason.
function overrideProblem(message, text, key) {
  let m = String(message);
  if (m.startsWith(`set ${text}: `)) m = m.slice(`set ${text}: `.length);
  if (m.startsWith(`${key}: `)) m = m.slice(`${key}: `.length);
  return m;
}

function addPickedChange() {
  const t = currentTarget();
  const p = $("#wi-prop").value;
  const v = $("#wi-value").value.trim();
  if (!t || !p) return;
  clearErrors("whatif");
  if (v === "" || Number.isNaN(Number(v))) {
    showFieldError($("#wi-value"), `${PROPS[p] ? PROPS[p].text : p}: give a number.`);
    return;
  }
  addChange(`${t.target}.${p}=${v}`, $("#wi-value"));
}

// What a `set` path changes, in words: "PCIe Switch 0 (sw0) → rc0: PCIe generation 4 → 5".
function changeText(c) {
  const m = /^(.*)\.([a-z_]+)=(.*)$/.exec(c);
  const t = m && state.targets.find((x) => x.target === m[1]);
  if (!t) return null;
  const prop = PROPS[m[2]] ? PROPS[m[2]].text : m[2];
  const now = (t.current || {})[m[2]];
  return `${t.label}: ${prop} ${now !== undefined ? now + " → " : ""}${m[3]}`;
}

function renderChanges() {
  const ul = $("#wi-changes");
  ul.textContent = "";
  for (const c of state.changes) {
    const rm = el("button", { type: "button", class: "x", title: "remove this change" }, "×");
    rm.addEventListener("click", () => {
      state.changes = state.changes.filter((x) => x !== c);
      clearErrors("whatif");
      renderChanges();
    });
    ul.append(el("li", { "data-change": c, title: changeText(c) || c }, el("code", {}, c), rm));
  }
  renderCompareList();
}

async function runWhatif() {
  clearErrors("whatif");
  if (!state.original) { report("whatif", new Error("plan first (card 1)")); return; }
  const wi = whatifSpec();
  if (!wi) {
    report("whatif", new ApiError(0, "", [{ field: "set", message: "add a change (a link or a device model) first" }]));
    return;
  }
  // the what-if keeps the machine and inventory of the plan it is compared with, but for its models
  const req = { ...state.original.req, set: wi.spec.set || [] };
  for (const key of ["inventory", "gpu_model", "ssd_model"]) if (wi.spec[key]) req[key] = wi.spec[key];
  await busy("Planning the what-if…", async () => {
    try {
      const plan = await api("POST", "v1/plan", req);
      state.whatif = { req, plan, label: state.original.label };
      renderResults();
      const first = $("#results .col-whatif");
      if (first && !inView(first)) first.scrollIntoView({ block: "start" });
    } catch (e) {
      report("whatif", e);
      const head = $("#results .head.col-whatif");
      if (head) {
        for (const c of $$("#results .col-whatif")) c.classList.add("stale");
        head.prepend(el("div", { class: "stale-note", "data-testid": "stale" },
          "Not updated: the last what-if failed (the reason is in card 3). Shown: the what-if before it."));
      }
    }
  });
}

async function runCompare() {
  clearErrors("compare");
  if (!checkNumbers("plan", ["#gpus", "#ssds"])) {
    report("compare", new Error("the inventory in card 2 has a field marked in red"));
    return;
  }
  const picked = $$("#compare-list input:checked").map((c) => c.value);
  if (!picked.length) {
    report("compare", new ApiError(0, "", [{ field: "machines", message: "tick at least one machine" }]));
    return;
  }
  const machines = [];
  const notes = [];  // what marks a row beside its machine's name: the what-if's changes
  for (const v of picked) {
    const wi = v === "whatif" ? whatifSpec() : null;
    if (v === "upload" && state.uploaded) machines.push({ [state.uploaded.field]: state.uploaded.text });
    else if (wi) machines.push(wi.spec);
    else if (v.startsWith("profile:")) machines.push({ profile: v.slice(8) });
    else continue;
    notes.push(wi ? "what-if: " + wi.what.join(", ") : null);
  }
  const req = inventoryFields({ machines });
  await busy(`Comparing ${plural(machines.length, "machine")}…`, async () => {
    try {
      renderCompare(await api("POST", "v1/compare/machines", req), notes);
    } catch (e) {
      report("compare", e);
      markStale($("#compare-out"), "Not updated: the last comparison failed (the reason is in card 4). Shown: the one before.");
    }
  });
}

async function runAdvise() {
  clearErrors("advise");
  if (!checkNumbers("advise", ["#budget", "#budget-years", "#budget-max-gpus", "#budget-max-ssds"])) return;
  let req;
  try { req = machineFields(); } catch (e) { report("advise", e); return; }
  const num = (id) => { const v = $(id).value.trim(); return v === "" ? undefined : Number(v); };
  req.budget = num("#budget");
  if (req.budget === undefined) {
    report("advise", new ApiError(0, "", [{ field: "budget", message: "give a budget in USD, e.g. 60000" }]));
    return;
  }
  req.years = num("#budget-years");
  req.max_gpus = num("#budget-max-gpus");
  req.max_ssds = num("#budget-max-ssds");
  req.models = $$("#budget-gpus input:checked, #budget-ssds input:checked").map((c) => c.value);
  for (const k of Object.keys(req)) if (req[k] === undefined) delete req[k];
  await busy(`Pricing and placing inventories under $${req.budget.toLocaleString()}…`, async () => {
    try {
      renderAdvice(await api("POST", "v1/advise", req));
    } catch (e) {
      report("advise", e);
      markStale($("#advise-out"), "Not updated: the last advice failed (the reason is in card 5). Shown: the advice before it.");
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
  window.scrollTo({ top: 0 });
  runPlan();
}

function renderAdvice(r) {
  const out = $("#advise-out");
  out.textContent = "";
  out.classList.remove("stale");
  const pick = (title, c) => {
    const btn = el("button", { type: "button", title: `plan ${invSpec(c)} on this machine` }, "Plan this");
    btn.addEventListener("click", () => planCandidate(c));
    return el("div", { class: "pick", "data-testid": "pick" },
      el("div", { class: "col-kind" }, title),
      el("h4", {}, c.inventory),
      el("dl", {},
        el("dt", {}, "epoch read"), el("dd", {}, `${fmt(c.epoch_s)} s`),
        el("dt", {}, "throughput"), el("dd", {}, `${Math.round(c.throughput_samples_per_s).toLocaleString("en-US")} samples/s`),
        el("dt", {}, "hardware"), el("dd", {}, usd(c.hardware_usd)),
        el("dt", {}, `TCO, ${r.params.years} years`), el("dd", {}, usd(c.tco_usd)),
        el("dt", {}, "samples/s per TCO $"), el("dd", {}, fmt(c.tpc, 3))),
      btn);
  };
  const best = r.best_throughput_per_dollar;
  const same = best.inventory === r.best_throughput.inventory;
  const picks = el("div", { class: "picks" },
    pick(same ? "Best per dollar and best throughput" : "Best throughput per dollar", best),
    same ? null : pick("Best throughput", r.best_throughput));
  const tbody = el("tbody");
  const rows = r.candidates.slice(0, 12);
  for (const c of rows) {
    const btn = el("button", { type: "button", class: "small" }, "Plan");
    btn.addEventListener("click", () => planCandidate(c));
    const rank = [c.rank_per_dollar ? `#${c.rank_per_dollar} per $` : "", c.rank_throughput ? `#${c.rank_throughput} speed` : ""]
      .filter(Boolean).join(", ");
    tbody.append(el("tr", { class: c.inventory === best.inventory ? "rec" : null },
      el("td", {}, rank || "–"), el("td", {}, c.inventory),
      el("td", { class: "num" }, fmt(c.epoch_s)),
      el("td", { class: "num" }, Math.round(c.throughput_samples_per_s).toLocaleString("en-US")),
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
  out.scrollIntoView({ block: "start" });
}

// ---- drawing the results ---------------------------------------------------------------------------

function renderResults() {
  $("#welcome").hidden = true;
  const box = $("#results");
  box.hidden = false;
  box.textContent = "";
  box.classList.remove("stale");
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
  // two columns, section by section, so that the same section of both plans sits on one row; the
  // diagrams, too wide for half the page, one above the other across both columns
  const right = columnCards(state.whatif, state.original, scale, "whatif");
  box.classList.add("two");
  left.forEach((card, i) => {
    if (card.classList.contains("diagram-card")) {
      card.classList.add("wide");
      right[i].classList.add("wide");
    }
    box.append(card, right[i]);
  });
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

// The node ids a what-if's `set` changes ("nodes.sw0.link.gen=5" -> the link of sw0 to its parent).
function changedLinks(req) {
  const out = [];
  for (const c of req.set || []) {
    const path = c.split("=")[0];
    const t = state.targets.find((x) => path.startsWith(x.target + "."));
    if (t) out.push(t);
  }
  return out;
}

// The plan's diagram with the links the what-if changed drawn over in a wide halo. The diagram names
// boxes by their title (the node id first) and draws a node's uplink as the polyline that ends at its
// box's left edge; a socket link runs from one socket box's bottom to the other's top.
function highlightSvg(svgText, targets) {
  if (!targets.length) return { svg: svgText, found: 0 };
  const doc = new DOMParser().parseFromString(svgText, "image/svg+xml");
  const svg = doc.documentElement;
  if (svg.querySelector("parsererror")) return { svg: svgText, found: 0 };
  const boxes = [];
  for (const t of svg.querySelectorAll("text.box-title")) {
    const rect = t.previousElementSibling;
    const detail = t.nextElementSibling;
    if (!rect || rect.tagName !== "rect") continue;
    const x = +rect.getAttribute("x"), y = +rect.getAttribute("y"), w = +rect.getAttribute("width"), h = +rect.getAttribute("height");
    boxes.push({ id: t.textContent.split(/\s/)[0], detail: detail ? detail.textContent : "", rect, x, y, w, h });
  }
  const lines = [...svg.querySelectorAll("polyline")].map((p) => ({
    p, pts: p.getAttribute("points").trim().split(/\s+/).map((xy) => xy.split(",").map(Number)) }));
  const near = (a, b) => Math.abs(a - b) < 0.6;
  const NS = svg.namespaceURI;
  let found = 0;
  const mark = (line, box) => {
    const halo = doc.createElementNS(NS, "polyline");
    halo.setAttribute("points", line.p.getAttribute("points"));
    halo.setAttribute("fill", "none");
    halo.setAttribute("stroke", "#f0a020");
    halo.setAttribute("stroke-opacity", "0.7");
    halo.setAttribute("stroke-width", String(Math.max(12, +line.p.getAttribute("stroke-width") + 10)));
    halo.setAttribute("class", "changed-link");
    line.p.parentNode.insertBefore(halo, line.p);
    if (box) {
      const ring = doc.createElementNS(NS, "rect");
      for (const [k, v] of [["x", box.x - 4], ["y", box.y - 4], ["width", box.w + 8], ["height", box.h + 8], ["rx", 6]]) ring.setAttribute(k, v);
      ring.setAttribute("fill", "none");
      ring.setAttribute("stroke", "#d08a1c");
      ring.setAttribute("stroke-width", "3");
      ring.setAttribute("class", "changed-box");
      box.rect.parentNode.insertBefore(ring, box.rect);
    }
    found++;
  };
  const token = (s, id) => new RegExp(`(^|[\\s·,])${id.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}($|[\\s·,])`).test(s);
  for (const t of targets) {
    const [a, b] = t.nodes;
    if (t.target.startsWith("nodes.")) {
      // the node's own box, or the box of the device in the slot (named in its detail line)
      const box = boxes.find((x) => x.id === a) || boxes.find((x) => token(x.detail, a));
      const line = box && lines.find((l) => { const e = l.pts[l.pts.length - 1]; return near(e[0], box.x) && near(e[1], box.y + box.h / 2); });
      if (line) mark(line, box);
    } else {
      const ba = boxes.find((x) => x.id === a);
      const bb = boxes.find((x) => x.id === b);
      if (!ba || !bb) continue;
      const [top, bottom] = ba.y < bb.y ? [ba, bb] : [bb, ba];
      const line = lines.find((l) => l.pts.length === 2 && near(l.pts[0][1], top.y + top.h) && near(l.pts[1][1], bottom.y));
      if (line) mark(line, null);
    }
  }
  return { svg: new XMLSerializer().serializeToString(svg), found };
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
    const list = el("ul", { class: "changes ro", "data-testid": "changes" });
    for (const c of req.set || []) {
      const words = changeText(c);
      list.append(el("li", {}, words ? el("span", {}, words, " ", el("code", {}, c)) : el("code", {}, c)));
    }
    if (req.gpu_model && req.gpu_model !== base.req.gpu_model) list.append(el("li", {}, `GPU model ${base.req.gpu_model} → ${req.gpu_model}`));
    if (req.ssd_model && req.ssd_model !== base.req.ssd_model) list.append(el("li", {}, `SSD model ${base.req.ssd_model} → ${req.ssd_model}`));
    if (req.inventory !== base.req.inventory) list.append(el("li", {}, `inventory ${base.req.inventory} → ${req.inventory}`));
    head.append(list, deltaBanner(plan, base));
  }
  const best = bestBaseline(plan);
  head.append(el("div", { class: "kpis" },
    kpi("epoch read", `${fmt(p.epoch_read_s)} s`, "epoch"),
    kpi("all GPUs read", `${fmt(p.aggregate_gbps, 1)} GB/s`),
    kpi("vs best usual layout", best ? `${fmt(best.predicted.epoch_read_s / p.epoch_read_s)}×` : "–",
      null, best ? `best usual layout: ${best.name}, ${fmt(best.predicted.epoch_read_s)} s` : null),
  ));
  const notes = notesBox(plan.notes);  // what the plan says beside its figures, with them
  if (notes) head.append(notes);
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

  // diagram, the what-if's with its changed links drawn over
  const dia = el("div", { class: "card diagram-card" }, el("h3", {}, "Diagram"));
  if (plan.diagram_svg) {
    const changed = base ? changedLinks(req) : [];
    const { svg, found } = highlightSvg(plan.diagram_svg, changed);
    const url = URL.createObjectURL(new Blob([svg], { type: "image/svg+xml" }));
    state.diagramUrls.push(url);
    dia.append(el("a", { href: url, target: "_blank", rel: "noopener", class: "diagram-link", title: "open full size" },
      el("img", { src: url, alt: `diagram of ${plan.machine}: ${plan.inventory}`, class: "diagram", "data-changed": String(found) })),
    el("p", { class: "hint" }, (found ? `The changed link${found > 1 ? "s are" : " is"} drawn over in orange. ` : "")
      + "Click the diagram to open it full size."));
  } else {
    dia.append(el("p", { class: "hint" }, "The service sent no diagram."));
  }
  col.append(dia);

  const s = plan.search;
  if (s) {
    const n = (x) => (x ?? 0).toLocaleString("en-US");
    // a large machine of mixed slots has too many placements to list: they were searched by branch and bound
    const how = s.method === "branch-and-bound"
      ? `too many to list: branch and bound, ${n(s.nodes)} partial placements bounded`
      : s.method === "first-placements"
        ? "the time limit stopped their listing, so only those it starts from (greedy ones and the usual layouts)"
        : `${n(s.distinct_candidates)} distinct`;
    dia.append(el("p", { class: "foot" },
      `Searched ${s.raw_candidates == null ? "an uncounted number of" : n(s.raw_candidates)} placements: ${how}, ${n(s.solved)} solved, in ${fmt(s.seconds_total)} s.`));
    if (s.proven_optimal === false) {
      dia.append(el("p", { class: "foot" }, s.lower_bound_s == null
        ? "Not proven optimal: the time limit stopped the search before any bound on the best placement was known; "
          + "this is the fastest of the placements it started from."
        : `Not proven optimal: the time limit stopped the search; this is the best `
          + `placement found, and no placement reads an epoch faster than ${fmt(s.lower_bound_s)} s.`));
    }
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

// One row per machine compared, in the order asked; `notes[i]` marks row i (the what-if says what it changed).
function renderCompare(rows, notes) {
  const out = $("#compare-out");
  out.textContent = "";
  out.classList.remove("stale");
  const fastest = Math.min(...rows.map((r) => r.epoch_read_s));
  const tbody = el("tbody");
  for (const [i, r] of rows.entries()) {
    const per = r.per_gpu_inlet_gbps || [];
    const note = notes[i] || ((r.overrides || []).length ? "what-if: " + r.overrides.join(", ") : null);
    const what = note ? el("div", { class: "muted" }, note) : null;
    tbody.append(el("tr", { class: r.epoch_read_s === fastest ? "rec" : null },
      el("td", { class: "name" }, el("b", {}, r.profile), r.built_in ? el("div", { class: "muted" }, r.built_in) : null, what),
      el("td", {}, r.inventory),
      el("td", { class: "num" }, fmt(r.epoch_read_s)),
      el("td", { class: "num" }, `${fmt(r.epoch_read_s / fastest)}×`),
      el("td", { class: "num" }, per.length ? fmt(Math.min(...per)) : "–"),
      el("td", { class: "num" }, fmt(r.aggregate_gbps, 1)),
      el("td", {}, r.bottleneck_summary || "–"),
      el("td", {}, r.best_baseline ? `${fmt(r.gain_vs_best_baseline)}× (${r.best_baseline})` : "–")));
    const said = notesBox(r.notes);  // what the row's plan says, on a row of its own under it
    if (said) tbody.append(el("tr", { class: "row-notes" }, el("td", { colspan: "8" }, said)));
  }
  out.append(el("h2", {}, "Machines compared"),
    el("div", { class: "scroll" }, el("table", { class: "tbl compare", "data-testid": "compare" },
      el("thead", {}, el("tr", {},
        ["machine", "inventory", "epoch read, s", "vs fastest", "slowest GPU, GB/s", "all GPUs, GB/s",
          "limited by", "gain over usual layouts"].map((h, i) => el("th", { class: i >= 2 && i <= 5 ? "num" : null }, h)))),
      tbody)),
    el("p", { class: "hint" }, "Each machine with its own recommended placement for the same inventory."));
  out.hidden = false;
  out.scrollIntoView({ block: "start" });
}

// ---- several servers -------------------------------------------------------------------------------

// The cluster of card 6: card 1's built-in machine with card 2's inventory, `servers` times.
function clusterRequest() {
  const bad = (field, message) => new ApiError(0, "", [{ field, message }]);
  if (source() !== "builtin") throw bad("cluster", "a cluster is planned from a built-in machine: pick one in card 1");
  let inv = $("#inventory").value.trim();
  if (!inv) {
    const g = $("#gpus").value.trim();
    const gpus = g === "" ? (state.machine ? state.machine.summary.default_gpus : 4) : Number(g);
    inv = `${gpus}x${$("#gpu-model").value},${Number($("#ssds").value.trim() || 0)}x${$("#ssd-model").value}`;
  }
  const num = (id) => { const v = $(id).value.trim(); return v === "" ? undefined : Number(v); };
  const req = {
    cluster: {
      name: `${num("#cl-servers")} x ${$("#profile").value}`,
      servers: [{ name: "server", profile: $("#profile").value, inventory: inv, nics: num("#cl-nics"), count: num("#cl-servers") }],
      network: { nic: $("#cl-nic").value, switch_gbit: num("#cl-switch") },
    },
    remote_fraction: num("#cl-remote"),
  };
  if (req.remote_fraction === undefined) delete req.remote_fraction;
  return req;
}

// The service names the cluster's fields by their path (cluster.servers.0.count, or servers[0].nics at
// the start of a planner's message): the inputs of card 6 that set them.
const CLUSTER_FIELDS = { count: "servers", nics: "nics", switch_gbit: "switch_gbit", nic: "nic" };

function clusterError(e) {
  const fields = (e.fields || []).map((f) => {
    const path = /^cluster\.(?:servers\.0|network)\.(\w+)$/.exec(f.field || "");
    const lead = /^(?:servers\[0\]|network)\.(\w+)[\s:]/.exec(f.message || "");
    const key = CLUSTER_FIELDS[(path || lead || [])[1]];
    return key ? { field: key, message: lead ? f.message.replace(/^\S+:?\s*/, "") : f.message } : f;
  });
  return new ApiError(e.status, e.message, fields, e.hint);
}

async function runCluster() {
  clearErrors("cluster");
  if (!checkNumbers("cluster", ["#cl-servers", "#cl-nics", "#cl-switch", "#cl-remote"])) return;
  let req;
  try { req = clusterRequest(); } catch (e) { report("cluster", e); return; }
  await busy(`Planning ${req.cluster.name}…`, async () => {
    try {
      renderCluster(await api("POST", "v1/plan/cluster", req));
    } catch (e) {
      report("cluster", clusterError(e));
      markStale($("#cluster-out"), "Not updated: the last cluster plan failed (the reason is in card 6). Shown: the one before.");
    }
  });
}

// One machine's epoch as a bar: local reads, remote feature reads, the gradient all-reduce.
function epochSplit(m) {
  const parts = [["read", m.read_s, "local reads"], ["remote", m.remote_feature_s, "remote features"],
    ["allreduce", m.allreduce_s, "all-reduce"]];
  const bar = el("div", { class: "split-bar", "data-testid": "epoch-split" },
    parts.map(([cls, s, label]) => el("span", { class: "seg-" + cls, style: `width:${(100 * s / m.epoch_s).toFixed(2)}%`,
      title: `${label}: ${fmt(s, 3)} s` })));
  const legend = el("p", { class: "split-legend" },
    parts.map(([cls, s, label]) => el("span", {}, el("i", { class: "seg-" + cls }), `${label} ${fmt(s, s < 0.1 ? 3 : 2)} s`)));
  return [bar, legend];
}

function renderCluster(cp) {
  const out = $("#cluster-out");
  out.textContent = "";
  out.classList.remove("stale");
  const gdr = cp.machines.reduce((n, m) => n + m.gdr_paths, 0);
  out.append(el("h2", {}, `Cluster plan: ${cp.cluster}`),
    el("p", { class: "hint" }, `${plural(cp.machines.length, "server")}, ${plural(cp.gpus, "GPU")}; ${cp.network.nic} on a `
      + `${cp.network.switch_gbit} Gb/s switch; each server reads ${Math.round(cp.remote_fraction * 100)}% of the `
      + `non-replicated rows from the others (${cp.remote_fraction_source}).`),
    el("div", { class: "kpis" },
      kpi("cluster epoch", `${fmt(cp.epoch_s)} s`, "cl-epoch", `the slowest server, ${cp.slowest}`),
      kpi("network's share", `${Math.round(cp.network_share * 100)}%`, "cl-network", `${fmt(cp.network_s)} s of the epoch`),
      kpi("GPUDirect RDMA paths", String(gdr), "cl-gdr", "GPUs with a NIC under the same PCIe switch")));
  for (const m of cp.machines) {
    const rows = Object.entries(m.devices).sort((a, b) => natural(a[1], b[1])).map(([slot, dev]) =>
      el("tr", { class: dev.startsWith("nic") ? "rec" : null }, el("td", {}, dev), el("td", {}, slot),
        el("td", {}, m.placement[slot]), el("td", {}, m.gpu_paths[dev] || "")));
    const nics = m.nics.map((n) => el("li", {}, `${n.nic} in ${n.slot}: ${fmt(n.rate_gbps, 1)} GB/s, serves ${n.gpus.join(", ") || "no GPU"}; `
      + `GPUDirect RDMA: ${n.gdr_gpus.join(", ") || "none"}`));
    out.append(el("div", { class: "machine", "data-testid": "cluster-machine", "data-name": m.name },
      el("p", { class: "machine-head" }, el("b", {}, m.name), `: epoch ${fmt(m.epoch_s)} s, network ${Math.round(m.network_share * 100)}%`),
      epochSplit(m),
      el("ul", { class: "nics", "data-testid": "nics" }, nics),
      el("div", { class: "scroll" }, el("table", { class: "tbl", "data-testid": "cluster-placement" },
        el("thead", {}, el("tr", {}, ["device", "slot", "model", "path to its NIC"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)))));
  }
  out.append(el("p", { class: "hint" }, "Times add up (no overlap assumed): an upper bound where training overlaps "
    + "the network with local reads."));
  out.hidden = false;
  out.scrollIntoView({ block: "start" });
}

// ---- start -----------------------------------------------------------------------------------------

async function start() {
  $("#plan-form").addEventListener("submit", runPlan);
  $("#profile").addEventListener("change", loadMachine);
  $("#profile-file").addEventListener("change", readUpload);
  for (const r of document.querySelectorAll("input[name=source]")) {
    r.addEventListener("change", () => {
      $("#builtin-box").hidden = source() !== "builtin";
      $("#upload-box").hidden = source() !== "upload";
      loadMachine();
    });
  }
  // editing a field takes back the error shown under it
  document.addEventListener("input", (e) => {
    if (!e.target.matches("input, select")) return;
    clearFieldError(e.target.closest("[aria-invalid]") || e.target);
    const card = e.target.closest(".card");
    const box = card && $(".card-error", card);
    if (box && box.dataset.fieldsOnly === "1" && !$(".field-error", card)) box.hidden = true;  // nothing left to see
  });
  for (const id of ["#gpu-model", "#ssd-model"]) $(id).addEventListener("change", describeModels);
  $("#wi-target").addEventListener("change", targetChanged);
  $("#wi-prop").addEventListener("change", propChanged);
  $("#wi-add").addEventListener("click", addPickedChange);
  const addRaw = async () => { if (await addChange($("#wi-raw").value, $("#wi-raw"))) $("#wi-raw").value = ""; };
  $("#wi-raw-add").addEventListener("click", addRaw);
  $("#wi-raw").addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); addRaw(); } });
  for (const id of ["#wi-gpu-model", "#wi-ssd-model"]) $(id).addEventListener("change", renderCompareList);
  $("#whatif-btn").addEventListener("click", runWhatif);
  $("#inventory").addEventListener("input", syncInventory);
  $("#inventory").addEventListener("change", syncInventory);
  $("#compare-btn").addEventListener("click", runCompare);
  $("#advise-btn").addEventListener("click", runAdvise);
  $("#cluster-btn").addEventListener("click", runCluster);
  // a token put in the address (as the 401 message says) changes only the fragment: load again with it
  window.addEventListener("hashchange", loadLists);
  await loadLists();
}

// The machines and models, and what the chosen machine holds; a failure is the banner's.
async function loadLists() {
  $("#error").hidden = true;
  delete document.body.dataset.ready;
  try {
    const [profiles, models] = await Promise.all([api("GET", "v1/profiles"), api("GET", "v1/models")]);
    state.profiles = profiles;
    state.models = models;
    const chosen = $("#profile").value;
    fillProfiles();
    if (chosen && profiles.some((p) => p.name === chosen)) $("#profile").value = chosen;
    fillModels();
    await loadMachine();
    document.body.dataset.ready = "1";
  } catch (e) {
    showBanner("Loading the machines and models", e);
  }
}

start();
