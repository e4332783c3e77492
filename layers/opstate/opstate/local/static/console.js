// opstate operations page: polls the local server; renders with DOM calls and textContent only.
"use strict";

(function () {
  const POLL_MS = 1000;
  const FULL_REFRESH_EVERY = 10; // polls; catches writes by other processes (CLI, reconciler)
  const TOKEN_KEY = "opstate-token";

  const $ = (id) => document.getElementById(id);
  const state = {
    token: null,
    operations: [],
    versions: new Map(),
    cursor: "",
    now: null,
    selected: null,
    polls: 0,
    timer: null,
    firstLoad: true,
    help: { file: null, variable: null, refresh: false },
  };

  // --- token: from the URL fragment (#token=...), kept for this tab only ---------------------
  function takeTokenFromFragment() {
    const hash = window.location.hash.replace(/^#/, "");
    const params = new URLSearchParams(hash);
    const token = params.get("token");
    if (token) {
      sessionStorage.setItem(TOKEN_KEY, token);
      params.delete("token");
      const rest = params.toString();
      history.replaceState(null, "", window.location.pathname + window.location.search + (rest ? "#" + rest : ""));
    }
    return sessionStorage.getItem(TOKEN_KEY);
  }

  // Where the token is (no token needed to ask): the file serve generated, or the variable.
  async function loadHelp() {
    try {
      const response = await fetch("/ui/api/token-help", { cache: "no-store" });
      if (response.ok) state.help = await response.json();
    } catch (error) {
      // the page still works; it only cannot say where the token is
    }
    $("token-where").textContent = tokenWhere();
    renderRefreshButton();
  }

  function tokenWhere() {
    if (state.help.file) {
      return "The token is in the file " + state.help.file + " (cat it, or open the link opstate serve prints: it carries the token).";
    }
    if (state.help.variable) return "The token is the value of " + state.help.variable + " in the environment of opstate serve.";
    return "";
  }

  function askForToken(message) {
    $("main").hidden = true;
    $("token-form").hidden = false;
    $("token-message").textContent = message;
    $("token-where").textContent = tokenWhere();
    setStatus("Waiting for the API token", true);
    $("token-input").focus();
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    state.token = token;
    $("token-input").value = "";
    $("token-form").hidden = true;
    state.cursor = "";
    poll();
  });

  // --- data ----------------------------------------------------------------------------------
  class Unauthorized extends Error {}

  async function getJSON(url) {
    const response = await fetch(url, {
      headers: { Authorization: "Bearer " + state.token, Accept: "application/json" },
      cache: "no-store",
    });
    if (response.status === 401) throw new Unauthorized("the token was refused");
    const body = await response.json();
    if (!response.ok) throw new Error(body.message || response.statusText);
    return body;
  }

  async function poll() {
    clearTimeout(state.timer);
    try {
      state.polls += 1;
      const full = state.polls % FULL_REFRESH_EVERY === 0;
      const since = full ? "" : state.cursor;
      const data = await getJSON("/ui/api/operations" + (since ? "?since=" + encodeURIComponent(since) : ""));
      state.now = Date.parse(data.now);
      if (data.changed) {
        state.cursor = data.cursor;
        receive(data.operations, data.total);
        if (state.selected) await loadDetail(state.selected, false);
      }
      $("main").hidden = false;
      setStatus("Live · updated " + new Date(state.now).toLocaleTimeString(), false);
      renderAges();
    } catch (error) {
      if (error instanceof Unauthorized) {
        sessionStorage.removeItem(TOKEN_KEY);
        askForToken("The token was refused. Paste the opstate API token.");
        return;
      }
      setStatus("Cannot reach the server (" + error.message + "); retrying", true);
    }
    state.timer = setTimeout(poll, POLL_MS);
  }

  function receive(operations, total) {
    const fresh = new Set();
    for (const op of operations) {
      const before = state.versions.get(op.name);
      if (!state.firstLoad && before !== op.version) fresh.add(op.name);
      state.versions.set(op.name, op.version);
    }
    state.firstLoad = false;
    state.operations = operations;
    state.total = total;
    render(fresh);
  }

  // --- the table -----------------------------------------------------------------------------
  function filters() {
    return {
      search: $("search").value.trim().toLowerCase(),
      state: $("filter-state").value,
      kind: $("filter-kind").value,
      open: $("filter-open").value,
    };
  }

  function matches(op, f) {
    if (f.search && !op.name.toLowerCase().includes(f.search)) return false;
    if (f.state && op.state !== f.state) return false;
    if (f.kind && op.kind !== f.kind) return false;
    if (f.open === "open" && op.terminal) return false;
    if (f.open === "terminal" && !op.terminal) return false;
    return true;
  }

  function badge(text, cls) {
    const span = document.createElement("span");
    span.className = "badge " + cls;
    span.textContent = text;
    return span;
  }

  function cell(row, content, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    if (content instanceof Node) td.append(content);
    else td.textContent = content == null ? "—" : String(content);
    row.append(td);
    return td;
  }

  function render(fresh) {
    const f = filters();
    const shown = state.operations.filter((op) => matches(op, f));
    const body = $("rows");
    const rows = [];
    for (const op of shown) {
      const tr = document.createElement("tr");
      tr.dataset.name = op.name;
      if (fresh && fresh.has(op.name)) tr.classList.add("fresh");
      if (op.name === state.selected) tr.classList.add("selected");
      cell(tr, nameLink(op.name), "name");
      cell(tr, op.kind);
      cell(tr, badge(op.state, op.state));
      cell(tr, op.version, "num");
      cell(tr, formatTime(op.updateTime), "mono");
      const age = cell(tr, "", "num age");
      age.dataset.since = op.createdAt || op.updateTime || "";
      rows.push(tr);
    }
    body.replaceChildren(...rows);
    $("empty").hidden = shown.length > 0;
    const all = state.operations.length;
    let text = shown.length + " of " + all + " operation" + (all === 1 ? "" : "s");
    if (state.total > all) text += " (newest " + all + " of " + state.total + ")";
    $("count").textContent = text;
    renderAges();
  }

  function renderAges() {
    for (const td of document.querySelectorAll("td.age")) {
      td.textContent = age(td.dataset.since);
    }
  }

  function age(since) {
    if (!since || state.now == null) return "—";
    let s = Math.max(0, Math.floor((state.now - Date.parse(since)) / 1000));
    const d = Math.floor(s / 86400); s -= d * 86400;
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + s + "s";
    return s + "s";
  }

  function formatTime(text) {
    if (!text) return "—";
    // 2026-05-10T09:59:00.250000000Z -> 2026-05-10 09:59:00.25Z (milliseconds at most)
    const match = /^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(?:\.(\d+))?Z$/.exec(text);
    if (!match) return text;
    const fraction = (match[3] || "").slice(0, 3).replace(/0+$/, "");
    return match[1] + " " + match[2] + (fraction ? "." + fraction : "") + "Z";
  }

  // --- the detail view -----------------------------------------------------------------------
  async function openDetail(name) {
    if (state.selected !== name) $("refresh-result").hidden = true;
    state.selected = name;
    for (const tr of $("rows").children) tr.classList.toggle("selected", tr.dataset.name === name);
    await loadDetail(name, true);
  }

  async function loadDetail(name, focus) {
    let data;
    try {
      data = await getJSON("/ui/api/operation?name=" + encodeURIComponent(name));
    } catch (error) {
      if (error instanceof Unauthorized) throw error;
      setStatus("Cannot load " + name + " (" + error.message + ")", true);
      return;
    }
    if (state.selected !== name) return;
    const section = $("detail");
    $("detail-title").textContent = name;
    const fields = $("detail-fields");
    const items = [];
    const record = data.record;
    const add = (label, value) => {
      const dt = document.createElement("dt");
      dt.textContent = label;
      const dd = document.createElement("dd");
      if (value instanceof Node) dd.append(value); else dd.textContent = value == null ? "—" : String(value);
      items.push(dt, dd);
    };
    if (record) {
      add("State", badge(record.state, record.state));
      add("Kind", record.kind);
      add("Version", record.version);
      add("Last server time", formatTime(record.updateTime));
      add("Source", record.source);
      add("Tracked since", formatTime(record.createdAt));
      add("Last applied", formatTime(record.appliedAt));
      if (record.progress) add("Progress", progressBar(record.progress));
      if (record.results) add("Results", badge(record.results.status, "results-" + record.results.status));
      const results = data.results;
      if (results) {
        if (results.rows) {
          const r = results.rows;
          // blocked (among the succeeded) is null for an archive written before it was counted
          const blocked = r.blocked != null ? " (" + r.blocked + " blocked)" : "";
          add("Rows", r.succeeded + " succeeded" + blocked + ", " + r.failed + " failed, " + r.unreadable +
            " unreadable of " + r.total + (results.requests != null ? " (" + results.requests + " requests)" : ""));
        }
        if (results.errors && Object.keys(results.errors).length) {
          add("Errors by code", Object.entries(results.errors).map(([c, n]) => c + ": " + n).join(", "));
        }
        if (results.usage) {
          const u = results.usage;
          add("Tokens", u.totalTokenCount + " total (" + u.promptTokenCount + " prompt, " +
            u.candidatesTokenCount + " output, " + u.thoughtsTokenCount + " thinking, " +
            u.cachedContentTokenCount + " cached)");
        }
        if (results.cost) add("Cost", costText(results.cost));
        add("Results expire", formatTime(results.expiresAt));
        add("Archived", formatTime(results.archivedAt));
        for (const o of results.objects) add("Object", o.location + " (" + o.bytes + " bytes)");
      }
      if (record.retry && record.retry.job) jobFields(record.retry, data.parts || [], data.final, add);
      else retryFields(record, data.final, add);
    } else {
      add("Record", "not stored (every event was dropped)");
    }
    fields.replaceChildren(...items);
    $("detail-json").textContent = JSON.stringify(record ? record.details : {}, null, 2);
    const rows = [];
    for (const d of data.decisions.slice().reverse()) {
      const tr = document.createElement("tr");
      cell(tr, formatTime(d.receivedAt), "mono");
      cell(tr, badge(d.applied ? "applied" : "dropped", d.applied ? "applied" : "dropped"));
      cell(tr, d.reason, "mono reason");
      cell(tr, d.state);
      cell(tr, d.source);
      cell(tr, formatTime(d.updateTime), "mono");
      cell(tr, d.version, "num");
      rows.push(tr);
    }
    $("decision-rows").replaceChildren(...rows);
    $("decisions-empty").hidden = rows.length > 0;
    $("decisions").hidden = rows.length === 0;
    section.hidden = false;
    if (focus) section.focus();
  }

  // A name on the page that opens its own detail view, like the table's names.
  function nameLink(name) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "op-link";
    button.textContent = name;
    button.setAttribute("aria-label", "Show " + name);
    button.addEventListener("click", () => openDetail(name));
    return button;
  }

  // Retries (docs/retry.md): a child's lineage; a root's retry status, its retry batches and,
  // once written, its final result (one per request key). Text only, like the rest.
  function retryFields(record, final, add) {
    if (record.retry === undefined) return; // no retry state: shown as before
    const retry = record.retry;
    if (!retry) {
      const line = document.createElement("span");
      line.className = "lineage";
      line.append("attempt " + record.attempt + " of root ");
      line.append(record.root ? nameLink(record.root) : "—", ", parent ");
      line.append(record.parent ? nameLink(record.parent) : "—");
      add("Retry of", line);
      return;
    }
    const status = document.createElement("span");
    status.append(badge(retry.status, "retry-" + retry.status));
    if (retry.reason) status.append(" " + retry.reason);
    add("Retry", status);
    add("Retry policy", policyText(retry.policy));
    const list = document.createElement("ul");
    list.className = "lineage";
    for (const child of retry.children) {
      const li = document.createElement("li");
      li.append(child.name ? nameLink(child.name) : "(not created yet)");
      li.append(" · attempt " + child.attempt + " · " + child.phase + (child.state ? " " + child.state : "") + (child.rows != null ? " · " + child.rows + " rows" : ""));
      list.append(li);
    }
    add("Retry batches", retry.children.length ? list : "none yet");
    if (retry.input) add("Kept input", retry.input);
    finalFields(final, add, "Lineage cost");
  }

  function policyText(p) {
    return p.maxAttempts + " retries per key, resubmit expired: " + (p.resubmitExpired ? "yes" : "no") +
      ", pending timeout: " + (p.pendingTimeoutHours != null ? p.pendingTimeoutHours + " h" : "off") +
      (p.maxCostUSD != null ? ", max cost: $" + p.maxCostUSD : "");
  }

  // A job (docs/jobs.md): its parts per phase, the tokens it holds enqueued against the
  // model's cap, what it waits for, each part (its batch opens its own view) and its final
  // result over the whole input.
  function jobFields(retry, parts, final, add) {
    const job = retry.job;
    // active, stopped (with why), unavailable or final: never off (domain.retry.retry_view).
    const status = document.createElement("span");
    status.id = "job-status";
    status.append(badge(retry.status, "retry-" + retry.status));
    if (retry.reason) status.append(" " + retry.reason);
    add("Job", status);
    add("Model", job.model);
    add("Rows", job.rows);
    const phases = job.parts || {};
    const open = {};
    for (const part of parts) if (part.phase === "created" && part.state) open[part.state] = (open[part.state] || 0) + 1;
    const states = Object.entries(open).map(([s, n]) => n + " " + s.toLowerCase()).join(", ");
    const phaseText = document.createElement("span");
    phaseText.id = "job-phases";
    phaseText.textContent = ["held", "creating", "created", "ended"]
      .map((phase) => phase + " " + (phases[phase] || 0) + (phase === "created" && states ? " (" + states + ")" : ""))
      .join(" · ");
    add("Parts", phaseText);
    let tokens = job.enqueuedTokens + " of " + (job.cap != null ? job.cap : "unknown") + " (the model's cap)";
    if (job.learnedCap != null) tokens += "; cap learned from Gemini's refusal: " + job.learnedCap;
    add("Enqueued tokens", tokens);
    add("Waiting for", job.waitingFor);
    if (job.stopped) add("Stopped", job.stopped);
    add("Policy", policyText(retry.policy));
    if (retry.input) add("Kept input", retry.input);
    const list = document.createElement("ul");
    list.className = "lineage";
    list.id = "job-parts";
    for (const part of parts) {
      const li = document.createElement("li");
      li.append("part " + part.n + " · ");
      li.append(part.batch ? nameLink(part.batch) : "(no batch yet)");
      const lines = part.first != null && part.rows != null ? "lines " + (part.first + 1) + "-" + (part.first + part.rows) : "";
      li.append(" · " + part.phase + (part.state ? " " + part.state : "") + (lines ? " · " + lines : "") +
        (part.tokens != null ? " · " + part.tokens + " tokens" : "") +
        (part.refusals ? " · refused " + part.refusals + "×" : "") +
        (part.dueAt ? " · tries again at " + formatTime(part.dueAt) : ""));
      list.append(li);
    }
    add("Job parts", parts.length ? list : "none");
    finalFields(final, add, "Job cost");
  }

  // A lineage's or a job's final result: pending, unavailable, or its counts and location.
  function finalFields(final, add, costLabel) {
    if (!final) return;
    if (final.status === "unavailable") { add("Final result", "unavailable: " + (final.reason || "")); return; }
    if (final.status !== "final") { add("Final result", "pending"); return; }
    const r = final.rows || {};
    add("Final rows", r.total + " total: " + r.answered + " answered (" + r.blocked + " blocked), " + r.failed + " failed");
    const errors = Object.entries(final.errors || {});
    add("Final errors by code", errors.length ? errors.map(([c, n]) => c + ": " + n).join(", ") : "none");
    add("Attempts", final.attempts);
    if (final.cost) {
      const c = final.cost;
      add(costLabel, costText(c) + (c.retries_usd != null ? "; retries added $" + c.retries_usd : ""));
    }
    if (final.stopped) add("Stopped", final.stopped);
    add("Final result", final.location);
  }

  // What a batch or a lineage cost (docs/results.md): US dollars at Batch API prices, or
  // unknown with why (never shown as 0).
  function costText(c) {
    if (c.usd == null) return "unknown: " + (c.reason || "");
    const d = c.batch_discount || {};
    const how = d.by === "genai-prices" ? "genai-prices' batch price"
      : "standard price × " + (d.factor || "?") + (d.by === "mixed" ? " for some bands" : "");
    return "$" + c.usd + " at Batch API prices (" + (c.model || "?") + ", " + how +
      (c.prices ? ", " + c.prices : "") + ")";
  }

  // A batch's progress (batchStats) as a progress bar with its counts beside it.
  function progressBar(p) {
    const total = Number(p.requestCount || 0);
    const done = Number(p.successfulRequestCount || 0) + Number(p.failedRequestCount || 0);
    const wrap = document.createElement("span");
    wrap.className = "progress";
    const bar = document.createElement("progress");
    bar.id = "detail-progress";
    bar.max = total || 1;
    bar.value = Math.min(done, total || 1);
    const text = done + " of " + total + " done" +
      (p.failedRequestCount ? " (" + p.failedRequestCount + " failed)" : "");
    bar.setAttribute("aria-label", "progress: " + text);
    const label = document.createElement("span");
    label.textContent = " " + text;
    wrap.append(bar, label);
    return wrap;
  }

  function closeDetail() {
    const name = state.selected;
    state.selected = null;
    $("detail").hidden = true;
    for (const tr of $("rows").children) tr.classList.remove("selected");
    const row = name && document.querySelector('tr[data-name="' + CSS.escape(name) + '"] button');
    if (row) row.focus();
  }

  $("detail-close").addEventListener("click", closeDetail);

  // --- poll one operation now (opstate refresh) ---------------------------------------------
  function renderRefreshButton() {
    const button = $("detail-refresh");
    button.disabled = !state.help.refresh;
    button.title = state.help.refresh
      ? "Ask Gemini for this operation's state now, through the same ingest path as the reconciler"
      : "Needs a Gemini API key: start opstate serve with GEMINI_API_KEY set";
  }

  async function refreshSelected() {
    const name = state.selected;
    if (!name) return;
    const button = $("detail-refresh");
    const result = $("refresh-result");
    button.disabled = true;
    result.hidden = false;
    result.classList.remove("error");
    result.textContent = "Polling Gemini for " + name + "…";
    try {
      const response = await fetch("/ui/api/refresh?name=" + encodeURIComponent(name), {
        method: "POST",
        headers: { Authorization: "Bearer " + state.token, Accept: "application/json" },
        cache: "no-store",
      });
      if (response.status === 401) throw new Unauthorized("the token was refused");
      const body = await response.json();
      result.textContent = body.message || response.statusText;
      result.classList.toggle("error", !response.ok || Boolean(body.error));
    } catch (error) {
      if (error instanceof Unauthorized) {
        sessionStorage.removeItem(TOKEN_KEY);
        askForToken("The token was refused. Paste the opstate API token.");
        return;
      }
      result.textContent = "Cannot reach the server (" + error.message + ")";
      result.classList.add("error");
    } finally {
      renderRefreshButton();
    }
    if (state.selected === name) await loadDetail(name, false);
    state.cursor = "";
    poll();
  }

  $("detail-refresh").addEventListener("click", refreshSelected);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.selected) closeDetail();
    if (event.key === "/" && document.activeElement.tagName !== "INPUT") {
      event.preventDefault();
      $("search").focus();
    }
  });

  // --- filters -------------------------------------------------------------------------------
  for (const id of ["search", "filter-state", "filter-kind", "filter-open"]) {
    $(id).addEventListener("input", () => render(null));
    $(id).addEventListener("change", () => render(null));
  }
  $("filters").addEventListener("submit", (event) => event.preventDefault());
  $("filters").addEventListener("reset", () => setTimeout(() => render(null), 0));

  function setStatus(text, error) {
    const status = $("status");
    status.textContent = text;
    status.classList.toggle("error", Boolean(error));
  }

  state.token = takeTokenFromFragment();
  loadHelp();
  if (state.token) poll();
  else askForToken("This page needs the opstate API token: open the link opstate serve prints, or paste the token.");
})();
