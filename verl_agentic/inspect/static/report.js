// Rollout report (verl_agentic.inspect). Data: the JSON blob in #va-data. All text goes
// through textContent / createTextNode: model output is never parsed as HTML.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("va-data").textContent);
  var EPS = DATA.episodes, VOCAB = DATA.vocab || {}, SPECIAL = {};
  (DATA.special || []).forEach(function (i) { SPECIAL[i] = true; });
  var PAGE = 100;
  var state = { task: "", err: "", sort: "i", page: 0 };
  var app = document.getElementById("app");

  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "cls") e.className = attrs[k];
      else if (k === "onclick" || k === "onchange") e[k] = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    (children || []).forEach(function (c) { if (c != null) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "-";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : (Math.abs(v) < 1e5 ? v.toFixed(3) : v.toPrecision(3));
    if (typeof v === "object") { var s = Object.keys(v).sort().map(function (k) { return k + ":" + fmt(v[k]); }).join(", "); return s || "-"; }
    return String(v);
  }
  function clear() { while (app.firstChild) app.removeChild(app.firstChild); }

  // ---- run view ----
  function taskTable() {
    var tasks = DATA.tasks || {}, names = Object.keys(tasks), keys = [];
    names.forEach(function (n) { Object.keys(tasks[n]).forEach(function (k) { if (keys.indexOf(k) < 0) keys.push(k); }); });
    var head = el("tr", null, [el("th", { text: "metric" })].concat(names.map(function (n) { return el("th", { text: n }); })));
    var rows = keys.map(function (k) {
      return el("tr", null, [el("td", { text: k })].concat(names.map(function (n) { return el("td", { text: fmt(tasks[n][k]) }); })));
    });
    return el("table", { id: "tasks" }, [head].concat(rows));
  }
  function kvTable(obj) {
    if (!obj) return el("p", { text: "-" });
    return el("table", null, Object.keys(obj).filter(function (k) { return k !== "examples"; }).map(function (k) {
      return el("tr", null, [el("th", { text: k }), el("td", { text: fmt(obj[k]) })]);
    }));
  }
  function filtered() {
    var out = EPS.filter(function (e) {
      if (state.task && e.task_type !== state.task) return false;
      if (state.err === "__any") return e.errors.length > 0;
      if (state.err === "__none") return e.errors.length === 0;
      if (state.err) return e.errors.indexOf(state.err) >= 0;
      return true;
    });
    var key = state.sort, desc = key.charAt(0) === "-";
    if (desc) key = key.slice(1);
    if (key !== "i") out = out.slice().sort(function (a, b) {
      var x = a[key] == null ? -Infinity : a[key], y = b[key] == null ? -Infinity : b[key];
      return (x < y ? -1 : x > y ? 1 : a.i - b.i) * (desc ? -1 : 1);
    });
    return out;
  }
  function select(options, value, onchange) {
    var s = el("select", { onchange: function () { onchange(s.value); } }, options.map(function (o) {
      var opt = el("option", { value: o[0], text: o[1] }); if (o[0] === value) opt.selected = true; return opt;
    }));
    return s;
  }
  function runView() {
    clear();
    var m = DATA.meta;
    app.appendChild(el("h1", { text: "Rollout report" }));
    app.appendChild(el("div", { cls: "meta" }, [
      "source: " + m.source + " | model: " + fmt(m.model_path) + " | " + m.tokenizer + " | " + m.episodes + " episodes | built " + m.created
    ]));
    app.appendChild(el("h2", { text: "Per-task summary" }));
    app.appendChild(taskTable());
    if (DATA.drift) { app.appendChild(el("h2", { text: "Token exactness (summary.json)" })); app.appendChild(kvTable(DATA.drift)); }
    if (DATA.backend) { app.appendChild(el("h2", { text: "Backend" })); app.appendChild(kvTable(DATA.backend)); }
    if (DATA.reward) { app.appendChild(el("h2", { text: "Reward manager" })); app.appendChild(kvTable(DATA.reward)); }

    app.appendChild(el("h2", { text: "Episodes" }));
    var tasks = {}, errs = {};
    EPS.forEach(function (e) { tasks[e.task_type] = 1; e.errors.forEach(function (k) { errs[k] = (errs[k] || 0) + 1; }); });
    var controls = el("div", { cls: "controls" }, [
      el("label", { text: "task " }),
      select([["", "all"]].concat(Object.keys(tasks).sort().map(function (t) { return [t, t]; })), state.task,
        function (v) { state.task = v; state.page = 0; renderList(); }),
      el("label", { text: "errors " }),
      select([["", "all"], ["__any", "any error"], ["__none", "no error"]].concat(Object.keys(errs).sort().map(function (k) { return [k, k + " (" + errs[k] + ")"]; })),
        state.err, function (v) { state.err = v; state.page = 0; renderList(); }),
      el("label", { text: "sort " }),
      select([["i", "file order"], ["-reward", "reward high-low"], ["reward", "reward low-high"], ["-num_turns", "turns high-low"],
        ["num_turns", "turns low-high"], ["-n_tokens", "tokens high-low"]], state.sort,
        function (v) { state.sort = v; state.page = 0; renderList(); })
    ]);
    app.appendChild(controls);
    var list = el("div", { id: "list" });
    app.appendChild(list);
    function renderList() {
      while (list.firstChild) list.removeChild(list.firstChild);
      var rows = filtered(), pages = Math.max(1, Math.ceil(rows.length / PAGE));
      if (state.page >= pages) state.page = pages - 1;
      var start = state.page * PAGE, shown = rows.slice(start, start + PAGE);
      var nav = el("div", null, [
        el("button", { text: "< prev", onclick: function () { if (state.page > 0) { state.page--; renderList(); } } }),
        " page " + (state.page + 1) + " / " + pages + " (" + rows.length + " episodes) ",
        el("button", { text: "next >", onclick: function () { if (state.page < pages - 1) { state.page++; renderList(); } } })
      ]);
      list.appendChild(nav);
      var head = el("tr", null, ["#", "uid", "task", "sample", "reward", "score", "turns", "tokens", "trained", "finish", "errors", "exact"].map(function (h) { return el("th", { text: h }); }));
      var trs = shown.map(function (e) {
        var exact = e.drift ? (e.drift.ok ? "ok" : "DRIFT") : "-";
        return el("tr", { cls: "ep", onclick: function () { location.hash = "ep=" + e.i; } }, [
          el("td", { text: String(e.i) }), el("td", { text: fmt(e.uid) }), el("td", { text: fmt(e.task_type) }),
          el("td", { text: fmt(e.sample_id) }), el("td", { text: fmt(e.reward) }), el("td", { text: fmt(e.score) }),
          el("td", { text: fmt(e.num_turns) }), el("td", { text: String(e.n_tokens) }), el("td", { text: String(e.n_trained) }),
          el("td", { text: fmt(e.finish_reason) }), el("td", { cls: e.errors.length ? "bad" : "", text: e.errors.join(" ") }),
          el("td", { cls: exact === "DRIFT" ? "bad" : "good", text: exact })
        ]);
      });
      list.appendChild(el("table", { id: "episodes" }, [head].concat(trs)));
    }
    renderList();
  }

  // ---- episode view ----
  function tokText(id) {
    var s = VOCAB[String(id)];
    if (s === undefined) return "[" + id + "]";
    return s.replace(/\n/g, "\u21b5\n").replace(/\t/g, "\u2192\t");
  }
  function tokenSpan(id, cls, title) {
    var c = "tok " + cls + (SPECIAL[id] ? " special" : "") + (VOCAB[String(id)] === undefined ? " id" : "");
    return el("span", { cls: c, title: title, text: tokText(id) });
  }
  function episodeView(i) {
    var e = EPS[i];
    if (!e) { runView(); return; }
    clear();
    window.scrollTo(0, 0);
    app.appendChild(el("p", null, [el("button", { cls: "link", text: "\u2190 all episodes", onclick: function () { location.hash = ""; } })]));
    app.appendChild(el("h1", { text: "Episode " + e.i + ": " + fmt(e.uid) + " (sample " + fmt(e.sample_id) + ")" }));
    app.appendChild(el("table", null, [
      ["task", e.task_type], ["data source", e.data_source], ["ground truth", e.ground_truth], ["reward", e.reward],
      ["score", e.score], ["score extra", e.score_extra], ["turns", e.num_turns], ["finish", e.finish_reason],
      ["response tokens", e.n_tokens], ["trained (mask 1)", e.n_trained], ["metrics", e.metrics]
    ].map(function (r) { return el("tr", null, [el("th", { text: r[0] }), el("td", { text: fmt(r[1]) })]); })));

    // flags
    if (e.error) app.appendChild(el("div", { cls: "flag", text: "episode error: " + e.error.type + ": " + e.error.message }));
    if (e.score_error) app.appendChild(el("div", { cls: "flag", text: "score error: " + fmt(e.score_error.type) + ": " + fmt(e.score_error.message) }));
    e.errors.forEach(function (k) {
      if (k.indexOf("episode:") === 0 || k.indexOf("score:") === 0 || k === "drift") return;
      app.appendChild(el("div", { cls: "flag", text: k + " (metrics: " + fmt(e.metrics) + ")" }));
    });
    app.appendChild(el("h2", { text: "Token exactness" }));
    var d = e.drift;
    if (!d) app.appendChild(el("p", { text: "not checked (no tokenizer, or --no-drift)" }));
    else {
      app.appendChild(el("p", { cls: d.ok ? "good" : "bad", text: d.ok ? "ok: every injected span equals the template" : "DRIFT" }));
      (d.structure || []).forEach(function (s) { app.appendChild(el("div", { cls: "flag", text: "structure: " + s })); });
      (d.injected || []).forEach(function (m) {
        app.appendChild(el("div", { cls: "flag", text: "injected " + m.span + " differs at " + m.position + " (" + m.differing_tokens + " tokens): expected " + JSON.stringify(m.expected) + " got " + JSON.stringify(m.actual) }));
      });
      app.appendChild(el("div", { cls: "meta", text: "injected tokens " + fmt(d.injected_tokens) + ", rerender differing " + fmt(d.rerender_differing_tokens) + ", generated " + fmt(d.generated_tokens) + ", re-encode would change " + fmt(d.reencode_changed_tokens) }));
    }

    // conversation
    app.appendChild(el("h2", { text: "Conversation" }));
    e.messages.forEach(function (msg, k) {
      var role = msg.role, label = role;
      if (k >= e.n_prompt_messages && role !== "assistant") { label = role + " (injected)"; if (role === "user") role = "feedback"; }
      else if (k < e.n_prompt_messages) label = role + " (prompt)";
      var extra = {};
      Object.keys(msg).forEach(function (key) { if (key !== "role" && key !== "content") extra[key] = msg[key]; });
      var content = typeof msg.content === "string" ? msg.content : JSON.stringify(msg.content, null, 1);
      app.appendChild(el("div", { cls: "msg role-" + role }, [
        el("div", { cls: "role", text: "[" + k + "] " + label }),
        el("pre", { text: content }),
        Object.keys(extra).length ? el("pre", { cls: "meta", text: JSON.stringify(extra, null, 1) }) : null
      ]));
    });
    if (e.tools) app.appendChild(el("details", null, [el("summary", { text: "tools (" + e.tools.length + ")" }), el("pre", { cls: "box", text: JSON.stringify(e.tools, null, 1) })]));

    // tokens
    app.appendChild(el("h2", { text: "Tokens" }));
    app.appendChild(el("div", { cls: "legend" }, [
      el("span", { cls: "tok prompt", text: "prompt" }), el("span", { cls: "tok m1", text: "trained (mask 1)" }),
      el("span", { cls: "tok m0", text: "injected (mask 0)" }), el("span", { cls: "tok special", text: "special" }),
      el("span", { cls: "tok drift", text: "differs from template" }), el("span", { text: "hover: id, mask, logprob" })
    ]));
    var box = el("div", { cls: "tokens", id: "tokens" });
    var driftAt = {};
    if (d) (d.injected || []).forEach(function (m) { if (m.position >= 0) driftAt[m.position] = true; });
    var promptDrift = d && (d.injected || []).some(function (m) { return m.position === -1 || m.span === "prompt"; });
    box.appendChild(el("span", { cls: "turnmark", text: "prompt (" + e.prompt_ids.length + " tokens)" + (promptDrift ? " DIFFERS" : "") }));
    e.prompt_ids.forEach(function (id, p) { box.appendChild(tokenSpan(id, "prompt", "prompt #" + p + " id=" + id)); });
    var starts = {};
    e.turns.forEach(function (t, k) { starts[t.start] = (starts[t.start] || []).concat([[k, t]]); });
    var lp = e.response_logprobs || [];
    e.response_ids.forEach(function (id, p) {
      (starts[p] || []).forEach(function (kt) {
        var t = kt[1], s = "turn " + kt[0] + ": " + t.role + " [" + t.start + "," + t.end + ")";
        if (t.finish_reason) s += " finish=" + t.finish_reason;
        if (t.reward !== undefined && t.reward !== null) s += " reward=" + fmt(t.reward);
        box.appendChild(el("br")); box.appendChild(el("span", { cls: "turnmark", text: s }));
      });
      var mk = e.response_mask[p];
      var title = "#" + p + " id=" + id + " mask=" + mk + " logprob=" + (lp[p] === null || lp[p] === undefined ? "-" : lp[p]);
      box.appendChild(tokenSpan(id, (mk ? "m1" : "m0") + (driftAt[p] ? " drift" : ""), title));
    });
    app.appendChild(box);
  }

  function route() {
    var m = /^#ep=(\d+)$/.exec(location.hash);
    if (m) episodeView(parseInt(m[1], 10)); else runView();
  }
  window.addEventListener("hashchange", route);
  route();
})();
