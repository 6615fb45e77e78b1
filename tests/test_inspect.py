"""``python -m verl_agentic.inspect``: the static HTML report of a real rollout output dir."""

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from va_testing import REPO

HOSTILE = ('</script><script>alert(1)</script><img src=x onerror="alert(2)">'
           "&amp; <!-- \u2028\u2029 <SCRIPT>alert(3)</SCRIPT> '\"")


@pytest.fixture(scope="module")
def run_dir(tiny_qwen_dir, tmp_path_factory):
    """A real main_rollout output dir: tiny Qwen2 model, 2 gsm8k samples, feedback turns."""
    from verl_agentic.main_rollout import load_config, run

    out = tmp_path_factory.mktemp("run")
    run(load_config([f"model.path={tiny_qwen_dir}", "data.max_samples=2", "rollout.max_new_tokens=8",
                     "rollout.max_turns=2", "task.gsm8k.feedback=always_verify", "output.quiet=true",
                     f"output.dir={out}"]))
    assert (out / "trajectories.jsonl").exists() and (out / "summary.json").exists()
    return out


def _trajs(d):
    return [json.loads(line) for line in (d / "trajectories.jsonl").read_text().splitlines() if line.strip()]


def _no_constant(name):
    raise AssertionError(f"{name} is not valid JSON")


def _blob(html_text):
    m = re.search(r'<script type="application/json" id="va-data">(.*?)</script>', html_text, re.S)
    assert m, "data blob missing"
    return json.loads(m.group(1), parse_constant=_no_constant)  # strict, like JSON.parse


def _details(html_text):
    """{i: details} from the per-episode elements (parsed by the page only when the episode is opened)."""
    found = re.findall(r'<script type="application/json" id="va-ep-a-(\d+)">(.*?)</script>', html_text, re.S)
    return {int(i): json.loads(s, parse_constant=_no_constant) for i, s in found}


def _scripts_ok(html_text, n_episodes):
    """Every script element is the page's code or a JSON data element: one blob plus one per episode."""
    opened = re.findall(r"<script[^>]*>", html_text, re.I)
    assert html_text.count("</script>") == len(opened) == 2 + n_episodes
    assert opened.count("<script>") == 1
    data_tag = re.compile(r'<script type="application/json" id="va-(data|ep-a-\d+)">')
    assert all(data_tag.fullmatch(o) for o in opened if o != "<script>")


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "verl_agentic.inspect", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout)


def test_cli_report_matches_trajectories(run_dir, tmp_path, tiny_qwen_dir):
    from transformers import AutoTokenizer

    from verl_agentic.rollout.trajectory import check_drift

    r = _cli(run_dir, "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    index = tmp_path / "rep" / "index.html"
    assert index.exists() and str(index.resolve()) in r.stdout.strip().splitlines()[-1]
    html_text = index.read_text(encoding="utf-8")
    # self-contained: nothing loaded from the network, no external files
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html_text, re.I)
    assert not re.search(r"<link\b|<script[^>]*\bsrc=|@import|url\(", html_text, re.I)
    trajs = _trajs(run_dir)
    _scripts_ok(html_text, len(trajs))
    data, details = _blob(html_text), _details(html_text)
    tok = AutoTokenizer.from_pretrained(str(tiny_qwen_dir))
    assert len(data["episodes"]) == len(details) == len(trajs) == 2
    assert any(t["role"] != "assistant" for tr in trajs for t in tr["turns"])  # there are injected turns
    for e, t in zip(data["episodes"], trajs):
        d = details[e["i"]]
        assert e["uid"] == t["uid"] and e["n_tokens"] == len(t["response_ids"]) == len(d["response_ids"])
        assert e["n_trained"] == sum(t["response_mask"]) == d["mask"].count("1")
        assert d["mask"] == "".join(str(m) for m in t["response_mask"])
        assert 0 < e["n_trained"] < e["n_tokens"]  # trained and injected tokens both present
        assert d["response_ids"] == t["response_ids"] and d["prompt_ids"] == t["prompt_ids"]
        assert d["turns"] == [{k: v for k, v in x.items() if k != "text"} for x in t["turns"]]
        assert d["messages"] == t["messages"]
        assert d["logprobs"] == [None if x is None else round(x, 3) for x in t["response_logprobs"]]
        want = check_drift(t, tok, {}, [tok.convert_tokens_to_ids("<|im_end|>")]).as_dict()
        assert d["drift"] == want and d["drift"]["ok"] and e["exact"] is True
        for i in t["prompt_ids"] + t["response_ids"]:
            assert data["vocab"][str(i)] == tok.decode([i], skip_special_tokens=False)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert data["vocab"][str(im_end)] == "<|im_end|>" and im_end in data["special"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert data["tasks"] == summary["tasks"] and data["meta"]["drift_checked"]


def test_hostile_text_is_escaped(run_dir, tmp_path):
    from verl_agentic.inspect import write_report

    d = tmp_path / "hostile"
    d.mkdir()
    shutil.copy(run_dir / "summary.json", d / "summary.json")
    trajs = _trajs(run_dir)
    t = trajs[0]
    k = next(i for i, m in enumerate(t["messages"]) if m["role"] == "assistant")
    t["messages"][k]["content"] = HOSTILE
    t["turns"][0]["text"] = HOSTILE
    t["error"] = {"type": "hostile<b>", "message": HOSTILE}
    t["uid"] = HOSTILE
    j = t["response_mask"].index(1)
    t["response_logprobs"][j] = float("-inf")  # written as -Infinity: not valid for JSON.parse
    (d / "trajectories.jsonl").write_text("".join(json.dumps(x) + "\n" for x in trajs))
    html_text = write_report(d).read_text(encoding="utf-8")
    assert "<script>alert" not in html_text.lower() and "<img" not in html_text.lower()
    assert "\u2028" not in html_text and "\u2029" not in html_text and "<!--" not in html_text
    _scripts_ok(html_text, len(trajs))
    data, details = _blob(html_text), _details(html_text)
    e, det = data["episodes"][0], details[0]
    assert det["messages"][k]["content"] == HOSTILE and det["logprobs"][j] is None
    assert det["error"]["message"] == HOSTILE and e["uid"] == HOSTILE and "episode:hostile<b>" in e["errors"]
    # the page's JS never parses data as HTML
    js = (REPO / "verl_agentic" / "inspect" / "static" / "report.js").read_text()
    assert "innerHTML" not in js and "insertAdjacentHTML" not in js and "document.write" not in js


def test_no_tokenizer_falls_back_to_ids(run_dir, tmp_path):
    from verl_agentic.inspect import write_report

    index = write_report(run_dir, tmp_path / "rep", tokenizer_path=str(tmp_path / "no_such_model"))
    html_text = index.read_text(encoding="utf-8")
    data = _blob(html_text)
    assert data["vocab"] == {} and all(e["exact"] is None for e in data["episodes"])
    assert all(d["drift"] is None for d in _details(html_text).values())
    assert "token ids shown" in data["meta"]["tokenizer"]
    assert [e["n_tokens"] for e in data["episodes"]] == [len(t["response_ids"]) for t in _trajs(run_dir)]


def test_missing_dir_is_one_clear_line(tmp_path):
    r = _cli(tmp_path / "nothing")
    assert r.returncode == 2 and "trajectories.jsonl" in r.stderr and "Traceback" not in r.stderr


def test_an_old_runs_stop_ids_are_read_from_the_model_folder_as_the_hf_backend_reads_them(tmp_path):
    """A summary.json without ``stop_token_ids``: the model's configs give them, in the one reading of
    ``eos_token_id`` (int, list or null; in order, once each) that the backends use too."""
    from verl_agentic.backends.base import eos_ids
    from verl_agentic.inspect.report import stop_token_ids_of

    assert eos_ids(7, [9, 7], None, 3) == [7, 9, 3]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 2]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert stop_token_ids_of(tmp_path) == [5, 2]
    (tmp_path / "generation_config.json").write_text("{not json")  # skipped, as a missing one is
    assert stop_token_ids_of(tmp_path) == [2] and stop_token_ids_of(None) == []


def test_serve(run_dir, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "verl_agentic.inspect", str(run_dir), "--out", str(tmp_path / "rep"),
                          "--serve", "--port", "0", "--no-drift",
                          "--tokenizer", str(tmp_path / "none")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=REPO)
    try:
        url = None
        for _ in range(5):
            line = p.stdout.readline()
            m = re.search(r"(http://127\.0\.0\.1:\d+/index\.html)", line)
            if m:
                url = m.group(1)
                break
        assert url, p.stderr.read() if p.poll() is not None else "no URL printed"
        body = urllib.request.urlopen(url, timeout=10).read().decode("utf-8")
        assert body == (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_10k_episodes_build_in_bounded_time(run_dir, tmp_path):
    from verl_agentic.inspect import write_report

    base = _trajs(run_dir)
    d = tmp_path / "big"
    d.mkdir()
    shutil.copy(run_dir / "summary.json", d / "summary.json")
    n = 10_000
    with open(d / "trajectories.jsonl", "w") as f:
        for i in range(n):
            t = dict(base[i % len(base)])
            t.update(uid=f"gsm8k-{i}", index=i, sample_id=0, reward=float(i % 3 == 0),
                     error={"type": "timeout", "message": "x"} if i % 97 == 0 else None)
            f.write(json.dumps(t) + "\n")
    t0 = time.perf_counter()
    index = write_report(d)
    dt = time.perf_counter() - t0
    size = index.stat().st_size
    print(f"\n10k-episode report: built in {dt:.1f}s, {size / 1e6:.1f} MB")
    data = _blob(index.read_text(encoding="utf-8"))
    assert len(data["episodes"]) == n and sum("episode:timeout" in e["errors"] for e in data["episodes"]) == 104
    assert dt < 60
    assert size < 200e6


NODE = shutil.which("node")
# A minimal DOM for running the page's script under node: records every element and text node.
DOM_SHIM = r"""
const fs = require("fs");
const html = fs.readFileSync(process.argv[2], "utf8");
const code = /<script>\n([\s\S]*?)\n<\/script>/.exec(html)[1];
const created = [];
function Node(tag) { this.tagName = tag; this.children = []; this._text = ""; this.attrs = {}; created.push(this); }
Node.prototype.appendChild = function (c) { this.children.push(c); return c; };
Node.prototype.removeChild = function (c) { this.children.splice(this.children.indexOf(c), 1); return c; };
Object.defineProperty(Node.prototype, "firstChild", { get() { return this.children[0] || null; } });
Object.defineProperty(Node.prototype, "textContent", {
  get() { return this.tagName === "#text" ? this._text : this._text + this.children.map(c => c.textContent).join(""); },
  set(v) { this._text = String(v); this.children = []; } });
Object.defineProperty(Node.prototype, "innerHTML", { set(v) { throw new Error("innerHTML used"); } });
Node.prototype.setAttribute = function (k, v) { this.attrs[k] = String(v); };
const app = new Node("div"), scripts = {}, re = /<script type="application\/json" id="([^"]+)">([\s\S]*?)<\/script>/g;
for (let m; (m = re.exec(html));) { const n = new Node("script"); n._text = m[2]; scripts[m[1]] = n; }
global.document = { getElementById: id => id === "app" ? app : scripts[id] || null,
  createElement: t => new Node(t), createElementNS: (ns, t) => new Node(t),
  createTextNode: s => { const n = new Node("#text"); n._text = s; return n; } };
global.location = { hash: process.argv[3] || "" };
global.window = { addEventListener() {}, scrollTo() {} };
eval(code);
const tags = {}; created.forEach(n => { tags[n.tagName] = (tags[n.tagName] || 0) + 1; });
const rows = created.filter(n => n.tagName === "tr" && n.className === "ep").length;
const toks = created.filter(n => n.tagName === "span" && /^tok /.test(n.className || "") && n.attrs.title).length;
const text = created.filter(n => n.tagName === "pre").map(n => n.textContent);
const nscripts = Object.keys(scripts).length;
const markers = created.filter(n => n.tagName === "line" && n.attrs.class === "marker").map(n => Number(n.attrs["data-step"]));
console.log(JSON.stringify({ tags, rows, toks, text, nscripts, markers, all: app.textContent }));
"""


def _run_page(index, tmp_path, hash_=""):
    shim = tmp_path / "shim.js"
    shim.write_text(DOM_SHIM)
    r = subprocess.run([NODE, str(shim), str(index), hash_], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_page_script_renders_views_as_text(run_dir, tmp_path):
    from verl_agentic.inspect import write_report

    d = tmp_path / "hostile"
    d.mkdir()
    shutil.copy(run_dir / "summary.json", d / "summary.json")
    trajs = _trajs(run_dir)
    k = next(i for i, m in enumerate(trajs[0]["messages"]) if m["role"] == "assistant")
    trajs[0]["messages"][k]["content"] = HOSTILE
    (d / "trajectories.jsonl").write_text("".join(json.dumps(x) + "\n" for x in trajs))
    index = write_report(d)
    run = _run_page(index, tmp_path)  # run view: task table + one row per episode
    assert run["rows"] == 2 and "gsm8k" in run["all"] and "reward_mean" in run["all"]
    ep = _run_page(index, tmp_path, "#ep=0")  # episode view: conversation + one span per token
    t = trajs[0]
    assert ep["toks"] == len(t["prompt_ids"]) + len(t["response_ids"])
    assert HOSTILE in ep["text"]  # the hostile message is a text node, shown verbatim
    assert set(ep["tags"]) <= {"div", "p", "button", "h1", "h2", "table", "tr", "th", "td", "span", "pre", "br",
                               "#text", "details", "summary", "script"}
    assert ep["tags"]["script"] == ep["nscripts"] == 3  # the file's data elements only, none created by the page
    assert run["tags"]["svg"] == sum("missing" not in p for p in _blob(index.read_text())["plots"]) > 0
    assert "<|im_end|>" in ep["all"] and "turn 1: user" in ep["all"]
