// Analytics console. Everything on the page comes from the public analytics API, called with the
// caller's access token. The token lives in this closure only (never in storage or cookies), and
// is refreshed about 5 minutes before it expires, from the console's own token endpoint. What the page shows
// (view, range, granularity, time zone, filters) lives in the URL, so a reload or a shared link
// shows the same thing.
(function () {
  "use strict";

  var body = document.body;
  var API = body.getAttribute("data-api-base") || "/api/v1";
  var DEV_SIGNIN = body.getAttribute("data-dev-signin") === "on";
  var REFRESH_MARGIN_SECONDS = 300;
  var ADMIN_ROLES = ["admin", "super_admin"];
  var PRESETS = [7, 30, 90, 365];
  var INTERVALS = ["day", "week", "month"];
  var FILTERS = { org: ["agent", "channel", "model"], global: ["org", "channel"] };
  var UTC_ZONES = ["UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Universal", "Universal", "Etc/Zulu", "Zulu",
                   "GMT", "Etc/GMT", "Etc/GMT0", "Etc/GMT+0", "Etc/GMT-0", "GMT0", "Etc/Greenwich", "Greenwich"];
  var BROWSER_ZONE = (function () {
    try { return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC"; } catch (e) { return "UTC"; }
  })();

  var auth = { token: null, mode: null, refreshTimer: null, warnTimer: null, refreshing: null };
  var DEFAULTS = { view: "org", days: 30, from: null, to: null, interval: "day", tz: "local",
                   agent: "", channel: "", model: "", org: "" };
  var state = Object.assign({}, DEFAULTS, { isAdmin: false, loadSeq: 0, signedIn: false });
  var charts = {};
  var tables = {};
  var exports = {};  // CSV name -> function returning {columns, rows}

  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) { node.textContent = text; }
    return node;
  }

  // ---------------------------------------------------------------- formatting
  var integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  var decimal = new Intl.NumberFormat("en-US", { maximumFractionDigits: 2 });
  var money = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD" });
  var cents = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD", minimumFractionDigits: 2, maximumFractionDigits: 4 });

  function isNone(value) { return value === null || value === undefined; }
  function num(value) { var n = Number(value); return isFinite(n) ? n : 0; }
  function fmtInt(value) { return integer.format(num(value)); }
  function fmtCost(value) {
    var n = num(value);  // cents, unless a sum is under one cent and would read as $0.00
    return (n !== 0 && Math.abs(n) < 0.01 ? cents : money).format(n);
  }
  function fmtDuration(seconds) {
    var s = Math.round(num(seconds));
    if (s < 60) { return s + "s"; }
    var m = Math.floor(s / 60), rest = s % 60;
    if (m < 60) { return m + "m " + (rest < 10 ? "0" : "") + rest + "s"; }
    var h = Math.floor(m / 60);
    return h + "h " + (m % 60) + "m";
  }
  function fmtCsat(value) { return isNone(value) ? "–" : decimal.format(num(value)); }
  var FORMATS = {
    number: fmtInt, cost: fmtCost, duration: fmtDuration, csat: fmtCsat,
    decimal: function (v) { return decimal.format(num(v)); },
    text: function (v) { return isNone(v) ? "" : String(v); }
  };

  // The metrics of the cards and the charts, in order. `byChat`: not split by model.
  var METRICS = [
    { key: "total_chats", label: "Chats", format: fmtInt, integer: true, byChat: true },
    { key: "total_messages", label: "Messages", format: fmtInt, integer: true },
    { key: "unique_users", label: "Users", format: fmtInt, integer: true },
    { key: "total_tokens", label: "Tokens", format: fmtInt, integer: true },
    { key: "total_cost", label: "Cost", format: fmtCost },
    { key: "avg_session_duration", label: "Average session", format: fmtDuration, byChat: true, unit: "seconds" },
    { key: "avg_csat", label: "CSAT (1–5)", format: fmtCsat, byChat: true, min: 1, max: 5, absoluteDelta: true }
  ];
  var PALETTE = ["#2563eb", "#16a34a", "#9333ea", "#d97706", "#dc2626", "#0891b2", "#4b5563"];

  // ---------------------------------------------------------------- dates and time zones
  var ISO_DAY = /^\d{4}-\d{2}-\d{2}$/;
  function validDay(text) {
    if (!ISO_DAY.test(text || "")) { return false; }
    var d = new Date(text + "T00:00:00Z");
    return !isNaN(d.getTime()) && d.toISOString().slice(0, 10) === text;
  }
  function addDays(day, n) {
    var d = new Date(day + "T00:00:00Z");
    d.setUTCDate(d.getUTCDate() + n);
    return d.toISOString().slice(0, 10);
  }
  function dayCount(from, to) {
    return Math.round((Date.parse(to + "T00:00:00Z") - Date.parse(from + "T00:00:00Z")) / 86400000) + 1;
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function zoneIsUtc() { return state.tz === "utc" || UTC_ZONES.indexOf(BROWSER_ZONE) >= 0; }
  function zoneName() { return zoneIsUtc() ? "UTC" : BROWSER_ZONE; }
  function today() {
    var now = new Date();
    if (zoneIsUtc()) { return now.toISOString().slice(0, 10); }
    return now.getFullYear() + "-" + pad(now.getMonth() + 1) + "-" + pad(now.getDate());
  }
  function localInstant(day, plusDays) {  // the browser zone's midnight starting `day` (+n days), in UTC
    var p = day.split("-");
    return new Date(Number(p[0]), Number(p[1]) - 1, Number(p[2]) + (plusDays || 0));
  }
  function apiWindow(range) {
    // UTC: calendar dates. Another zone: the instants of its midnights (the API takes both exactly).
    if (zoneIsUtc()) { return { from: range.from, to: range.to }; }
    var end = new Date(localInstant(range.to, 1).getTime() - 1).toISOString().replace(/Z$/, "999Z");
    return { from: localInstant(range.from).toISOString(), to: end };
  }
  function currentRange() {
    if (state.days) {
      var to = today();
      return { from: addDays(to, 1 - state.days), to: to };
    }
    return { from: state.from, to: state.to };
  }
  function previousRange(range) {
    var n = dayCount(range.from, range.to);
    return { from: addDays(range.from, -n), to: addDays(range.from, -1) };
  }

  // ---------------------------------------------------------------- the URL is the state
  function toQuery() {
    var q = new URLSearchParams();
    if (state.view !== "org") { q.set("view", state.view); }
    if (state.days) {
      if (state.days !== DEFAULTS.days) { q.set("range", state.days + "d"); }
    } else {
      q.set("from", state.from || ""); q.set("to", state.to || "");
    }
    if (state.interval !== "day") { q.set("interval", state.interval); }
    if (state.tz === "utc") { q.set("tz", "utc"); }
    FILTERS[state.view].forEach(function (f) { if (state[f]) { q.set(f, state[f]); } });
    var text = q.toString();
    return text ? "?" + text : "";
  }
  function fromQuery(search) {
    var q = new URLSearchParams(search || "");
    var next = Object.assign({}, DEFAULTS);
    if (q.get("view") === "global") { next.view = "global"; }
    var range = /^(\d+)d$/.exec(q.get("range") || "");
    if (range && PRESETS.indexOf(Number(range[1])) >= 0) { next.days = Number(range[1]); }
    if (validDay(q.get("from")) && validDay(q.get("to"))) {
      next.days = null; next.from = q.get("from"); next.to = q.get("to");
    }
    if (INTERVALS.indexOf(q.get("interval")) >= 0) { next.interval = q.get("interval"); }
    if (q.get("tz") === "utc") { next.tz = "utc"; }
    FILTERS[next.view].forEach(function (f) { next[f] = (q.get(f) || "").slice(0, 256); });
    Object.assign(state, next);
  }
  function navigate(changes, options) {
    Object.assign(state, changes || {});
    var url = location.pathname + toQuery();
    if (url !== location.pathname + location.search) {
      history[options && options.replace ? "replaceState" : "pushState"](null, "", url);
    }
    syncControls();
    return load();
  }

  // ---------------------------------------------------------------- messages people understand
  function show(node, visible) { node.hidden = !visible; }
  function setStatus(text, kind) {
    var node = $("status");
    node.textContent = text || "";
    node.className = "status" + (kind ? " " + kind : "");
  }
  function banner(text) {
    var node = $("banner");
    node.textContent = text || "";
    show(node, !!text);
  }

  function ApiFailure(status, code, message, requestId, details) {
    this.status = status; this.code = code; this.message = message; this.requestId = requestId;
    this.details = details || null;
  }

  function withDetails(failure) {
    // "Request validation failed." alone helps nobody: name the fields and what is wrong with them.
    var fields = failure.details && failure.details.fields;
    if (!fields || typeof fields !== "object") { return failure.message; }
    return failure.message + " " + Object.keys(fields).map(function (name) {
      var problems = fields[name];
      return name + ": " + (Array.isArray(problems) ? problems.join(" ") : JSON.stringify(problems));
    }).join("; ");
  }

  function explain(failure) {
    if (!(failure instanceof ApiFailure)) {
      return "Could not reach the service. Check your connection and try again.";
    }
    if (failure.status === 401) {
      return auth.mode === "session"
        ? "Your session has expired. Please sign in again."
        : "Your access token has expired or is not valid. Paste a new one (for example from `flask token mint`).";
    }
    if (failure.status === 403) {
      return "Your access token may not read analytics: it needs the scope read or read:analytics"
        + (state.view === "global" ? ", and the platform view needs the admin role." : ".");
    }
    if (failure.status === 400) {
      return "The service did not accept this request: " + withDetails(failure);
    }
    if (failure.status >= 500) {
      return "The service had a problem answering (" + failure.status + "). Try again in a moment"
        + (failure.requestId ? "; quote request id " + failure.requestId + " if it persists." : ".");
    }
    return failure.message || ("Unexpected answer " + failure.status + ".");
  }

  // ---------------------------------------------------------------- tokens
  function claimsOf(token) {
    // For display and expiry only; the service verifies the signature on every call.
    try {
      var part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      while (part.length % 4) { part += "="; }
      return JSON.parse(atob(part));
    } catch (e) {
      return null;
    }
  }

  function clearTimers() {
    clearTimeout(auth.refreshTimer); clearTimeout(auth.warnTimer);
    auth.refreshTimer = auth.warnTimer = null;
  }

  function refreshDelaySeconds(expiresIn) {
    // About 5 minutes before expiry; short-lived tokens are refreshed half-way through.
    return Math.max(expiresIn - REFRESH_MARGIN_SECONDS, expiresIn / 2);
  }

  function adoptSessionToken(answer) {
    auth.token = answer.token;
    auth.mode = "session";
    clearTimers();
    auth.refreshTimer = setTimeout(function () {
      refreshToken().catch(function () { /* reported by the next API call */ });
    }, refreshDelaySeconds(num(answer.expiresIn)) * 1000);
  }

  function adoptPastedToken(token) {
    auth.token = token;
    auth.mode = "pasted";
    clearTimers();
    var claims = claimsOf(token);
    if (claims && claims.exp) {
      var left = claims.exp - Date.now() / 1000;
      auth.warnTimer = setTimeout(function () {
        banner("Your access token expires in less than 5 minutes. Paste a new one to keep working.");
      }, Math.max(0, left - REFRESH_MARGIN_SECONDS) * 1000);
    }
  }

  function postJson(url, payload) {
    var init = { method: "POST", credentials: "same-origin", headers: { "Accept": "application/json" } };
    if (payload !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(payload);
    }
    return fetch(url, init).then(readAnswer);
  }

  function readAnswer(response) {
    return response.text().then(function (text) {
      var data = null;
      try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
      if (response.ok) { return data; }
      var error = (data && data.error) || {};
      throw new ApiFailure(response.status, error.code, error.message || response.statusText,
                           response.headers.get("X-Request-ID"), error.details);
    });
  }

  function refreshToken() {
    // One refresh at a time, shared by every call that found its token expired.
    if (!auth.refreshing) {
      auth.refreshing = postJson("/console/token").then(function (answer) {
        adoptSessionToken(answer);
        return answer.token;
      }).finally(function () { auth.refreshing = null; });
    }
    return auth.refreshing;
  }

  function api(path, params) {
    var query = new URLSearchParams(params || {}).toString();
    var url = API + path + (query ? "?" + query : "");
    function call(token) {
      return fetch(url, { headers: { "Authorization": "Bearer " + token, "Accept": "application/json" } })
        .then(readAnswer);
    }
    var sent = auth.token;
    return call(sent).catch(function (failure) {
      if (failure instanceof ApiFailure && failure.status === 401 && auth.mode === "session") {
        // Expired (a sleeping laptop misses the timer): get a fresh token once and retry.
        var fresh = auth.token !== sent ? Promise.resolve(auth.token) : refreshToken();
        return fresh.then(call);
      }
      throw failure;
    });
  }

  // ---------------------------------------------------------------- sign-in and sign-out
  function clearDashboard() {
    // Nothing of a previous identity (or a previous failed load) stays on screen.
    state.loadSeq++;
    body.removeAttribute("data-loaded");
    setBusy(false);
    setStatus("");
    ["org-totals", "global-totals", "org-charts", "global-charts", "global-filter-chips"].forEach(function (id) {
      $(id).textContent = "";
    });
    ["org-charts-note", "global-charts-note", "range-label"].forEach(function (id) { $(id).textContent = ""; });
    Object.keys(charts).forEach(function (id) { charts[id].destroy(); delete charts[id]; });
    Object.keys(tables).forEach(function (key) { tables[key].setRows([]); });
    ["filter-agent", "filter-channel", "filter-model"].forEach(function (id) {
      var select = $(id);
      while (select.options.length > 1) { select.remove(1); }
      select.value = "";
    });
    show($("channel-detail"), false);
    $("identity-text").textContent = "";
    show($("identity"), false);
  }

  function startDashboard() {
    clearDashboard();
    banner("");
    show($("signin"), false);
    show($("dashboard"), true);
    setStatus("Signing in…", "loading");
    return api("/me").then(function (me) {
      state.isAdmin = ADMIN_ROLES.indexOf(me.role) >= 0 || (me.scopes || []).indexOf("*") >= 0;
      state.signedIn = true;
      $("identity-text").textContent = "org " + me.orgId + " · " + me.userId
        + (me.role ? " (" + me.role + ")" : "") + (me.product ? " · product " + me.product : "");
      show($("identity"), true);
      show($("global-tab"), state.isAdmin);
      $("signin-error").hidden = true;
      if (!state.isAdmin && state.view === "global") { state.view = "org"; }
      return navigate({}, { replace: true });
    }, function (failure) {
      show($("dashboard"), false);
      show($("signin"), true);
      throw failure;
    });
  }

  function signInFailed(failure) {
    var node = $("signin-error");
    node.textContent = failure instanceof ApiFailure && failure.status !== 401
      ? (withDetails(failure) || explain(failure)) : explain(failure);
    show(node, true);
  }

  function showSignIn(message, signedOut) {
    clearTimers();
    auth.token = null;
    state.signedIn = false;
    banner("");
    clearDashboard();
    if (signedOut) {
      // The filters name things of the signed-out identity: they do not carry over to the next one.
      // (A shared link's filters do survive the sign-in it asks for.)
      FILTERS.org.concat(FILTERS.global).forEach(function (f) { state[f] = ""; });
      history.replaceState(null, "", location.pathname + toQuery());
    }
    show($("dashboard"), false);
    show($("signin"), true);
    var node = $("signin-error");
    node.textContent = message || "";
    show(node, !!message);
  }

  function bindSignIn() {
    var dev = $("dev-signin-form");
    if (dev) {
      dev.addEventListener("submit", function (event) {
        event.preventDefault();
        var form = new FormData(dev);
        var payload = { orgId: form.get("orgId").trim(), userId: form.get("userId").trim() || "dev-user" };
        if (form.get("role")) { payload.role = form.get("role"); }
        if (form.get("product").trim()) { payload.product = form.get("product").trim(); }
        postJson("/console/session", payload).then(function (answer) {
          adoptSessionToken(answer);
          return startDashboard();
        }).catch(signInFailed);
      });
    }
    $("token-form").addEventListener("submit", function (event) {
      event.preventDefault();
      var token = new FormData(event.target).get("token").trim();
      event.target.reset();  // the token is not left in the page's form
      adoptPastedToken(token);
      startDashboard().catch(function (failure) {
        auth.token = null;
        clearTimers();
        signInFailed(failure);
      });
    });
    $("sign-out").addEventListener("click", function () {
      var done = function () { showSignIn("", true); };
      if (auth.mode === "session") {
        fetch("/console/session", { method: "DELETE", credentials: "same-origin" }).then(done, done);
      } else {
        done();
      }
    });
  }

  // ---------------------------------------------------------------- tables
  function SortableTable(table, rowKey, onPick, empty) {
    this.table = table;
    this.onPick = onPick || null;
    this.rows = [];
    this.sortKey = null;
    this.sortDir = -1;
    this.rowKey = rowKey;
    this.empty = empty || "Nothing in this range.";
    this.selected = "";
    var self = this;
    Array.prototype.forEach.call(table.querySelectorAll("th[data-key]"), function (th) {
      if (th.getAttribute("data-type") !== "text") { th.className = "num"; }
      th.setAttribute("scope", "col");
      var button = el("button", { type: "button", "class": "sort" }, th.textContent);
      th.textContent = "";
      th.appendChild(button);
      button.addEventListener("click", function () { self.sortBy(th.getAttribute("data-key")); });
    });
  }
  SortableTable.prototype.setRows = function (rows, defaultKey, selected) {
    this.rows = rows.slice();
    this.selected = selected || "";
    if (!this.sortKey && defaultKey) { this.sortKey = defaultKey; this.sortDir = -1; }
    this.render();
  };
  SortableTable.prototype.sortBy = function (key) {
    if (this.sortKey === key) { this.sortDir = -this.sortDir; } else { this.sortKey = key; this.sortDir = -1; }
    this.render();
  };
  SortableTable.prototype.columns = function () {
    return Array.prototype.map.call(this.table.querySelectorAll("th[data-key]"), function (th) {
      return { key: th.getAttribute("data-key"), type: th.getAttribute("data-type"), th: th,
               label: th.textContent };
    });
  };
  SortableTable.prototype.render = function () {
    var key = this.sortKey, dir = this.sortDir, columns = this.columns();
    var type = (columns.filter(function (c) { return c.key === key; })[0] || {}).type;
    var rowKey = this.rowKey, onPick = this.onPick, selected = this.selected;
    this.rows.sort(function (a, b) {
      var x = a[key], y = b[key];
      if (type === "text") {
        return dir * String(isNone(x) ? a[rowKey] : x).localeCompare(String(isNone(y) ? b[rowKey] : y));
      }
      x = isNone(x) ? -Infinity : num(x);
      y = isNone(y) ? -Infinity : num(y);
      return dir * (x < y ? -1 : x > y ? 1 : 0);
    });
    columns.forEach(function (c) {
      c.th.setAttribute("aria-sort", c.key === key ? (dir > 0 ? "ascending" : "descending") : "none");
    });
    var tbody = this.table.tBodies[0];
    tbody.textContent = "";
    if (!this.rows.length) {
      var tr = el("tr", { "class": "empty-row" });
      tr.appendChild(el("td", { colspan: String(columns.length) }, this.empty));
      tbody.appendChild(tr);
      return;
    }
    this.rows.forEach(function (row) {
      var id = isNone(row[rowKey]) ? "" : String(row[rowKey]);
      var tr = el("tr", { "data-id": id });
      if (selected && id === selected) { tr.className = "selected"; tr.setAttribute("aria-selected", "true"); }
      columns.forEach(function (c, index) {
        var td = el("td");
        var value = row[c.key];
        if (c.type === "text" && (isNone(value) || value === "")) { value = row[rowKey]; }
        var text = FORMATS[c.type || "text"](value);
        if (onPick && index === 0) {
          var pick = el("button", { type: "button", "class": "link pick",
                                    "aria-label": "Show the series of " + text }, text);
          pick.addEventListener("click", function () { onPick(row); });
          td.appendChild(pick);
        } else {
          td.textContent = text;
        }
        if (c.type !== "text") { td.className = "num"; td.setAttribute("data-value", isNone(value) ? "" : String(value)); }
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
  };
  SortableTable.prototype.csv = function () {
    // raw values (not the formatted text), in the table's order; the row id first when not a column
    var keys = this.columns().map(function (c) { return c.key; });
    if (keys.indexOf(this.rowKey) < 0) { keys.unshift(this.rowKey); }
    return { columns: keys, rows: this.rows };
  };

  // ---------------------------------------------------------------- CSV export
  function csvCell(value) {
    if (isNone(value)) { return ""; }
    var text = String(value);
    if (/^[=+\-@\t\r]/.test(text) && isNaN(Number(text))) { text = "'" + text; }  // no formula injection
    return /[",\n\r]/.test(text) ? '"' + text.replace(/"/g, '""') + '"' : text;
  }
  function downloadCsv(name) {
    var table = exports[name] && exports[name]();
    if (!table) { return; }
    var lines = [table.columns.map(csvCell).join(",")].concat(table.rows.map(function (row) {
      return table.columns.map(function (c) { return csvCell(row[c]); }).join(",");
    }));
    var range = currentRange();
    var link = el("a", { download: name + "_" + range.from + "_" + range.to + ".csv" });
    link.href = URL.createObjectURL(new Blob([lines.join("\r\n") + "\r\n"], { type: "text/csv;charset=utf-8" }));
    body.appendChild(link);
    link.click();
    setTimeout(function () { URL.revokeObjectURL(link.href); link.remove(); }, 1000);
  }

  // ---------------------------------------------------------------- cards with previous-period deltas
  function deltaText(metric, now, before) {
    if (isNone(now) || isNone(before)) { return { text: "", kind: "" }; }
    var a = num(now), b = num(before);
    if (metric.absoluteDelta) {
      var diff = Math.round((a - b) * 100) / 100;
      return { text: (diff > 0 ? "▲ +" : diff < 0 ? "▼ " : "") + decimal.format(diff),
               kind: diff > 0 ? "up" : diff < 0 ? "down" : "flat" };
    }
    if (b === 0) { return a === 0 ? { text: "no change", kind: "flat" } : { text: "▲ new", kind: "up" }; }
    var pct = Math.round(((a - b) / b) * 1000) / 10;
    return { text: (pct > 0 ? "▲ +" : pct < 0 ? "▼ " : "") + decimal.format(pct) + "%",
             kind: pct > 0 ? "up" : pct < 0 ? "down" : "flat" };
  }
  function fillCards(containerId, cards, previousLabel) {
    var container = $(containerId);
    container.textContent = "";
    cards.forEach(function (card) {
      var box = el("div", { "class": "card", "data-card": card.key });
      box.appendChild(el("span", { "class": "label" }, card.label));
      var value = el("span", { "class": "value", "data-metric": card.key,
                                "data-value": isNone(card.value) ? "" : String(card.value) },
                     isNone(card.value) ? "–" : card.format(card.value));
      box.appendChild(value);
      if (card.note) { box.appendChild(el("span", { "class": "sub" }, card.note)); }
      var delta = card.previous === undefined ? { text: "" } : deltaText(card, card.value, card.previous);
      if (delta.text) {
        box.appendChild(el("span", { "class": "delta " + delta.kind, "data-delta": card.key,
                                      title: "Previous period: " + (isNone(card.previous) ? "–" : card.format(card.previous)) },
                           delta.text + " vs " + previousLabel));
      }
      container.appendChild(box);
    });
  }

  // ---------------------------------------------------------------- charts (one metric each, own axis)
  function periodLabel(period) {
    if (state.interval === "month") { return period.slice(0, 7); }
    if (state.interval === "week") { return "week of " + period; }
    return period;
  }
  function drawSeries(containerId, answer, model) {
    var container = $(containerId);
    var points = answer.points || [];
    var labels = points.map(function (p) { return p.period; });
    var open = points.map(function (p) { return !p.complete; });
    var visible = METRICS.filter(function (m) { return !(model && m.byChat); });
    Object.keys(charts).forEach(function (id) {  // the canvases are replaced: free their charts
      if (id.indexOf(containerId + "-") === 0) { charts[id].destroy(); delete charts[id]; }
    });
    container.textContent = "";
    visible.forEach(function (metric, index) {
      var id = containerId + "-" + metric.key;
      var values = points.map(function (p) { return isNone(p[metric.key]) ? null : num(p[metric.key]); });
      var panel = el("figure", { "class": "chart-panel", "data-metric": metric.key });
      var caption = el("figcaption", {}, metric.label);
      panel.appendChild(caption);
      var box = el("div", { "class": "chart-box" });
      var canvas = el("canvas", { id: id, role: "img", "aria-describedby": id + "-table-summary",
                                  "aria-label": metric.label + " per " + state.interval + " (" + zoneName()
                                    + "); the data table below lists every value" });
      box.appendChild(canvas);
      panel.appendChild(box);
      panel.appendChild(dataTable(id, metric, points, values));
      container.appendChild(panel);
      var color = PALETTE[index % PALETTE.length];
      var hasData = values.some(function (v) { return v !== null && v !== 0; });
      var scale = { beginAtZero: metric.min === undefined, ticks: {} };
      if (metric.integer) { scale.ticks.precision = 0; }
      if (metric.min !== undefined) { scale.min = metric.min; scale.max = metric.max; scale.ticks.stepSize = 1; }
      else if (!hasData) { scale.suggestedMax = 1; }
      if (metric.key === "total_cost") { scale.ticks.callback = function (v) { return fmtCost(v); }; }
      if (metric.key === "avg_session_duration") { scale.ticks.callback = function (v) { return fmtDuration(v); }; }
      var chart = new window.Chart(canvas, {
        type: "line",
        data: { labels: labels, datasets: [{
          label: metric.label, data: values, borderColor: color, backgroundColor: color, tension: 0.2,
          spanGaps: false, pointRadius: labels.length > 120 ? 0 : 2,
          // the period not over yet (PostHog's convention): dotted line into it, hollow point
          segment: { borderDash: function (ctx) { return open[ctx.p1DataIndex] ? [4, 4] : undefined; } },
          pointBackgroundColor: function (ctx) { return open[ctx.dataIndex] ? "#fff" : color; }
        }] },
        options: {
          responsive: true, maintainAspectRatio: false, animation: false,
          interaction: { mode: "index", intersect: false },
          plugins: {
            legend: { display: false },
            tooltip: { callbacks: {
              title: function (items) { var i = items[0].dataIndex; return periodLabel(labels[i]) + (open[i] ? " (incomplete)" : ""); },
              label: function (item) { return metric.label + ": " + (item.raw === null ? "–" : metric.format(item.raw)); }
            } }
          },
          scales: { x: { ticks: { maxRotation: 0, autoSkip: true, maxTicksLimit: 6, callback: shortTick(labels) } }, y: scale }
        }
      });
      charts[id] = chart;
    });
    var openCount = open.filter(Boolean).length;
    var note = $(containerId === "org-charts" ? "org-charts-note" : "global-charts-note");
    var parts = ["Per " + state.interval + ", " + zoneName() + "."];
    if (openCount) { parts.push("Dotted: a period that is cut by the range or not over yet."); }
    if (model) { parts.push("Chats, sessions and CSAT are not split by model: filtered by model " + model + ", they are left out."); }
    note.textContent = parts.join(" ");
  }

  function shortTick(labels) {
    // 2026-11-03 → "Nov 3" (a year only where it changes); months → "Nov 2026"
    var months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    var manyYears = labels.length && labels[0].slice(0, 4) !== labels[labels.length - 1].slice(0, 4);
    return function (value) {
      var label = labels[value];
      if (!label) { return ""; }
      var month = months[Number(label.slice(5, 7)) - 1];
      if (state.interval === "month") { return month + " " + label.slice(0, 4); }
      return month + " " + Number(label.slice(8, 10)) + (manyYears ? " " + label.slice(0, 4) : "");
    };
  }

  function dataTable(id, metric, points, values) {
    var details = el("details", { "class": "data-table" });
    details.appendChild(el("summary", { id: id + "-table-summary" }, "Data table: " + metric.label));
    var wrap = el("div", { "class": "table-wrap" });
    var table = el("table", { id: id + "-table" });
    table.appendChild(el("caption", { "class": "sr-only" }, metric.label + " per " + state.interval + ", " + zoneName()));
    var head = el("tr");
    head.appendChild(el("th", { scope: "col" }, state.interval === "day" ? "Day" : state.interval === "week" ? "Week of" : "Month"));
    head.appendChild(el("th", { scope: "col", "class": "num" }, metric.label));
    table.appendChild(el("thead")).appendChild(head);
    var tbody = table.appendChild(el("tbody"));
    points.forEach(function (p, i) {
      var tr = el("tr", { "data-period": p.period });
      tr.appendChild(el("th", { scope: "row" }, periodLabel(p.period) + (p.complete ? "" : " (incomplete)")));
      tr.appendChild(el("td", { "class": "num", "data-value": values[i] === null ? "" : String(values[i]) },
                        values[i] === null ? "–" : metric.format(values[i])));
      tbody.appendChild(tr);
    });
    wrap.appendChild(table);
    details.appendChild(wrap);
    return details;
  }

  function seriesExport(answer) {
    return function () {
      return { columns: ["period", "complete"].concat(METRICS.map(function (m) { return m.key; }), ["csat_responses"]),
               rows: answer.points || [] };
    };
  }

  // ---------------------------------------------------------------- loading
  function setBusy(busy) {
    ["org-view", "global-view"].forEach(function (id) { $(id).setAttribute("aria-busy", busy ? "true" : "false"); });
    body.classList.toggle("loading", busy);
  }

  function loadKey(range) {
    // What the page shows once this load settles (tests and people wait for it).
    var extras = [];
    if (state.interval !== "day") { extras.push("interval=" + state.interval); }
    if (state.tz === "utc") { extras.push("tz=utc"); }
    FILTERS[state.view].forEach(function (f) { if (state[f]) { extras.push(f + "=" + state[f]); } });
    return state.view + ":" + range.from + ":" + range.to + (extras.length ? ";" + extras.join(";") : "");
  }

  function rangeLabel(range) {
    var n = dayCount(range.from, range.to);
    return range.from + " → " + range.to + " · " + n + (n === 1 ? " day" : " days") + " · " + zoneName()
      + (zoneIsUtc() ? "" : " (your browser's time zone)") + " · per " + state.interval;
  }

  function load() {
    if (!state.signedIn) { return Promise.resolve(); }
    var range = currentRange();
    if (!validDay(range.from) || !validDay(range.to)) {
      setStatus("Enter both dates as YYYY-MM-DD.", "error");
      return Promise.resolve();
    }
    if (range.from > range.to) {
      setStatus("The start date is after the end date.", "error");
      return Promise.resolve();
    }
    $("range-from").value = range.from;
    $("range-to").value = range.to;
    $("range-label").textContent = rangeLabel(range);
    var seq = ++state.loadSeq;
    var key = loadKey(range);
    body.removeAttribute("data-loaded");
    setBusy(true);
    setStatus("Loading analytics…", "loading");
    var work = state.view === "global" ? loadGlobal(range, seq) : loadOrg(range, seq);
    return work.then(function (empty) {
      if (seq !== state.loadSeq) { return; }
      setStatus(empty ? "No chats or messages in this date range. Try a longer range." : "", empty ? "empty" : "");
      body.setAttribute("data-loaded", key);
      if (window.performance && performance.mark && !performance.getEntriesByName("console:data-drawn").length) {
        performance.mark("console:data-drawn");  // the first data on screen (docs/operations.md)
      }
    }).catch(function (failure) {
      if (seq !== state.loadSeq) { return; }
      clearData();
      setStatus(explain(failure), "error");
      if (failure instanceof ApiFailure && failure.status === 401) { showSignIn(explain(failure)); }
    }).finally(function () {
      if (seq === state.loadSeq) { setBusy(false); }
    });
  }

  function clearData() {
    // A failed load shows no numbers at all rather than the previous answer's.
    ["org-totals", "global-totals", "org-charts", "global-charts"].forEach(function (id) { $(id).textContent = ""; });
    Object.keys(charts).forEach(function (id) { charts[id].destroy(); delete charts[id]; });
    Object.keys(tables).forEach(function (k) { tables[k].setRows([]); });
  }

  function seriesParams(win, extra) {
    var params = Object.assign({ from: win.from, to: win.to, interval: state.interval, tz: zoneName() }, extra || {});
    Object.keys(params).forEach(function (k) { if (!params[k]) { delete params[k]; } });
    return params;
  }

  function previousLabel(range) {
    var n = dayCount(range.from, range.to);
    return "previous " + n + (n === 1 ? " day" : " days");
  }

  function fillSelect(id, values, current, labelOf) {
    var select = $(id);
    var wanted = values.slice();
    if (current && wanted.indexOf(current) < 0) { wanted.push(current); }
    while (select.options.length > 1) { select.remove(1); }
    wanted.forEach(function (v) { select.appendChild(el("option", { value: v }, labelOf ? labelOf(v) : v)); });
    select.value = current || "";
  }

  function metricCards(totals, previous, extraFirst) {
    return (extraFirst || []).concat(METRICS.map(function (m) {
      var card = Object.assign({}, m, { value: totals[m.key], previous: previous ? previous[m.key] : undefined });
      if (m.key === "avg_csat" && !isNone(totals.csat_responses)) {
        card.note = fmtInt(totals.csat_responses) + (totals.csat_responses === 1 ? " answer" : " answers");
      }
      if (m.byChat && state.model) { card.value = null; card.previous = undefined; card.note = "not split by model"; }
      return card;
    }));
  }

  function loadOrg(range, seq) {
    show($("org-view"), true);
    show($("global-view"), false);
    var win = apiWindow(range), prev = apiWindow(previousRange(range));
    var filters = { agent_id: state.agent, channel: state.channel, model: state.model };
    return Promise.all([
      api("/analytics/series", seriesParams(win, filters)),
      api("/analytics/series", seriesParams(prev, Object.assign({}, filters, { interval: "month" }))),
      api("/analytics/agents", win), api("/analytics/channels", win), api("/analytics/usage", win)
    ]).then(function (answers) {
      if (seq !== state.loadSeq) { return false; }
      var series = answers[0].data, before = answers[1].data.totals;
      var agents = answers[2].data || [], channels = answers[3].data || [], usage = answers[4].data || [];
      fillCards("org-totals", metricCards(series.totals, before), previousLabel(range));
      drawSeries("org-charts", series, state.model);
      exports["org-series"] = seriesExport(series);
      tables.agents.setRows(agents, "total_chats", state.agent);
      tables.orgChannels.setRows(channels, "total_chats", state.channel);
      tables.usage.setRows(usage, "total_tokens", state.model);
      var names = {};
      agents.forEach(function (a) { names[a.agent_id] = a.agent_name || a.agent_id; });
      fillSelect("filter-agent", agents.map(function (a) { return a.agent_id; }), state.agent,
                 function (id) { return names[id] || id || "(no agent id)"; });
      fillSelect("filter-channel", channels.map(function (c) { return c.channel; }), state.channel);
      var models = [];
      usage.forEach(function (u) { if (models.indexOf(u.model) < 0) { models.push(u.model); } });
      fillSelect("filter-model", models, state.model);
      var t = series.totals;
      return num(t.total_chats) === 0 && num(t.total_messages) === 0 && num(t.total_tokens) === 0;
    });
  }

  function loadGlobal(range, seq) {
    show($("org-view"), false);
    show($("global-view"), true);
    var win = apiWindow(range), prev = apiWindow(previousRange(range));
    var filters = { org_id: state.org, channel: state.channel };
    var calls = [
      api("/analytics/global/series", seriesParams(win, filters)),
      api("/analytics/global/series", seriesParams(prev, Object.assign({}, filters, { interval: "month" }))),
      api("/analytics/global/summary", win), api("/analytics/global/summary", prev),
      api("/analytics/global/orgs", win), api("/analytics/global/channels", win)
    ];
    if (state.channel) {
      calls.push(api("/analytics/global/channels/" + encodeURIComponent(state.channel) + "/orgs", win));
    }
    return Promise.all(calls).then(function (answers) {
      if (seq !== state.loadSeq) { return false; }
      var series = answers[0].data, before = answers[1].data.totals;
      var summary = answers[2].data, summaryBefore = answers[3].data;
      var orgs = answers[4].data || [], channels = answers[5].data || [];
      var channelOrgs = state.channel ? (answers[6].data || []) : null;
      var orgCard = { key: "total_orgs", label: "Organizations", format: fmtInt };
      if (state.channel) {
        orgCard.value = channelOrgs.filter(function (o) { return !state.org || o.org_id === state.org; }).length;
        orgCard.note = "on " + state.channel;
      } else if (state.org) {
        orgCard.value = 1;
      } else {
        orgCard.value = summary.total_orgs; orgCard.previous = summaryBefore.total_orgs;
      }
      fillCards("global-totals", metricCards(series.totals, before, [orgCard]), previousLabel(range));
      drawSeries("global-charts", series, "");
      exports["global-series"] = seriesExport(series);
      tables.orgs.setRows(orgs, "total_chats", state.org);
      tables.channels.setRows(channels, "total_chats", state.channel);
      show($("channel-detail"), !!state.channel);
      if (state.channel) {
        $("channel-title").textContent = "Organizations on " + state.channel;
        tables.channelOrgs.setRows(channelOrgs, "total_chats", state.org);
      }
      renderChips(orgs);
      var t = series.totals;
      return num(t.total_chats) === 0 && num(t.total_messages) === 0 && num(t.total_tokens) === 0;
    });
  }

  function renderChips(orgs) {
    var box = $("global-filter-chips");
    box.textContent = "";
    var any = false;
    [["org", "Organization"], ["channel", "Channel"]].forEach(function (pair) {
      var value = state[pair[0]];
      if (!value) { return; }
      any = true;
      var name = value;
      if (pair[0] === "org") {
        (orgs || []).forEach(function (o) { if (o.org_id === value && o.org_name) { name = o.org_name; } });
      }
      var chip = el("span", { "class": "chip", "data-chip": pair[0] }, pair[1] + ": " + name + " ");
      var remove = el("button", { type: "button", "class": "chip-remove", "aria-label": "Remove the filter " + pair[1] + " " + name }, "×");
      remove.addEventListener("click", function () {
        var change = {};
        change[pair[0]] = "";
        navigate(change).then(function () { $("global-charts-title").focus(); });
      });
      chip.appendChild(remove);
      box.appendChild(chip);
    });
    show($("global-filter-hint"), !any);
  }

  // Picking a row filters the charts to it; focus moves to the charts it changed (not to <body>).
  function drill(changes, headingId) {
    navigate(changes).then(function () { $(headingId).focus(); });
  }

  // ---------------------------------------------------------------- controls
  function pressOnly(buttons, isPressed) {
    Array.prototype.forEach.call(buttons, function (b) { b.setAttribute("aria-pressed", isPressed(b) ? "true" : "false"); });
  }

  function syncControls() {
    pressOnly(document.querySelectorAll(".range-presets button"), function (b) {
      return Number(b.getAttribute("data-days")) === state.days;
    });
    pressOnly(document.querySelectorAll("[data-interval]"), function (b) { return b.getAttribute("data-interval") === state.interval; });
    pressOnly(document.querySelectorAll("[data-tz]"), function (b) { return b.getAttribute("data-tz") === state.tz; });
    pressOnly(document.querySelectorAll(".tab"), function (b) { return b.getAttribute("data-view") === state.view; });
    $("tz-local").textContent = "Browser time (" + BROWSER_ZONE + ")";
    show($("org-filters"), state.view === "org");
    show($("global-filters"), state.view === "global");
    ["agent", "channel", "model"].forEach(function (f) {
      var select = $("filter-" + f);
      if (state[f] && !Array.prototype.some.call(select.options, function (o) { return o.value === state[f]; })) {
        select.appendChild(el("option", { value: state[f] }, state[f]));
      }
      select.value = state.view === "org" ? state[f] : "";
    });
    var range = currentRange();
    if (validDay(range.from)) { $("range-from").value = range.from; }
    if (validDay(range.to)) { $("range-to").value = range.to; }
  }

  function bindControls() {
    Array.prototype.forEach.call(document.querySelectorAll(".range-presets button"), function (button) {
      button.addEventListener("click", function () { navigate({ days: Number(button.getAttribute("data-days")) }); });
    });
    $("range-form").addEventListener("submit", function (event) {
      event.preventDefault();
      var from = $("range-from").value.trim(), to = $("range-to").value.trim();
      if (!validDay(from) || !validDay(to)) { setStatus("Enter both dates as YYYY-MM-DD (for example 2026-01-31).", "error"); return; }
      if (from > to) { setStatus("The start date is after the end date.", "error"); return; }
      navigate({ days: null, from: from, to: to });
    });
    Array.prototype.forEach.call(document.querySelectorAll("[data-interval]"), function (button) {
      button.addEventListener("click", function () { navigate({ interval: button.getAttribute("data-interval") }); });
    });
    Array.prototype.forEach.call(document.querySelectorAll("[data-tz]"), function (button) {
      button.addEventListener("click", function () {
        // The same calendar dates in the other zone (a preset follows that zone's today).
        navigate({ tz: button.getAttribute("data-tz") });
      });
    });
    Array.prototype.forEach.call(document.querySelectorAll(".tab"), function (tab) {
      tab.addEventListener("click", function () {
        var view = tab.getAttribute("data-view");
        var change = { view: view };
        FILTERS.org.concat(FILTERS.global).forEach(function (f) { change[f] = ""; });
        navigate(change);
      });
    });
    Array.prototype.forEach.call(document.querySelectorAll("select[data-filter]"), function (select) {
      select.addEventListener("change", function () {
        var change = {};
        change[select.getAttribute("data-filter")] = select.value;
        navigate(change);  // focus stays on the select
      });
    });
    Array.prototype.forEach.call(document.querySelectorAll("button[data-csv]"), function (button) {
      button.addEventListener("click", function () { downloadCsv(button.getAttribute("data-csv")); });
    });
    window.addEventListener("popstate", function () {
      fromQuery(location.search);
      if (!state.isAdmin && state.view === "global") { state.view = "org"; }
      syncControls();
      load();
    });
  }

  function init() {
    fromQuery(location.search);
    tables.agents = new SortableTable($("agents-table"), "agent_id", function (row) {
      drill({ agent: row.agent_id }, "org-charts-title");
    }, "No agent had a chat in this range.");
    tables.orgChannels = new SortableTable($("org-channels-table"), "channel", function (row) {
      drill({ channel: row.channel }, "org-charts-title");
    }, "No channel had a chat in this range.");
    tables.usage = new SortableTable($("usage-table"), "model", function (row) {
      drill({ model: row.model }, "org-charts-title");
    }, "No model or service usage in this range.");
    tables.orgs = new SortableTable($("orgs-table"), "org_id", function (row) {
      drill({ org: row.org_id }, "global-charts-title");
    }, "No organization had activity in this range.");
    tables.channels = new SortableTable($("channels-table"), "channel", function (row) {
      drill({ channel: row.channel }, "global-charts-title");
    }, "No channel had activity in this range.");
    tables.channelOrgs = new SortableTable($("channel-orgs-table"), "org_id", function (row) {
      drill({ org: row.org_id }, "global-charts-title");
    }, "No organization on this channel in this range.");
    ["agents", "orgChannels", "usage", "orgs", "channels", "channelOrgs"].forEach(function (name) {
      exports[name] = function () { return tables[name].csv(); };
    });
    bindSignIn();
    bindControls();
    syncControls();
    if (!DEV_SIGNIN) { showSignIn(); return; }
    // A console session may still be open (page reload): ask for a token before showing the form.
    setStatus("Checking your session…", "loading");
    refreshToken().then(startDashboard).catch(function (failure) {
      setStatus("");
      showSignIn(failure instanceof ApiFailure && failure.status === 401 ? "" : explain(failure));
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
