// Rollout / training report (verl_agentic.inspect). Data: the JSON blob in #va-data (run tables,
// plots, one light row per episode) and one JSON element per episode (#va-ep-a-<i>, #va-ep-b-<i>)
// parsed when that episode is opened. All text goes through textContent / createTextNode: model
// output is never parsed as HTML. Plots are inline SVG built from the embedded plot specs.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("va-data").textContent);
  var CMP = DATA.compare || null;
  var PAGE = 100;
  var GAP_MARK = 0.5;  // |rollout - trainer logprob| above this is outlined in the token view
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var SVGNS = "http://www.w3.org/2000/svg";
  var app = document.getElementById("app");

  function makeRun(prefix, d, name) {
    var special = {};
    (d.special || []).forEach(function (i) { special[i] = true; });
    return { prefix: prefix, d: d, eps: d.episodes, vocab: d.vocab || {}, special: special, name: name,
      state: { task: "", err: "", step: "", sort: "i", page: 0 }, cache: {} };
  }
  var RUNS = { a: makeRun("a", DATA, CMP ? CMP.name_a : ""), b: CMP ? makeRun("b", CMP.run, CMP.name_b) : null };
  var cmpState = { task: "", show: "", sort: "k", page: 0 };
  var pairOf = { a: {}, b: {} };
  if (CMP) CMP.pairs.forEach(function (p) { pairOf.a[p.a] = p.k; pairOf.b[p.b] = p.k; });

  function details(R, i) {
    if (!(i in R.cache)) {
      var node = document.getElementById("va-ep-" + R.prefix + "-" + i);
      R.cache[i] = node ? JSON.parse(node.textContent) : null;
    }
    return R.cache[i];
  }
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
  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "-";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : (Math.abs(v) < 1e5 ? v.toFixed(3) : v.toPrecision(3));
    if (typeof v === "object") { var s = Object.keys(v).sort().map(function (k) { return k + ":" + fmt(v[k]); }).join(", "); return s || "-"; }
    return String(v);
  }
  function clear() { while (app.firstChild) app.removeChild(app.firstChild); }
  function go(hash) { return function () { location.hash = hash; }; }
  function runHash(R) { return R.prefix === "b" ? "#b" : (CMP ? "#run" : ""); }
  function epHash(R, i) { return (R.prefix === "b" ? "#b/ep=" : "#ep=") + i; }
  function select(options, value, onchange, name) {
    var s = el("select", { name: name, onchange: function () { onchange(s.value); } }, options.map(function (o) {
      var opt = el("option", { value: o[0], text: o[1] }); if (o[0] === value) opt.selected = true; return opt;
    }));
    return s;
  }
  function pager(state, total, rerender) {
    var pages = Math.max(1, Math.ceil(total / PAGE));
    if (state.page >= pages) state.page = pages - 1;
    return el("div", { cls: "pager" }, [
      el("button", { cls: "prev", text: "< prev", onclick: function () { if (state.page > 0) { state.page--; rerender(); } } }),
      el("span", { cls: "pageinfo", text: " page " + (state.page + 1) + " / " + pages + " (" + total + ") " }),
      el("button", { cls: "next", text: "next >", onclick: function () { if (state.page < pages - 1) { state.page++; rerender(); } } })
    ]);
  }
  function nav() {
    if (!CMP) return null;
    return el("div", { cls: "nav" }, [
      el("button", { cls: "link", text: "Comparison", onclick: go("#cmp") }), " | ",
      el("button", { cls: "link", text: "Run " + CMP.name_a, onclick: go("#run") }), " | ",
      el("button", { cls: "link", text: "Run " + CMP.name_b, onclick: go("#b") })
    ]);
  }
  function sortRows(rows, key, tiebreak) {
    var desc = key.charAt(0) === "-";
    if (desc) key = key.slice(1);
    if (key === tiebreak) return rows;
    return rows.slice().sort(function (a, b) {
      var x = a[key] == null ? -Infinity : a[key], y = b[key] == null ? -Infinity : b[key];
      return (x < y ? -1 : x > y ? 1 : a[tiebreak] - b[tiebreak]) * (desc ? -1 : 1);
    });
  }

  // ---- plots (inline SVG) ----
  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) { var pad = Math.abs(lo) * 0.1 || 1; if (lo === 0) hi = 1; else { lo -= pad; hi += pad; } }
    var raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw))), r = raw / mag;
    var step = (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag, ticks = [];
    for (var t = Math.floor(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(+t.toPrecision(12));
    if (ticks[ticks.length - 1] < hi) ticks.push(+(ticks[ticks.length - 1] + step).toPrecision(12));
    return ticks;
  }
  function tickText(v) {
    var a = Math.abs(v);
    return a >= 1e4 || (a > 0 && a < 1e-3) ? v.toExponential(1) : String(+v.toPrecision(4));
  }
  function drawPlot(p) {
    var W = 520, H = 250, L = 52, R = 12, T = 10, B = p.kind === "bar" ? 58 : 40;
    var s = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, "class": "chart", role: "img" });
    var ys = [];
    p.series.forEach(function (se) { se.y.forEach(function (v) { if (v !== null && v !== undefined) ys.push(v); }); });
    var ylo = Math.min.apply(null, ys.concat(p.kind === "bar" ? [0] : [])), yhi = Math.max.apply(null, ys.concat(p.kind === "bar" ? [0] : []));
    var yt = niceTicks(ylo, yhi, 5), y0 = yt[0], y1 = yt[yt.length - 1];
    function Y(v) { return T + (H - T - B) * (1 - (v - y0) / ((y1 - y0) || 1)); }
    yt.forEach(function (t) {
      s.appendChild(svg("line", { x1: L, x2: W - R, y1: Y(t), y2: Y(t), "class": "grid" }));
      s.appendChild(svg("text", { x: L - 4, y: Y(t) + 4, "text-anchor": "end", "class": "tick" }, tickText(t)));
    });
    if (p.kind === "line") {
      var xlo = Math.min.apply(null, p.x), xhi = Math.max.apply(null, p.x);
      var xt = niceTicks(xlo, xhi, Math.min(8, Math.max(1, p.x.length - 1))), x0 = xt[0], x1 = xt[xt.length - 1];
      var X = function (v) { return L + (W - L - R) * (v - x0) / ((x1 - x0) || 1); };
      xt.forEach(function (t) { s.appendChild(svg("text", { x: X(t), y: H - B + 16, "text-anchor": "middle", "class": "tick" }, tickText(t))); });
      p.series.forEach(function (se, k) {
        var color = PALETTE[k % PALETTE.length], pts = [];
        se.y.forEach(function (v, j) {
          if (v === null || v === undefined) { if (pts.length) { s.appendChild(svg("polyline", { points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 1.5 })); } pts = []; return; }
          pts.push(X(p.x[j]).toFixed(1) + "," + Y(v).toFixed(1));
        });
        if (pts.length) s.appendChild(svg("polyline", { points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 1.5 }));
        se.y.forEach(function (v, j) {
          if (v === null || v === undefined) return;
          var c = svg("circle", { cx: X(p.x[j]), cy: Y(v), r: 2.5, fill: color, "class": "pt" });
          c.appendChild(svg("title", {}, se.name + ": " + p.xlabel + " " + p.x[j] + " = " + fmt(v)));
          s.appendChild(c);
        });
      });
      (p.markers || []).forEach(function (m) {  // a monitor started firing at this step
        var g = svg("line", { x1: X(m.x), x2: X(m.x), y1: T, y2: H - B, "class": "marker", "data-step": m.x });
        g.appendChild(svg("title", {}, "monitor " + m.label + " fired at " + p.xlabel + " " + m.x));
        s.appendChild(g);
      });
    } else {
      var n = p.categories.length, slot = (W - L - R) / Math.max(1, n), bw = slot * 0.8 / Math.max(1, p.series.length);
      p.categories.forEach(function (c, j) {
        var cx = L + slot * (j + 0.5);
        var lab = svg("text", { x: cx, y: H - B + 14, "text-anchor": c.length > 4 ? "end" : "middle", "class": "tick" }, c);
        if (c.length > 4) lab.setAttribute("transform", "rotate(-30 " + cx + " " + (H - B + 14) + ")");
        s.appendChild(lab);
      });
      p.series.forEach(function (se, k) {
        se.y.forEach(function (v, j) {
          if (v === null || v === undefined) return;
          var x = L + slot * j + slot * 0.1 + bw * k, top = Y(Math.max(v, 0)), bot = Y(Math.min(v, 0));
          var r = svg("rect", { x: x, y: top, width: Math.max(1, bw - 1), height: Math.max(0.5, bot - top), fill: PALETTE[k % PALETTE.length], "class": "bar" });
          r.appendChild(svg("title", {}, se.name + " / " + p.categories[j] + ": " + fmt(v)));
          s.appendChild(r);
        });
      });
    }
    s.appendChild(svg("line", { x1: L, x2: L, y1: T, y2: H - B, "class": "axis" }));
    s.appendChild(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, "class": "axis" }));
    s.appendChild(svg("text", { x: L + (W - L - R) / 2, y: H - 4, "text-anchor": "middle", "class": "label" }, p.xlabel));
    s.appendChild(svg("text", { x: 12, y: T + (H - T - B) / 2, "text-anchor": "middle", "class": "label",
      transform: "rotate(-90 12 " + (T + (H - T - B) / 2) + ")" }, p.ylabel));
    return s;
  }
  function plotBox(p) {
    var legend = el("div", { cls: "plotlegend" }, p.series.map(function (se, k) {
      return el("span", null, [el("span", { cls: "swatch", style: "background:" + PALETTE[k % PALETTE.length] }),
        se.name + (se.source ? " (" + (se.source === "rollouts" ? "derived from rollouts/" : se.source) + ")" : "")]);
    }));
    return el("div", { cls: "plot", "data-plot": p.id }, [
      el("div", { cls: "plottitle" }, [p.title, p.png ? " " : null, p.png ? el("a", { href: p.png, text: "PNG" }) : null]),
      drawPlot(p), legend
    ]);
  }
  function plotsSection(plots) {
    var box = el("div", { cls: "plotsection" }), wrap = el("div", { cls: "plots" }), reasons = [], byReason = {};
    plots.forEach(function (p) {
      if (!p.missing) { wrap.appendChild(plotBox(p)); return; }
      if (!byReason[p.missing]) { byReason[p.missing] = []; reasons.push(p.missing); }
      byReason[p.missing].push(p);
    });
    box.appendChild(wrap);
    reasons.forEach(function (why) {  // plots without data: one line per reason, no empty axes
      var ps = byReason[why];
      box.appendChild(el("div", { cls: "nodata", "data-plot": ps.map(function (p) { return p.id; }).join(" "),
        text: ps.map(function (p) { return p.title; }).join(", ") + ": no data: " + why }));
    });
    return box;
  }

  // ---- run view ----
  function taskTable(tasks) {
    var names = Object.keys(tasks || {}), keys = [];
    if (!names.length) return el("p", { text: "no episodes" });
    names.forEach(function (n) { Object.keys(tasks[n]).forEach(function (k) { if (keys.indexOf(k) < 0) keys.push(k); }); });
    var head = el("tr", null, [el("th", { text: "metric" })].concat(names.map(function (n) { return el("th", { text: n }); })));
    var rows = keys.map(function (k) {
      return el("tr", null, [el("td", { text: k })].concat(names.map(function (n) { return el("td", { text: fmt(tasks[n][k]) }); })));
    });
    return el("table", { cls: "tasks" }, [head].concat(rows));
  }
  function kvTable(obj) {
    if (!obj) return el("p", { text: "-" });
    return el("table", null, Object.keys(obj).filter(function (k) { return k !== "examples"; }).map(function (k) {
      return el("tr", null, [el("th", { text: k }), el("td", { text: fmt(obj[k]) })]);
    }));
  }
  function filtered(R) {
    var st = R.state, step = st.step === "" ? null : parseInt(st.step, 10);
    var out = R.eps.filter(function (e) {
      if (st.task && e.task_type !== st.task) return false;
      if (step !== null && e.step !== step) return false;
      if (st.err === "__any") return e.errors.length > 0;
      if (st.err === "__none") return e.errors.length === 0;
      if (st.err) return e.errors.indexOf(st.err) >= 0;
      return true;
    });
    return sortRows(out, st.sort, "i");
  }
  function runView(R) {
    clear();
    var m = R.d.meta, st = R.state, training = m.kind === "training";
    if (CMP) app.appendChild(nav());
    app.appendChild(el("h1", { text: (training ? "Training run report" : "Rollout report") + (R.name ? " (" + R.name + ")" : "") }));
    app.appendChild(el("div", { cls: "meta" }, [
      "source: " + m.source + " | model: " + fmt(m.model_path) + " | " + m.tokenizer + " | " + m.episodes + " episodes" +
      (training ? " in " + m.steps.length + " steps" : "") + " | built " + m.created
    ]));
    app.appendChild(el("h2", { text: "Per-task summary" + (m.tasks_note ? " (" + m.tasks_note + ")" : "") }));
    app.appendChild(taskTable(R.d.tasks));
    app.appendChild(el("h2", { text: "Plots" }));
    app.appendChild(plotsSection(R.d.plots || []));
    if (R.d.drift) { app.appendChild(el("h2", { text: "Token exactness (summary.json)" })); app.appendChild(kvTable(R.d.drift)); }
    if (R.d.backend) { app.appendChild(el("h2", { text: "Backend" })); app.appendChild(kvTable(R.d.backend)); }
    if (R.d.reward) { app.appendChild(el("h2", { text: "Reward manager" })); app.appendChild(kvTable(R.d.reward)); }

    app.appendChild(el("h2", { text: "Episodes" }));
    var tasks = {}, errs = {};
    R.eps.forEach(function (e) { tasks[e.task_type] = 1; e.errors.forEach(function (k) { errs[k] = (errs[k] || 0) + 1; }); });
    function reset(key) { return function (v) { st[key] = v; st.page = 0; renderList(); }; }
    var sorts = [["i", "file order"], ["-reward", "reward high-low"], ["reward", "reward low-high"], ["-num_turns", "turns high-low"],
      ["num_turns", "turns low-high"], ["-n_tokens", "tokens high-low"]];
    if (training) sorts.push(["step", "step"], ["-gap", "logprob gap high-low"]);
    app.appendChild(el("div", { cls: "controls" }, [
      el("label", { text: "task " }),
      select([["", "all"]].concat(Object.keys(tasks).sort().map(function (t) { return [t, t]; })), st.task, reset("task"), "task"),
      training ? el("label", { text: "step " }) : null,
      training ? select([["", "all"]].concat(m.steps.map(function (s) { return [String(s), String(s)]; })), st.step, reset("step"), "step") : null,
      el("label", { text: "errors " }),
      select([["", "all"], ["__any", "any error"], ["__none", "no error"]].concat(Object.keys(errs).sort().map(function (k) { return [k, k + " (" + errs[k] + ")"]; })),
        st.err, reset("err"), "errors"),
      el("label", { text: "sort " }),
      select(sorts, st.sort, reset("sort"), "sort")
    ]));
    var list = el("div", { id: "list" });
    app.appendChild(list);
    function renderList() {
      while (list.firstChild) list.removeChild(list.firstChild);
      var rows = filtered(R);
      list.appendChild(pager(st, rows.length, renderList));
      var shown = rows.slice(st.page * PAGE, st.page * PAGE + PAGE);
      var cols = ["#"].concat(training ? ["step"] : [], ["uid", "task", "sample", "reward", "score", "acc", "turns", "tokens", "trained", "finish", "errors", "exact"], training ? ["gap"] : []);
      var head = el("tr", null, cols.map(function (h) { return el("th", { text: h }); }));
      var trs = shown.map(function (e) {
        var exact = e.exact === null ? "-" : (e.exact ? "ok" : "DRIFT");
        return el("tr", { cls: "ep", "data-i": e.i, onclick: go(epHash(R, e.i)) }, [el("td", { text: String(e.i) })].concat(
          training ? [el("td", { text: fmt(e.step) })] : [],
          [el("td", { text: fmt(e.uid) }), el("td", { text: fmt(e.task_type) }),
            el("td", { text: fmt(e.sample_id) }), el("td", { text: fmt(e.reward) }), el("td", { text: fmt(e.score) }),
            el("td", { text: fmt(e.acc) }), el("td", { text: fmt(e.num_turns) }), el("td", { text: String(e.n_tokens) }),
            el("td", { text: String(e.n_trained) }), el("td", { text: fmt(e.finish_reason) }),
            el("td", { cls: e.errors.length ? "bad" : "", text: e.errors.join(" ") }),
            el("td", { cls: exact === "DRIFT" ? "bad" : "good", text: exact })],
          training ? [el("td", { text: fmt(e.gap) })] : []));
      });
      list.appendChild(el("table", { id: "episodes" }, [head].concat(trs)));
    }
    renderList();
  }

  // ---- episode view ----
  function tokText(R, id) {
    var s = R.vocab[String(id)];
    if (s === undefined) return "[" + id + "]";
    return s.replace(/\n/g, "\u21b5\n").replace(/\t/g, "\u2192\t");
  }
  function tokenSpan(R, id, cls, title) {
    var c = "tok " + cls + (R.special[id] ? " special" : "") + (R.vocab[String(id)] === undefined ? " id" : "");
    return el("span", { cls: c, title: title, text: tokText(R, id) });
  }
  function conversation(det) {
    var box = el("div", { cls: "conversation" });
    det.messages.forEach(function (msg, k) {
      var role = msg.role, label = role;
      if (k >= det.n_prompt_messages && role !== "assistant") { label = role + " (injected)"; if (role === "user") role = "feedback"; }
      else if (k < det.n_prompt_messages) label = role + " (prompt)";
      var extra = {};
      Object.keys(msg).forEach(function (key) { if (key !== "role" && key !== "content") extra[key] = msg[key]; });
      var content = typeof msg.content === "string" ? msg.content : JSON.stringify(msg.content, null, 1);
      box.appendChild(el("div", { cls: "msg role-" + role }, [
        el("div", { cls: "role", text: "[" + k + "] " + label }),
        el("pre", { text: content }),
        Object.keys(extra).length ? el("pre", { cls: "meta", text: JSON.stringify(extra, null, 1) }) : null
      ]));
    });
    return box;
  }
  function episodeView(R, i) {
    var e = R.eps[i], det = e ? details(R, i) : null;
    if (!det) { runView(R); return; }
    clear();
    window.scrollTo(0, 0);
    if (CMP) app.appendChild(nav());
    var back = [el("button", { cls: "link", id: "back", text: "\u2190 all episodes", onclick: go(runHash(R)) })];
    var pk = CMP ? pairOf[R.prefix][i] : undefined;
    if (pk !== undefined) back.push(" | ", el("button", { cls: "link", text: "side by side with the other run", onclick: go("#pair=" + pk) }));
    app.appendChild(el("p", null, back));
    app.appendChild(el("h1", { text: (R.name ? R.name + ": " : "") + "Episode " + e.i + ": " + fmt(e.uid) + " (sample " + fmt(e.sample_id) + ")" +
      (e.step !== null && e.step !== undefined ? " step " + e.step : "") }));
    app.appendChild(el("table", { id: "epstats" }, [
      ["task", e.task_type], ["data source", det.data_source], ["ground truth", det.ground_truth], ["reward", e.reward],
      ["score", e.score], ["score extra", det.score_extra], ["accuracy", e.acc], ["turns", e.num_turns], ["finish", e.finish_reason],
      ["response tokens", e.n_tokens], ["trained (mask 1)", e.n_trained], ["logprob gap (mean, trained tokens)", e.gap], ["metrics", det.metrics]
    ].map(function (r) { return el("tr", null, [el("th", { text: r[0] }), el("td", { text: fmt(r[1]) })]); })));

    if (det.error) app.appendChild(el("div", { cls: "flag", text: "episode error: " + det.error.type + ": " + det.error.message }));
    if (det.score_error) app.appendChild(el("div", { cls: "flag", text: "score error: " + fmt(det.score_error.type) + ": " + fmt(det.score_error.message) }));
    e.errors.forEach(function (k) {
      if (k.indexOf("episode:") === 0 || k.indexOf("score:") === 0 || k === "drift") return;
      app.appendChild(el("div", { cls: "flag", text: k + " (metrics: " + fmt(det.metrics) + ")" }));
    });
    app.appendChild(el("h2", { text: "Token exactness" }));
    var d = det.drift;
    if (!d) app.appendChild(el("p", { id: "exactness", text: "not checked (no tokenizer, or --no-drift)" }));
    else {
      app.appendChild(el("p", { id: "exactness", cls: d.ok ? "good" : "bad", text: d.ok ? "ok: every injected span equals the template" : "DRIFT" }));
      (d.structure || []).forEach(function (s) { app.appendChild(el("div", { cls: "flag", text: "structure: " + s })); });
      (d.injected || []).forEach(function (m) {
        app.appendChild(el("div", { cls: "flag", text: "injected " + m.span + " differs at " + m.position + " (" + m.differing_tokens + " tokens): expected " + JSON.stringify(m.expected) + " got " + JSON.stringify(m.actual) }));
      });
      app.appendChild(el("div", { cls: "meta", text: "injected tokens " + fmt(d.injected_tokens) + ", rerender differing " + fmt(d.rerender_differing_tokens) + ", generated " + fmt(d.generated_tokens) + ", re-encode would change " + fmt(d.reencode_changed_tokens) }));
    }

    app.appendChild(el("h2", { text: "Conversation" }));
    app.appendChild(conversation(det));
    if (det.tools) app.appendChild(el("details", null, [el("summary", { text: "tools (" + det.tools.length + ")" }), el("pre", { cls: "box", text: JSON.stringify(det.tools, null, 1) })]));

    app.appendChild(el("h2", { text: "Tokens" }));
    var tl = det.trainer_logprobs;
    app.appendChild(el("div", { cls: "legend" }, [
      el("span", { cls: "tok prompt", text: "prompt" }), el("span", { cls: "tok m1", text: "trained (mask 1)" }),
      el("span", { cls: "tok m0", text: "injected (mask 0)" }), el("span", { cls: "tok special", text: "special" }),
      el("span", { cls: "tok drift", text: "differs from template" }),
      tl ? el("span", { cls: "tok m1 gap", text: "|rollout - trainer logprob| > " + GAP_MARK }) : null,
      el("span", { text: "hover: id, mask, logprob" + (tl ? ", trainer logprob" : "") })
    ]));
    var box = el("div", { cls: "tokens", id: "tokens" });
    var driftAt = {};
    if (d) (d.injected || []).forEach(function (m) { if (m.position >= 0) driftAt[m.position] = true; });
    var promptDrift = d && (d.injected || []).some(function (m) { return m.position === -1 || m.span === "prompt"; });
    box.appendChild(el("span", { cls: "turnmark", text: "prompt (" + det.prompt_ids.length + " tokens)" + (promptDrift ? " DIFFERS" : "") }));
    det.prompt_ids.forEach(function (id, p) { box.appendChild(tokenSpan(R, id, "prompt", "prompt #" + p + " id=" + id)); });
    var starts = {};
    det.turns.forEach(function (t, k) { starts[t.start] = (starts[t.start] || []).concat([[k, t]]); });
    var lp = det.logprobs || [];
    det.response_ids.forEach(function (id, p) {
      (starts[p] || []).forEach(function (kt) {
        var t = kt[1], s = "turn " + kt[0] + ": " + t.role + " [" + t.start + "," + t.end + ")";
        if (t.finish_reason) s += " finish=" + t.finish_reason;
        if (t.reward !== undefined && t.reward !== null) s += " reward=" + fmt(t.reward);
        var bad = false, info = t.info || {};
        if (info.tool_calls) {
          s += " tools: " + info.tool_calls.map(function (c) { if (c.status !== "ok") bad = true; return c.name + "=" + c.status; }).join(", ");
        }
        if (info.parse_errors) { bad = true; s += " unparsed calls=" + info.parse_errors; }
        box.appendChild(el("br")); box.appendChild(el("span", { cls: "turnmark" + (bad ? " turnerr" : ""), text: s }));
      });
      var mk = det.mask.charAt(p) === "1", cls = mk ? "m1" : "m0";
      var title = "#" + p + " id=" + id + " mask=" + (mk ? 1 : 0) + " logprob=" + (lp[p] === null || lp[p] === undefined ? "-" : lp[p]);
      if (tl && tl[p] !== null && tl[p] !== undefined) {
        title += " trainer=" + tl[p];
        if (lp[p] !== null && lp[p] !== undefined) {
          var gap = Math.abs(lp[p] - tl[p]);
          title += " gap=" + gap.toFixed(3);
          if (gap > GAP_MARK) cls += " gap";
        }
      }
      box.appendChild(tokenSpan(R, id, cls + (driftAt[p] ? " drift" : ""), title));
    });
    app.appendChild(box);
  }

  // ---- comparison view ----
  function pairRows() {
    var st = cmpState;
    var out = CMP.pairs.filter(function (p) {
      if (st.task && p.task_type !== st.task) return false;
      if (st.show === "changed") return p.delta !== 0;
      if (st.show === "b_better") return p.delta > 0;
      if (st.show === "a_better") return p.delta < 0;
      if (st.show === "prompt_differs") return !p.same_prompt;
      return true;
    });
    return sortRows(out, st.sort, "k");
  }
  function compareView() {
    clear();
    var c = CMP.counts, st = cmpState, A = RUNS.a.d.meta, B = RUNS.b.d.meta;
    if (CMP) app.appendChild(nav());
    app.appendChild(el("h1", { text: "Comparison: " + CMP.name_a + " vs " + CMP.name_b }));
    app.appendChild(el("div", { cls: "meta" }, ["A: " + A.source + " (" + A.episodes + " episodes) | B: " + B.source + " (" + B.episodes + " episodes)"]));
    app.appendChild(el("p", { id: "paircounts", text: c.pairs + " pairs (" + c.by_id + " by uid/sample" + (CMP.with_step ? "/step" : "") + ", " + c.by_prompt +
      " by prompt ids); only in A: " + c.only_a + ", only in B: " + c.only_b + "; prompt differs in " + c.prompt_differs + " pairs" }));
    app.appendChild(el("p", { text: "reward: B higher in " + c.b_better + ", A higher in " + c.a_better + ", equal in " + c.same_reward +
      "; accuracy: wrong in A and right in B " + c.wrong_a_right_b + ", right in A and wrong in B " + c.right_a_wrong_b }));
    app.appendChild(el("h2", { text: "Metric deltas per task (over all episodes of each run)" }));
    app.appendChild(el("table", { id: "deltas" }, [el("tr", null, ["task", "metric", "A", "B", "B - A"].map(function (h) { return el("th", { text: h }); }))].concat(
      CMP.deltas.map(function (r) {
        return el("tr", null, [el("td", { text: r.task }), el("td", { text: r.metric }), el("td", { text: fmt(r.a) }), el("td", { text: fmt(r.b) }),
          el("td", { cls: r.better * r.delta > 0 ? "up" : r.better * r.delta < 0 ? "down" : "", text: (r.delta > 0 ? "+" : "") + fmt(r.delta) })]);
      }))));
    app.appendChild(el("h2", { text: "Plots" }));
    app.appendChild(plotsSection(CMP.plots));
    app.appendChild(el("h2", { text: "Same prompts" }));
    var tasks = {};
    CMP.pairs.forEach(function (p) { tasks[p.task_type] = 1; });
    function reset(key) { return function (v) { st[key] = v; st.page = 0; renderPairs(); }; }
    app.appendChild(el("div", { cls: "controls" }, [
      el("label", { text: "task " }),
      select([["", "all"]].concat(Object.keys(tasks).sort().map(function (t) { return [t, t]; })), st.task, reset("task"), "task"),
      el("label", { text: "show " }),
      select([["", "all pairs"], ["changed", "reward differs"], ["b_better", "B higher"], ["a_better", "A higher"], ["prompt_differs", "prompt differs"]],
        st.show, reset("show"), "show"),
      el("label", { text: "sort " }),
      select([["k", "file order"], ["-delta", "B - A high-low"], ["delta", "B - A low-high"]], st.sort, reset("sort"), "sort")
    ]));
    var list = el("div", { id: "pairlist" });
    app.appendChild(list);
    function renderPairs() {
      while (list.firstChild) list.removeChild(list.firstChild);
      var rows = pairRows();
      list.appendChild(pager(st, rows.length, renderPairs));
      var cols = ["#", "uid", "sample"].concat(CMP.with_step ? ["step"] : [], ["task", "reward A", "reward B", "B - A", "acc A", "acc B", "turns A", "turns B", "matched by"]);
      var trs = rows.slice(st.page * PAGE, st.page * PAGE + PAGE).map(function (p) {
        return el("tr", { cls: "pair" + (p.same_prompt ? "" : " differs"), "data-k": p.k, onclick: go("#pair=" + p.k) }, [
          el("td", { text: String(p.k) }), el("td", { text: fmt(p.uid) }), el("td", { text: fmt(p.sample_id) })].concat(
          CMP.with_step ? [el("td", { text: fmt(p.step) })] : [],
          [el("td", { text: fmt(p.task_type) }), el("td", { text: fmt(p.reward_a) }), el("td", { text: fmt(p.reward_b) }),
            el("td", { cls: p.delta > 0 ? "up" : p.delta < 0 ? "down" : "", text: fmt(p.delta) }),
            el("td", { text: fmt(p.acc_a) }), el("td", { text: fmt(p.acc_b) }), el("td", { text: fmt(p.turns_a) }), el("td", { text: fmt(p.turns_b) }),
            el("td", { text: p.by + (p.same_prompt ? "" : " (prompt differs)") })]));
      });
      list.appendChild(el("table", { id: "pairs" }, [el("tr", null, cols.map(function (h) { return el("th", { text: h }); }))].concat(trs)));
    }
    renderPairs();
  }
  function pairSide(R, i) {
    var e = R.eps[i], det = details(R, i);
    return el("div", { cls: "side side-" + R.prefix }, [
      el("h2", null, [R.name + ": episode " + i + " ", el("button", { cls: "link", text: "tokens \u2192", onclick: go(epHash(R, i)) })]),
      el("table", null, [["reward", e.reward], ["score", e.score], ["accuracy", e.acc], ["turns", e.num_turns], ["finish", e.finish_reason],
        ["response tokens", e.n_tokens], ["errors", e.errors.join(" ") || "-"]].map(function (r) {
        return el("tr", null, [el("th", { text: r[0] }), el("td", { text: fmt(r[1]) })]);
      })),
      conversation(det)
    ]);
  }
  function pairView(k) {
    var p = CMP.pairs[k];
    if (!p) { compareView(); return; }
    clear();
    window.scrollTo(0, 0);
    if (CMP) app.appendChild(nav());
    app.appendChild(el("p", null, [el("button", { cls: "link", id: "back", text: "\u2190 all pairs", onclick: go("#cmp") })]));
    app.appendChild(el("h1", { text: "Pair " + k + ": " + fmt(p.uid) + " (sample " + fmt(p.sample_id) + ")" + (p.step !== null ? " step " + p.step : "") +
      ", reward " + fmt(p.reward_a) + " vs " + fmt(p.reward_b) }));
    if (!p.same_prompt) app.appendChild(el("div", { cls: "flag", text: "the prompt messages differ between the runs (matched by " + p.by + ")" }));
    app.appendChild(el("div", { cls: "sidebyside" }, [pairSide(RUNS.a, p.a), pairSide(RUNS.b, p.b)]));
  }

  function route() {
    var h = location.hash, m;
    if ((m = /^#ep=(\d+)$/.exec(h))) episodeView(RUNS.a, parseInt(m[1], 10));
    else if (CMP && (m = /^#b\/ep=(\d+)$/.exec(h))) episodeView(RUNS.b, parseInt(m[1], 10));
    else if (CMP && (m = /^#pair=(\d+)$/.exec(h))) pairView(parseInt(m[1], 10));
    else if (CMP && h === "#b") runView(RUNS.b);
    else if (CMP && h !== "#run") compareView();
    else runView(RUNS.a);
  }
  window.addEventListener("hashchange", route);
  route();
  if (window.performance && performance.mark) performance.mark("va-rendered");  // first view drawn (bench/inspect_open.py)
})();
