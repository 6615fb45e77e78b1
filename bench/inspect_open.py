"""Time to open a 10,000-episode report in headless Chromium, and to use it.

Builds reports of N episodes (the real trajectories of a source run, repeated under new uids) with
``verl_agentic.inspect`` and opens them in headless Chromium (Selenium; the Debian packages
``chromium`` and ``chromium-driver``, see ``scripts/setup_chromium.sh``). Per size it prints:

- build: ``write_report`` wall time, without and with the token-exactness check, and the file size;
- open: navigation start to the first view drawn (the page's ``va-rendered`` performance mark), and
  to the load event's end (the page is interactive: the main thread is free);
- next page: a click on "next >" until the next frame; open episode: a click on a row until the
  episode view's next frame; scroll: the episode view scrolled to its bottom, until the next frame.

Baselines, side by side: the *floor*, the same HTML with the page script removed (what the browser
spends reading and parsing the bytes alone), and *eager*, the same page that first parses every
episode's JSON at open (what a page without lazy per-episode elements, like the inspector's first
version, does). Medians of ``--repeats`` page loads.

    .venv/bin/python bench/inspect_open.py                    # source: outputs/demo (make demo)
    .venv/bin/python bench/inspect_open.py --source outputs/run --sizes 100,10000 --repeats 5
    .venv/bin/python bench/inspect_open.py --screenshot docs/images/report.png --sizes ''   # README picture
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NEXT_FRAME = "requestAnimationFrame(function () { setTimeout(function () { done(performance.now() - t0); }, 0); });"
CLICK_NEXT_JS = ("var done = arguments[arguments.length - 1], t0 = performance.now();"
                 "document.querySelector('button.next').click();" + NEXT_FRAME)
OPEN_EPISODE_JS = ("var done = arguments[arguments.length - 1], t0 = performance.now();"
                   "window.addEventListener('hashchange', function h() { window.removeEventListener('hashchange', h);"
                   + NEXT_FRAME + "});"
                   "document.querySelectorAll('#episodes tr.ep')[arguments[0]].click();")
SCROLL_JS = ("var done = arguments[arguments.length - 1], t0 = performance.now();"
             "window.scrollTo(0, document.body.scrollHeight);" + NEXT_FRAME)
OPEN_TIMES_JS = ("var n = performance.timing.navigationStart, m = performance.getEntriesByName('va-rendered')[0];"
                 "return [m ? m.startTime : null, performance.timing.loadEventEnd - n];")


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        subprocess.run(["bash", str(REPO / "scripts" / "setup_chromium.sh")], check=True)
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    driver.set_page_load_timeout(300)
    driver.set_script_timeout(120)
    return driver


def source_dir(path: Path) -> Path:
    """The run whose episodes are repeated; made with the embedded model when absent (about a minute)."""
    if (path / "trajectories.jsonl").exists():
        return path
    print(f"{path} has no trajectories.jsonl: rolling out 4 GSM8K problems with the embedded model", flush=True)
    subprocess.run([sys.executable, "-m", "verl_agentic.main_rollout", "data.max_samples=4", "rollout.max_turns=3",
                    "rollout.max_new_tokens=192", "output.quiet=true", f"output.dir={path}"], check=True, cwd=REPO)
    return path


def replicate(src: Path, dst: Path, n: int) -> None:
    base = [json.loads(line) for line in (src / "trajectories.jsonl").read_text().splitlines() if line.strip()]
    dst.mkdir(parents=True)
    shutil.copy(src / "summary.json", dst / "summary.json")
    with open(dst / "trajectories.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({**base[i % len(base)], "uid": f"{base[i % len(base)]['task_type']}-{i}", "index": i,
                                "sample_id": 0}) + "\n")


EAGER_JS = ("<script>document.querySelectorAll('script[type=\"application/json\"]')"
            ".forEach(function (s) { JSON.parse(s.textContent); });</script>\n")


def variants(index: Path) -> tuple[Path, Path]:
    """(floor, eager): the same HTML without the page script, and with every JSON element parsed first."""
    text = index.read_text(encoding="utf-8")
    code = re.search(r"<script>\n.*?\n</script>", text, re.S)
    floor, eager = index.with_name("floor.html"), index.with_name("eager.html")
    floor.write_text(text[: code.start()] + text[code.end():], encoding="utf-8")
    eager.write_text(text[: code.start()] + EAGER_JS + text[code.start():], encoding="utf-8")
    return floor, eager


def build(src: Path, work: Path, n: int, drift: bool) -> tuple[Path, float]:
    from verl_agentic.inspect import write_report

    d = work / f"run{n}"
    if not d.exists():
        replicate(src, d, n)
    t0 = time.perf_counter()
    index = write_report(d, work / f"report{n}-{'drift' if drift else 'nodrift'}", drift=drift)
    return index, time.perf_counter() - t0


def measure(driver, index: Path, repeats: int) -> dict[str, float]:
    rows: dict[str, list[float]] = {k: [] for k in ("rendered_ms", "load_ms", "next_page_ms", "open_episode_ms",
                                                      "scroll_ms", "floor_ms", "eager_ms")}
    floor, eager = variants(index)
    for _ in range(repeats):
        for name, page in (("floor_ms", floor), ("eager_ms", eager)):
            driver.get("about:blank")
            driver.get(page.as_uri())
            rows[name].append(driver.execute_script(OPEN_TIMES_JS)[1])
        driver.get("about:blank")
        driver.get(index.as_uri())
        rendered, load = driver.execute_script(OPEN_TIMES_JS)
        rows["rendered_ms"].append(rendered)
        rows["load_ms"].append(load)
        rows["next_page_ms"].append(driver.execute_async_script(CLICK_NEXT_JS))
        rows["open_episode_ms"].append(driver.execute_async_script(OPEN_EPISODE_JS, 3))
        assert driver.execute_script("return document.querySelectorAll('#tokens .tok').length") > 0
        rows["scroll_ms"].append(driver.execute_async_script(SCROLL_JS))
    return {k: statistics.median(v) for k, v in rows.items()}


def screenshot(driver, src: Path, out: Path, work: Path) -> None:
    """The README picture: the token view of the source run's episode with feedback whose first turn is shortest."""
    from verl_agentic.inspect import write_report

    index = write_report(src, work / "shot")
    driver.set_window_size(1280, 1000)
    driver.get(index.as_uri())
    trajs = [json.loads(line) for line in (src / "trajectories.jsonl").read_text().splitlines() if line.strip()]
    with_feedback = [k for k, t in enumerate(trajs) if any(x["role"] != "assistant" for x in t["turns"])] or [0]
    i = min(with_feedback, key=lambda k: trajs[k]["turns"][0]["end"])
    driver.get(index.as_uri() + f"#ep={i}")
    driver.execute_script("Array.from(document.querySelectorAll('h2')).filter(function (h) {"
                          " return h.textContent === 'Tokens'; })[0].scrollIntoView();")
    out.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(out))
    driver.set_window_size(1280, 1000)
    print(f"screenshot of {index}#ep={i}: {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=str(REPO / "outputs" / "demo"), help="a main_rollout output dir")
    ap.add_argument("--sizes", default="100,10000", help="episode counts, comma-separated ('' for none)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--drift-max", type=int, default=1000,
                    help="also time the build with the drift check up to this many episodes")
    ap.add_argument("--screenshot", default=None, help="save the README screenshot of the source run's report here")
    args = ap.parse_args()
    src = source_dir(Path(args.source))
    driver = browser()
    work = Path(tempfile.mkdtemp(prefix="inspect_open_"))
    try:
        if args.screenshot:
            screenshot(driver, src, Path(args.screenshot), work)
        build(src, work, 1, drift=True)  # imports and the first tokenizer load, untimed
        results = []
        for n in [int(x) for x in args.sizes.split(",") if x.strip()]:
            index, t_build = build(src, work, n, drift=False)
            t_drift = build(src, work, n, drift=True)[1] if n <= args.drift_max else None
            m = measure(driver, index, args.repeats)
            results.append((n, index.stat().st_size / 1e6, t_build, t_drift, m))
            print(f"done: {n} episodes", flush=True)
        if results:
            cols = ["episodes", "MB", "build s", "+drift s", "floor ms", "eager ms", "rendered ms", "load ms",
                    "load/eager", "load/floor", "next page ms", "episode ms", "scroll ms"]
            print("  ".join(f"{c:>12}" for c in cols))
            for n, mb, tb, td, m in results:
                vals = [n, f"{mb:.1f}", f"{tb:.1f}", "-" if td is None else f"{td:.1f}", f"{m['floor_ms']:.0f}",
                        f"{m['eager_ms']:.0f}", f"{m['rendered_ms']:.0f}", f"{m['load_ms']:.0f}",
                        f"{m['load_ms'] / m['eager_ms']:.2f}", f"{m['load_ms'] / m['floor_ms']:.2f}",
                        f"{m['next_page_ms']:.0f}", f"{m['open_episode_ms']:.0f}", f"{m['scroll_ms']:.0f}"]
                print("  ".join(f"{v:>12}" for v in vals))
    finally:
        driver.quit()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
