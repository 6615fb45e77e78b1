"""The report in a real browser: headless Chromium driven by Selenium.

Chromium and its WebDriver are the Debian packages ``chromium`` and ``chromium-driver``; the
session fixture runs ``scripts/setup_chromium.sh`` when they are missing and fails with its output
when that cannot install them. Screenshots are written to ``outputs/test-artifacts/``.
"""

import asyncio
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from test_inspect_runs import read_jsonl, rollout_dir, rollout_overrides
from va_testing import REPO

ROLLOUT_TEMPERATURE = 0.7  # rollout.temperature (the default)
MISMATCHED_TEMPERATURE = 1.0  # the last step's trainer recomputes at this one: the bug the gap plot shows
ARTIFACTS = REPO / "outputs" / "test-artifacts"
HOSTILE = ('</script><script>window.__pwned=1;alert(1)</script><img src=x onerror="window.__pwned=2">'
           '<svg onload="window.__pwned=3"></svg>"><iframe src="javascript:window.__pwned=4"></iframe>'
           "&amp; <!-- \u2028\u2029 <b>bold?</b> '\"")
TOKEN_SPANS_JS = ("return Array.from(document.querySelectorAll('#tokens .tok'))"
                  ".map(function (s) { return [s.className, s.textContent, s.title]; });")


def trainer_logprobs(model, traj, temperature):
    """What a trainer recomputes: log_softmax(logits / T) of each response token; None where the mask is 0."""
    import torch

    ids = traj["prompt_ids"] + traj["response_ids"]
    p = len(traj["prompt_ids"])
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, p - 1:-1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1).gather(1, torch.tensor(traj["response_ids"])[:, None])[:, 0]
    return [float(x) if m else None for x, m in zip(lp.tolist(), traj["response_mask"])]


def make_training_dir(tiny_qwen_dir, out, steps=2):
    """A training dir laid out as main_ppo writes it, from real rollouts of the tiny model, whose last step
    has the rollout-vs-trainer logprob gap of a temperature mismatch (the trainer's own runs have none).

    Step k is a rollout with seed k; each episode gets ``step`` and ``trainer_logprobs`` from a forward
    pass of the same model at the rollout temperature, except the last step, recomputed at
    ``MISMATCHED_TEMPERATURE``. ``metrics.jsonl`` has reward/mean, accuracy/mean, turns/mean and
    timing/rollout_s; the rest is derived from rollouts/. Returns (dir, {step: trajectories})."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from verl_agentic.main_rollout import load_config, make_backend, run

    out = Path(out)
    (out / "rollouts").mkdir(parents=True)
    cfg = load_config(rollout_overrides(tiny_qwen_dir, out / "tmp"))
    OmegaConf.save(cfg, out / "config.yaml")
    backend = make_backend(cfg)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_qwen_dir)).eval()
    by_step = {}
    with open(out / "metrics.jsonl", "w") as metrics:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            # one output dir per step: a rollout dir holds one run (rollout/journal.py continues it)
            trajs, _ = run(load_config(rollout_overrides(tiny_qwen_dir, out / "tmp" / str(step), f"seed={step}")),
                           backend=backend)
            wall = time.perf_counter() - t0
            temp = MISMATCHED_TEMPERATURE if step == steps else ROLLOUT_TEMPERATURE
            for t in trajs:
                t["step"] = step
                t["trainer_logprobs"] = trainer_logprobs(model, t, temp)
            (out / "rollouts" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trajs))
            n = len(trajs)
            metrics.write(json.dumps({"step": step, "reward/mean": sum(t["reward"] for t in trajs) / n,
                                      "accuracy/mean": sum(t["metrics"]["final_correct"] for t in trajs) / n,
                                      "turns/mean": sum(t["num_turns"] for t in trajs) / n,
                                      "timing/rollout_s": wall}) + "\n")
            by_step[step] = trajs
    asyncio.run(backend.close())
    shutil.rmtree(out / "tmp")
    return out, by_step


@pytest.fixture(scope="session")
def chromium_binaries():
    def found():
        return shutil.which("chromium") and shutil.which("chromedriver")

    if not found():
        r = subprocess.run(["bash", str(REPO / "scripts" / "setup_chromium.sh")], capture_output=True, text=True,
                           timeout=1200)
        if r.returncode != 0 or not found():
            pytest.fail("the browser tests need headless Chromium (Debian packages chromium, chromium-driver) and "
                        f"scripts/setup_chromium.sh could not install them (exit {r.returncode}):\n"
                        f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}", pytrace=False)
    return shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser(chromium_binaries):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = chromium_binaries
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
                "--disable-gpu"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=opts)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def runs(tiny_qwen_dir, tmp_path_factory):
    """A 2-step training dir (the second step's trainer logprobs at a mismatched temperature) and a rollout dir."""
    base = tmp_path_factory.mktemp("browser")
    train, by_step = make_training_dir(tiny_qwen_dir, base / "train", steps=2)
    return {"train": train, "by_step": by_step, "rollout": rollout_dir(tiny_qwen_dir, base / "rollout")}


def _open(driver, index, hash_=""):
    driver.get(index.resolve().as_uri() + hash_)
    _no_page_errors(driver)


def _wait(driver, css, timeout=30):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(EC.presence_of_element_located((By.CSS_SELECTOR, css)))


def _no_page_errors(driver):
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def _css(driver, css):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def _shown(text):
    """A token's text as the page shows it (newlines and tabs made visible)."""
    return text.replace("\n", "\u21b5\n").replace("\t", "\u2192\t")


def _screenshot(driver, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.set_window_size(1280, min(4000, driver.execute_script("return document.body.scrollHeight") + 40))
    driver.save_screenshot(str(ARTIFACTS / name))
    driver.set_window_size(1280, 1000)
    assert (ARTIFACTS / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_episode_tokens_match_the_trajectory_file(browser, runs, tmp_path, tiny_qwen_dir):
    from selenium.webdriver.support.ui import Select
    from transformers import AutoTokenizer

    from verl_agentic.inspect import write_report

    tok = AutoTokenizer.from_pretrained(str(tiny_qwen_dir))

    def decode(tid):
        return tok.decode([tid], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    index = write_report(runs["train"], tmp_path / "rep")
    trajs = [t for s in sorted(runs["by_step"]) for t in runs["by_step"][s]]
    _open(browser, index)
    _wait(browser, "#episodes tr.ep")
    assert len(_css(browser, "#episodes tr.ep")) == len(trajs)
    Select(_css(browser, "select[name=step]")[0]).select_by_value("2")
    rows = _css(browser, "#episodes tr.ep")
    last = [i for i, t in enumerate(trajs) if t["step"] == 2]
    assert [int(r.get_attribute("data-i")) for r in rows] == last
    _screenshot(browser, "inspect_run_view.png")
    i = last[0]
    t = trajs[i]
    rows[0].click()
    _wait(browser, "#tokens")
    assert browser.execute_script("return location.hash") == f"#ep={i}"
    spans = browser.execute_script(TOKEN_SPANS_JS)
    prompt = [s for s in spans if "prompt" in s[0].split()]
    response = [s for s in spans if "prompt" not in s[0].split()]
    mask = t["response_mask"]
    assert len(prompt) == len(t["prompt_ids"]) and len(response) == len(t["response_ids"])
    # shading: trained (mask 1) and injected (mask 0) tokens, token by token, and their spans (runs)
    assert ["m1" in s[0].split() for s in response] == [m == 1 for m in mask]
    assert ["m0" in s[0].split() for s in response] == [m == 0 for m in mask]
    assert sum("m1" in s[0].split() for s in response) == sum(mask) > 0
    assert sum("m0" in s[0].split() for s in response) == mask.count(0) > 0
    runs_of = lambda xs: [x for k, x in enumerate(xs) if k == 0 or xs[k - 1] != x]  # noqa: E731
    shown_runs = runs_of(["m1" if "m1" in s[0].split() else "m0" for s in response])
    assert shown_runs == runs_of(["m1" if m else "m0" for m in mask])
    assert shown_runs.count("m1") == sum(x["role"] == "assistant" for x in t["turns"])
    # each token's text, id, mask, logprob and trainer logprob on hover
    for (cls, text, title), tid in zip(prompt, t["prompt_ids"]):
        assert text == _shown(decode(tid)) and f"id={tid}" in title
    for p, ((cls, text, title), tid) in enumerate(zip(response, t["response_ids"])):
        assert text == _shown(decode(tid)), p
        assert title.startswith(f"#{p} id={tid} mask={mask[p]} logprob=")
        lp = re.search(r"logprob=(\S+)", title).group(1)
        if mask[p]:
            assert float(lp) == round(t["response_logprobs"][p], 3)
            assert float(re.search(r"trainer=(\S+)", title).group(1)) == round(t["trainer_logprobs"][p], 3)
        else:
            assert lp == "-" and "trainer=" not in title
    gaps = [bool(m) and abs(round(a, 3) - round(b, 3)) > 0.5 for a, b, m in
            zip(t["response_logprobs"], [x or 0.0 for x in t["trainer_logprobs"]], mask)]
    assert ["gap" in s[0].split() for s in response] == gaps
    special = [s for s in response if "special" in s[0].split()]
    assert special and all(s[1] in tok.all_special_tokens for s in special)  # <|im_end|> etc., shown literally
    marks = [m.text for m in _css(browser, "#tokens .turnmark")]
    assert len(marks) == 1 + len(t["turns"]) and marks[0] == f"prompt ({len(t['prompt_ids'])} tokens)"
    assert all(m.startswith(f"turn {k}: {x['role']} [{x['start']},{x['end']})") for k, (m, x) in
               enumerate(zip(marks[1:], t["turns"])))
    assert _css(browser, "#exactness")[0].text.startswith("ok")
    assert len(_css(browser, ".conversation .msg")) == len(t["messages"])
    _screenshot(browser, "inspect_episode.png")
    _css(browser, "#back")[0].click()
    _wait(browser, "#episodes tr.ep")
    _no_page_errors(browser)


def test_plots_render_from_the_embedded_data(browser, runs, tmp_path):
    from verl_agentic.inspect import write_report

    index = write_report(runs["train"], tmp_path / "rep", drift=False)
    data = json.loads(re.search(r'id="va-data">(.*?)</script>', index.read_text(encoding="utf-8"), re.S).group(1))
    _open(browser, index)
    _wait(browser, "svg.chart")
    with_data = [p for p in data["plots"] if "missing" not in p]
    boxes = _css(browser, ".plot")
    assert [b.get_attribute("data-plot") for b in boxes] == [p["id"] for p in with_data]
    for box, p in zip(boxes, with_data):
        if p["kind"] == "line":
            points = sum(y is not None for s in p["series"] for y in s["y"])
            assert len(box.find_elements("css selector", "circle.pt")) == points > 0, p["id"]
        else:
            bars = sum(y is not None for s in p["series"] for y in s["y"])
            assert len(box.find_elements("css selector", "rect.bar")) == bars > 0, p["id"]
        assert box.find_elements("css selector", "a")[0].get_attribute("href").endswith(p["png"])
    missing = {p["id"]: p["missing"] for p in data["plots"] if "missing" in p}
    assert missing  # the tool plots: the tiny model makes no tool calls
    lines = _css(browser, ".nodata")
    assert sorted(i for x in lines for i in x.get_attribute("data-plot").split()) == sorted(missing)
    for x in lines:
        assert "no data: " in x.text and any(why in x.text for why in missing.values())
    _no_page_errors(browser)


def _hostile_dir(src, dst):
    dst.mkdir()
    shutil.copy(src / "summary.json", dst / "summary.json")
    trajs = read_jsonl(src / "trajectories.jsonl")
    t = trajs[0]
    for m in t["messages"]:
        if m["role"] != "system":
            m["content"] = HOSTILE
    t.update(uid=HOSTILE, ground_truth=HOSTILE, data_source=HOSTILE, error={"type": HOSTILE, "message": HOSTILE})
    t["score_extra"]["pred"] = HOSTILE
    t["metrics"][HOSTILE] = 1.0
    (dst / "trajectories.jsonl").write_text("".join(json.dumps(x) + "\n" for x in trajs))
    return trajs


def test_hostile_output_renders_as_text(browser, runs, tmp_path):
    from selenium.common.exceptions import NoAlertPresentException

    from verl_agentic.inspect import write_report

    trajs = _hostile_dir(runs["rollout"], tmp_path / "hostile")
    n = len(trajs)
    index = write_report(tmp_path / "hostile", tmp_path / "rep", compare=runs["rollout"], drift=False)
    checks = []

    def check(view):
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert  # noqa: B018 - raises when no alert is open
        assert browser.execute_script("return window.__pwned") is None, view
        injected = browser.execute_script(
            "return document.querySelectorAll('img, iframe, b, [onerror], [onload], svg:not(.chart)').length")
        assert injected == 0, view
        assert len(_css(browser, "script")) == 2 + 2 * n, view  # the file's own: none added
        checks.append(view)

    _open(browser, index, "#run")
    _wait(browser, "#episodes tr.ep")
    assert HOSTILE in [c.get_attribute("textContent") for c in _css(browser, "#episodes td")]
    check("run view")
    _css(browser, "#episodes tr.ep")[0].click()
    _wait(browser, "#tokens")
    pres = [p.get_attribute("textContent") for p in _css(browser, ".msg pre")]
    assert pres.count(HOSTILE) == sum(m["content"] == HOSTILE for m in trajs[0]["messages"]) >= 2
    assert any(HOSTILE in f.get_attribute("textContent") for f in _css(browser, ".flag"))
    check("episode view")
    _open(browser, index, "#cmp")
    _wait(browser, "#pairs tr.pair")
    check("comparison view")
    _css(browser, "#pairs tr.pair")[0].click()
    _wait(browser, ".sidebyside")
    sides = _css(browser, ".side")
    assert len(sides) == 2
    assert HOSTILE in [p.get_attribute("textContent") for p in sides[0].find_elements("css selector", "pre")]
    check("pair view")
    _no_page_errors(browser)
    assert len(checks) == 4


def test_turns_with_failed_tool_calls_are_marked(browser, runs, tmp_path):
    """A turn's ``info`` (its tool calls' outcomes, as the tool tasks record them) shows on that turn's
    mark; a turn with a failed or unparseable call is flagged, a turn whose calls all worked is not."""
    from verl_agentic.inspect import write_report

    src, dst = runs["rollout"], tmp_path / "tools"
    dst.mkdir()
    shutil.copy(src / "summary.json", dst / "summary.json")
    trajs = read_jsonl(src / "trajectories.jsonl")
    t = trajs[0]
    assistant = [k for k, x in enumerate(t["turns"]) if x["role"] == "assistant"]
    assert len(assistant) >= 2, "the fixture run needs a multi-turn episode"
    t["turns"][assistant[0]]["info"] = {"tool_calls": [{"name": "python", "status": "timeout"},
                                                        {"name": HOSTILE, "status": "ok"}], "parse_errors": 1}
    t["turns"][assistant[1]]["info"] = {"tool_calls": [{"name": "calculator", "status": "ok"}]}
    (dst / "trajectories.jsonl").write_text("".join(json.dumps(x) + "\n" for x in trajs))
    _open(browser, write_report(dst, tmp_path / "rep", drift=False))
    _wait(browser, "#episodes tr.ep")
    _css(browser, "#episodes tr.ep")[0].click()
    _wait(browser, "#tokens")
    marks = _css(browser, "#tokens .turnmark")[1:]  # [0] is the prompt's
    assert len(marks) == len(t["turns"])
    text = [m.get_attribute("textContent") for m in marks]
    flagged = ["turnerr" in m.get_attribute("class").split() for m in marks]
    assert text[assistant[0]].endswith(f" tools: python=timeout, {HOSTILE}=ok unparsed calls=1")
    assert text[assistant[1]].endswith(" tools: calculator=ok")
    assert flagged == [k == assistant[0] for k in range(len(t["turns"]))]
    assert browser.execute_script("return window.__pwned") is None
    _no_page_errors(browser)


def test_compare_view_side_by_side(browser, runs, tmp_path, tiny_qwen_dir):
    from verl_agentic.inspect import write_report

    b = rollout_dir(tiny_qwen_dir, tmp_path / "nofeedback", "task.gsm8k.feedback=none")
    index = write_report(runs["rollout"], tmp_path / "rep", compare=b, drift=False)
    ta, tb = read_jsonl(runs["rollout"] / "trajectories.jsonl"), read_jsonl(b / "trajectories.jsonl")
    _open(browser, index)  # a comparison report opens on the comparison
    _wait(browser, "#pairs tr.pair")
    assert len(_css(browser, "#pairs tr.pair")) == len(ta)
    assert _css(browser, "#paircounts")[0].text.startswith(f"{len(ta)} pairs ({len(ta)} by uid/sample")
    assert len(_css(browser, "#deltas tr")) > 5
    _screenshot(browser, "inspect_compare.png")
    _css(browser, "#pairs tr.pair")[1].click()
    _wait(browser, ".sidebyside")
    sides = _css(browser, ".side")
    assert [len(s.find_elements("css selector", ".msg")) for s in sides] == [len(ta[1]["messages"]),
                                                                             len(tb[1]["messages"])]
    sides[1].find_elements("css selector", "h2 button")[0].click()  # into run B's token view
    _wait(browser, "#tokens")
    assert browser.execute_script("return location.hash") == "#b/ep=1"
    assert len(_css(browser, "#tokens .tok.m1")) == sum(tb[1]["response_mask"])
    _no_page_errors(browser)


def test_10k_episodes_open_and_page(browser, runs, tmp_path):
    """10,000 episodes: the list renders at once (100 per page), paging and opening an episode stay quick."""
    from verl_agentic.inspect import write_report

    base = read_jsonl(runs["rollout"] / "trajectories.jsonl")
    d = tmp_path / "big"
    d.mkdir()
    shutil.copy(runs["rollout"] / "summary.json", d / "summary.json")
    with open(d / "trajectories.jsonl", "w") as f:
        for i in range(10_000):
            f.write(json.dumps({**base[i % len(base)], "uid": f"gsm8k-{i}", "index": i}) + "\n")
    index = write_report(d, drift=False)
    t0 = time.perf_counter()
    _open(browser, index)
    _wait(browser, "#episodes tr.ep")
    opened = time.perf_counter() - t0
    assert len(_css(browser, "#episodes tr.ep")) == 100
    assert "(10000)" in _css(browser, ".pageinfo")[0].text
    t0 = time.perf_counter()
    _css(browser, "button.next")[0].click()
    assert _css(browser, "#episodes tr.ep")[0].get_attribute("data-i") == "100"
    paged = time.perf_counter() - t0
    t0 = time.perf_counter()
    _css(browser, "#episodes tr.ep")[5].click()
    _wait(browser, "#tokens")
    episode = time.perf_counter() - t0
    assert len(_css(browser, "#tokens .tok.m1")) == sum(base[105 % len(base)]["response_mask"])
    print(f"\n10k episodes in the browser: open {opened:.2f}s, next page {paged:.2f}s, open episode {episode:.2f}s")
    # generous bounds (a loaded 2-core CI machine); bench/inspect_open.py measures the real numbers
    assert opened < 30 and paged < 5 and episode < 5
    _no_page_errors(browser)
