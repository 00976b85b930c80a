// Analytics console. Everything on the page comes from the public analytics API, called with the
// caller's access token. The token lives in this closure only (never in storage or cookies), and
// is refreshed about 5 minutes before it expires (spec, Authentication rule 2).
(function () {
  "use strict";

  var body = document.body;
  var API = body.getAttribute("data-api-base") || "/api/v1";
  var DEV_SIGNIN = body.getAttribute("data-dev-signin") === "on";
  var REFRESH_MARGIN_SECONDS = 300;
  var ADMIN_ROLES = ["admin", "super_admin"];

  var auth = { token: null, mode: null, refreshTimer: null, warnTimer: null, refreshing: null };
  var state = { view: "org", days: 30, from: null, to: null, isAdmin: false, channel: null, loadSeq: 0 };
  var charts = {};
  var tables = {};

  function $(id) { return document.getElementById(id); }

  // ---------------------------------------------------------------- formatting
  var integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  var decimal = new Intl.NumberFormat("en-US", { maximumFractionDigits: 2 });
  var money = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD" });
  var cents = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD", minimumFractionDigits: 2, maximumFractionDigits: 4 });

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
  var FORMATS = {
    number: fmtInt, cost: fmtCost, duration: fmtDuration,
    decimal: function (v) { return decimal.format(num(v)); },
    csat: function (v) { return v === null || v === undefined ? "–" : decimal.format(num(v)); },
    text: function (v) { return v === null || v === undefined ? "" : String(v); }
  };
  var METRIC_FORMATS = {
    total_cost: fmtCost, avg_session_duration: fmtDuration
  };

  // ---------------------------------------------------------------- dates (UTC calendar days)
  function isoDay(date) { return date.toISOString().slice(0, 10); }
  function addDays(day, n) {
    var d = new Date(day + "T00:00:00Z");
    d.setUTCDate(d.getUTCDate() + n);
    return isoDay(d);
  }
  function daysBetween(from, to) {
    var out = [];
    for (var day = from; day <= to && out.length < 1000; day = addDays(day, 1)) { out.push(day); }
    return out;
  }
  function currentRange() {
    if (state.days) {
      var to = isoDay(new Date());
      return { from: addDays(to, 1 - state.days), to: to };
    }
    return { from: state.from, to: state.to };
  }

  // ---------------------------------------------------------------- messages people understand
  function show(el, visible) { el.hidden = !visible; }
  function setStatus(text, kind) {
    var el = $("status");
    el.textContent = text || "";
    el.className = "status" + (kind ? " " + kind : "");
  }
  function banner(text) {
    var el = $("banner");
    el.textContent = text || "";
    show(el, !!text);
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
  function startDashboard() {
    return api("/me").then(function (me) {
      state.isAdmin = ADMIN_ROLES.indexOf(me.role) >= 0 || (me.scopes || []).indexOf("*") >= 0;
      $("identity-text").textContent = "org " + me.orgId + " · " + me.userId
        + (me.role ? " (" + me.role + ")" : "") + (me.product ? " · product " + me.product : "");
      show($("identity"), true);
      show($("global-tab"), state.isAdmin);
      if (!state.isAdmin && state.view === "global") { state.view = "org"; }
      show($("signin"), false);
      show($("dashboard"), true);
      $("signin-error").hidden = true;
      return load();
    });
  }

  function signInFailed(failure) {
    var el = $("signin-error");
    el.textContent = failure instanceof ApiFailure && failure.status !== 401
      ? (withDetails(failure) || explain(failure)) : explain(failure);
    show(el, true);
  }

  function showSignIn(message) {
    clearTimers();
    auth.token = null;
    show($("dashboard"), false);
    show($("identity"), false);
    show($("signin"), true);
    var el = $("signin-error");
    el.textContent = message || "";
    show(el, !!message);
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
      var done = function () { banner(""); showSignIn(); };
      if (auth.mode === "session") {
        fetch("/console/session", { method: "DELETE", credentials: "same-origin" }).then(done, done);
      } else {
        done();
      }
    });
  }

  // ---------------------------------------------------------------- tables
  function SortableTable(table, rowKey, onPick) {
    this.table = table;
    this.onPick = onPick || null;
    this.rows = [];
    this.sortKey = null;
    this.sortDir = -1;
    this.rowKey = rowKey;
    var self = this;
    Array.prototype.forEach.call(table.querySelectorAll("th[data-key]"), function (th) {
      if (th.getAttribute("data-type") !== "text") { th.className = "num"; }
      var button = document.createElement("button");
      button.type = "button";
      button.className = "sort";
      button.textContent = th.textContent;
      th.textContent = "";
      th.appendChild(button);
      button.addEventListener("click", function () { self.sortBy(th.getAttribute("data-key")); });
    });
  }
  SortableTable.prototype.setRows = function (rows, defaultKey) {
    this.rows = rows.slice();
    if (!this.sortKey) { this.sortKey = defaultKey; this.sortDir = -1; }
    this.render();
  };
  SortableTable.prototype.sortBy = function (key) {
    if (this.sortKey === key) { this.sortDir = -this.sortDir; } else { this.sortKey = key; this.sortDir = -1; }
    this.render();
  };
  SortableTable.prototype.columns = function () {
    return Array.prototype.map.call(this.table.querySelectorAll("th[data-key]"), function (th) {
      return { key: th.getAttribute("data-key"), type: th.getAttribute("data-type"), th: th };
    });
  };
  SortableTable.prototype.render = function () {
    var key = this.sortKey, dir = this.sortDir, columns = this.columns();
    var type = (columns.filter(function (c) { return c.key === key; })[0] || {}).type;
    var rowKey = this.rowKey, onPick = this.onPick;
    this.rows.sort(function (a, b) {
      var x = a[key], y = b[key];
      if (type === "text") {
        return dir * String(x === null || x === undefined ? a[rowKey] : x)
          .localeCompare(String(y === null || y === undefined ? b[rowKey] : y));
      }
      x = x === null || x === undefined ? -Infinity : num(x);
      y = y === null || y === undefined ? -Infinity : num(y);
      return dir * (x < y ? -1 : x > y ? 1 : 0);
    });
    columns.forEach(function (c) {
      c.th.setAttribute("aria-sort", c.key === key ? (dir > 0 ? "ascending" : "descending") : "none");
    });
    var tbody = this.table.tBodies[0];
    tbody.textContent = "";
    this.rows.forEach(function (row) {
      var tr = document.createElement("tr");
      tr.setAttribute("data-id", row[rowKey] === undefined ? "" : String(row[rowKey]));
      columns.forEach(function (c) {
        var td = document.createElement("td");
        var value = row[c.key];
        if (c.type === "text" && (value === null || value === undefined || value === "")) { value = row[rowKey]; }
        var text = FORMATS[c.type || "text"](value);
        if (onPick && c === columns[0]) {
          var pick = document.createElement("button");
          pick.type = "button";
          pick.className = "link pick";
          pick.textContent = text;
          pick.addEventListener("click", function () { onPick(row); });
          td.appendChild(pick);
        } else {
          td.textContent = text;
        }
        if (c.type !== "text") { td.className = "num"; td.setAttribute("data-value", value === null || value === undefined ? "" : String(value)); }
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
  };

  // ---------------------------------------------------------------- charts
  var PALETTE = ["#2563eb", "#16a34a", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#4b5563"];

  function drawChart(id, config) {
    if (charts[id]) { charts[id].destroy(); }
    config.options = Object.assign({ responsive: true, maintainAspectRatio: false, animation: false }, config.options || {});
    charts[id] = new window.Chart($(id), config);
  }

  function perDay(rows, range) {
    // Every day of the range, a day the API did not list counting as 0.
    var byDay = {};
    rows.forEach(function (row) { byDay[String(row.date).slice(0, 10)] = row; });
    var days = daysBetween(range.from, range.to);
    return {
      days: days,
      series: function (field) { return days.map(function (d) { return byDay[d] ? num(byDay[d][field]) : 0; }); }
    };
  }

  function drawDaily(rows, range) {
    var daily = perDay(rows, range), days = daily.days, series = daily.series;
    var chats = series("total_chats"), messages = series("total_messages"), tokens = series("total_tokens");
    drawChart("daily-chart", {
      type: "line",
      data: {
        labels: days,
        datasets: [
          { label: "Chats", data: chats, borderColor: PALETTE[0], backgroundColor: PALETTE[0], yAxisID: "y", tension: 0.2 },
          { label: "Messages", data: messages, borderColor: PALETTE[1], backgroundColor: PALETTE[1], yAxisID: "y", tension: 0.2 },
          { label: "Tokens", data: tokens, borderColor: PALETTE[2], backgroundColor: PALETTE[2], yAxisID: "tokens", tension: 0.2, borderDash: [4, 3] }
        ]
      },
      options: {
        interaction: { mode: "index", intersect: false },
        scales: {
          y: { beginAtZero: true, position: "left", title: { display: true, text: "chats / messages" } },
          tokens: { beginAtZero: true, position: "right", grid: { drawOnChartArea: false }, title: { display: true, text: "tokens" } }
        }
      }
    });
    var empty = chats.concat(messages, tokens).every(function (v) { return v === 0; });
    show($("daily-empty"), empty);
  }

  function drawUsage(rows) {
    drawChart("usage-chart", {
      type: "bar",
      data: {
        labels: rows.map(function (r) { return r.service + " · " + r.model; }),
        datasets: [
          { label: "Input tokens", data: rows.map(function (r) { return num(r.input_tokens); }), backgroundColor: PALETTE[0] },
          { label: "Output tokens", data: rows.map(function (r) { return num(r.output_tokens); }), backgroundColor: PALETTE[2] }
        ]
      },
      options: { indexAxis: "y", scales: { x: { stacked: true, beginAtZero: true }, y: { stacked: true } } }
    });
  }

  function drawChannels(rows) {
    drawChart("channels-chart", {
      type: "bar",
      data: {
        labels: rows.map(function (r) { return r.channel; }),
        datasets: [
          { label: "Chats", data: rows.map(function (r) { return num(r.total_chats); }), backgroundColor: PALETTE[0] },
          { label: "Messages", data: rows.map(function (r) { return num(r.total_messages); }), backgroundColor: PALETTE[1] }
        ]
      },
      options: { scales: { y: { beginAtZero: true } } }
    });
  }

  function drawChannelDaily(rows, range) {
    var daily = perDay(rows, range), days = daily.days, series = daily.series;
    drawChart("channel-daily-chart", {
      type: "line",
      data: {
        labels: days,
        datasets: [
          { label: "Chats", data: series("total_chats"), borderColor: PALETTE[0], backgroundColor: PALETTE[0], tension: 0.2 },
          { label: "Messages", data: series("total_messages"), borderColor: PALETTE[1], backgroundColor: PALETTE[1], tension: 0.2 },
          { label: "Users", data: series("unique_users"), borderColor: PALETTE[3], backgroundColor: PALETTE[3], tension: 0.2 }
        ]
      },
      options: { interaction: { mode: "index", intersect: false }, scales: { y: { beginAtZero: true } } }
    });
  }

  function fillTotals(containerId, summary) {
    Array.prototype.forEach.call($(containerId).querySelectorAll("[data-metric]"), function (el) {
      var key = el.getAttribute("data-metric");
      var value = summary ? summary[key] : null;
      el.setAttribute("data-value", value === null || value === undefined ? "" : String(value));
      el.textContent = value === null || value === undefined ? "–" : (METRIC_FORMATS[key] || fmtInt)(value);
    });
  }

  // ---------------------------------------------------------------- loading
  function setBusy(busy) {
    ["org-view", "global-view"].forEach(function (id) { $(id).setAttribute("aria-busy", busy ? "true" : "false"); });
    body.classList.toggle("loading", busy);
  }

  function rangeLabel(range) {
    return "Showing " + range.from + " to " + range.to + " (UTC)";
  }

  function load() {
    var range = currentRange();
    if (!range.from || !range.to) {
      setStatus("Choose both a start and an end date.", "error");
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
    // What the page shows once this load settles (tests and people wait for it).
    var loadKey = state.view + ":" + range.from + ":" + range.to
      + (state.view === "global" && state.channel ? ":" + state.channel : "");
    body.removeAttribute("data-loaded");
    var params = { from: range.from, to: range.to };
    setBusy(true);
    setStatus("Loading analytics…", "loading");
    var work = state.view === "global" ? loadGlobal(params, range) : loadOrg(params, range);
    return work.then(function (empty) {
      if (seq !== state.loadSeq) { return; }
      setStatus(empty ? "No data in this date range. Try a longer range." : "", empty ? "empty" : "");
      body.setAttribute("data-loaded", loadKey);
    }).catch(function (failure) {
      if (seq !== state.loadSeq) { return; }
      setStatus(explain(failure), "error");
      if (failure instanceof ApiFailure && failure.status === 401) { showSignIn(explain(failure)); }
    }).finally(function () {
      if (seq === state.loadSeq) { setBusy(false); }
    });
  }

  function loadOrg(params, range) {
    show($("org-view"), true);
    show($("global-view"), false);
    return Promise.all([
      api("/analytics/summary", params), api("/analytics/daily", params),
      api("/analytics/agents", params), api("/analytics/usage", params)
    ]).then(function (answers) {
      var summary = answers[0].data, daily = answers[1].data || [], agents = answers[2].data || [], usage = answers[3].data || [];
      fillTotals("org-totals", summary);
      drawDaily(daily, range);
      tables.agents.setRows(agents, "total_chats");
      show($("agents-empty"), agents.length === 0);
      tables.usage.setRows(usage, "total_tokens");
      drawUsage(usage);
      show($("usage-empty"), usage.length === 0);
      return num(summary && summary.total_chats) === 0 && num(summary && summary.total_messages) === 0
        && usage.length === 0;
    });
  }

  function loadGlobal(params, range) {
    show($("org-view"), false);
    show($("global-view"), true);
    return Promise.all([
      api("/analytics/global/summary", params), api("/analytics/global/orgs", params),
      api("/analytics/global/channels", params)
    ]).then(function (answers) {
      var summary = answers[0].data, orgs = answers[1].data || [], channels = answers[2].data || [];
      fillTotals("global-totals", summary);
      tables.orgs.setRows(orgs, "total_chats");
      show($("orgs-empty"), orgs.length === 0);
      tables.channels.setRows(channels, "total_chats");
      drawChannels(channels);
      show($("channels-empty"), channels.length === 0);
      show($("channels-hint"), channels.length > 0);
      var picked = channels.some(function (c) { return c.channel === state.channel; });
      show($("channel-detail"), picked);
      return (picked ? loadChannel(state.channel, params, range) : Promise.resolve()).then(function () {
        return orgs.length === 0 && channels.length === 0;
      });
    });
  }

  function loadChannel(channel, params, range) {
    var base = "/analytics/global/channels/" + encodeURIComponent(channel);
    return Promise.all([api(base + "/daily", params), api(base + "/orgs", params)]).then(function (answers) {
      $("channel-title").textContent = "Channel: " + channel;
      drawChannelDaily(answers[0].data || [], range);
      tables.channelOrgs.setRows(answers[1].data || [], "total_chats");
      show($("channel-detail"), true);
      body.setAttribute("data-channel", channel);
    });
  }

  function pickChannel(row) {
    state.channel = row.channel;
    load();
  }

  // ---------------------------------------------------------------- controls
  function pressOnly(buttons, pressed) {
    Array.prototype.forEach.call(buttons, function (b) { b.setAttribute("aria-pressed", b === pressed ? "true" : "false"); });
  }

  function bindControls() {
    var presets = document.querySelectorAll(".range-presets button");
    Array.prototype.forEach.call(presets, function (button) {
      button.addEventListener("click", function () {
        state.days = Number(button.getAttribute("data-days"));
        pressOnly(presets, button);
        load();
      });
    });
    $("range-form").addEventListener("submit", function (event) {
      event.preventDefault();
      state.days = null;
      state.from = $("range-from").value;
      state.to = $("range-to").value;
      pressOnly(presets, null);
      load();
    });
    var tabs = document.querySelectorAll(".tab");
    Array.prototype.forEach.call(tabs, function (tab) {
      tab.addEventListener("click", function () {
        state.view = tab.getAttribute("data-view");
        pressOnly(tabs, tab);
        load();
      });
    });
  }

  function init() {
    tables.agents = new SortableTable($("agents-table"), "agent_id");
    tables.usage = new SortableTable($("usage-table"), "model");
    tables.orgs = new SortableTable($("orgs-table"), "org_id");
    tables.channels = new SortableTable($("channels-table"), "channel", pickChannel);
    tables.channelOrgs = new SortableTable($("channel-orgs-table"), "org_id");
    bindSignIn();
    bindControls();
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
