"""BM25 search: building SQLite FTS5 indexes from jsonl, retrieval quality on GSM8K, the search tool
over a local index and over a real HTTP search service (``serve`` subprocess and in-process)."""

import json
import subprocess
import sys

import pytest

from verl_agentic.interfaces import ConfigError
from verl_agentic.tools import load_tools
from verl_agentic.tools.search import SearchIndex, SearchTool, build_index, fts_query, serve

from va_services import ServiceProcess
from va_testing import REPO

GSM8K_TRAIN = REPO / "data" / "gsm8k" / "train.jsonl"


@pytest.fixture(scope="module")
def gsm8k_index(tmp_path_factory):
    path = tmp_path_factory.mktemp("search") / "gsm8k_train.db"
    meta = build_index(GSM8K_TRAIN, path, text_field="answer", title_field="question", id_field=None,
                       progress=False)
    assert meta["docs"] == 7473 and not meta["skipped"]
    return path


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "verl_agentic.tools.search", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=120, **kw)


def test_querying_with_a_train_question_returns_its_solution_first(gsm8k_index):
    rows = [json.loads(line) for line in GSM8K_TRAIN.read_text().splitlines()]
    index = SearchIndex(gsm8k_index)
    sample = range(0, len(rows), 150)  # 50 questions spread over the file
    top1 = [index.search(rows[i]["question"], 3) for i in sample]
    assert sum(h[0].id == str(i) for h, i in zip(top1, sample)) >= 49, [h[0].id for h in top1]
    assert all(len(h) == 3 and h[0].score >= h[1].score >= h[2].score for h in top1)  # best first
    hit = top1[0][0]
    assert hit.title == rows[0]["question"] and hit.text == rows[0]["answer"]
    # a test question retrieves solved problems about the same things (ducks' eggs sold at a market)
    janet = index.search("Janet's ducks lay 16 eggs per day. She sells the remainder at the farmers' market "
                         "daily for $2 per fresh duck egg.", 5)
    assert sum("egg" in h.title.lower() for h in janet) >= 4, [h.title for h in janet]


def test_queries_are_free_text_never_fts_syntax(gsm8k_index):
    index = SearchIndex(gsm8k_index)
    # quotes, operators, column filters and parentheses are plain words here, not FTS5 syntax errors
    for q in ['"unbalanced', "NEAR(eggs AND", "title: eggs*", "eggs OR -", "(((", "^eggs"]:
        assert isinstance(index.search(q, 2), list)
    assert index.search("   ?!  ", 3) == [] and fts_query("?!") is None
    assert fts_query("How many eggs does the hen lay?") == '"many" OR "eggs" OR "does" OR "hen" OR "lay"'
    assert index.search("the", 1)  # a query of stopwords only still searches


def test_build_cli_is_idempotent_with_progress_and_options(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    docs = [{"meta": {"name": f"doc-{i}"}, "body": f"document number {i} about {'cats' if i % 2 else 'dogs'}",
             "head": f"title {i}"} for i in range(25)]
    corpus.write_text("\n".join(json.dumps(d) for d in docs) + "\n\n")
    index = tmp_path / "sub" / "index.db"
    args = ["build", corpus, index, "--text-field", "body", "--title-field", "head", "--id-field", "meta.name"]
    first = subprocess.run([sys.executable, "-c", (
        "import sys; from verl_agentic.tools.search import build_index; "
        f"build_index({str(corpus)!r}, {str(index)!r}, text_field='body', title_field='head', "
        "id_field='meta.name', progress_every=10)")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "indexed 10/25 docs" in first.stderr and "indexed 20/25 docs" in first.stderr
    assert f"indexed 25 docs from {corpus} into {index}" in first.stderr
    mtime = index.stat().st_mtime_ns
    again = _cli(*args)
    assert again.returncode == 0 and "up to date (25 docs" in again.stderr, again.stderr
    assert index.stat().st_mtime_ns == mtime  # not rewritten
    hits = SearchIndex(index).search("cats", 3)
    assert len(hits) == 3 and all(h.id.startswith("doc-") and int(h.id[4:]) % 2 == 1 for h in hits)
    assert hits[0].title.startswith("title ")
    # other options or another corpus: rebuilt; --force: rebuilt
    assert "up to date" not in _cli("build", corpus, index, "--text-field", "body", "--quiet").stderr
    corpus.write_text(corpus.read_text() + json.dumps({"body": "a new doc about birds"}) + "\n")
    rebuilt = _cli("build", corpus, index, "--text-field", "body", "--id-field", "", "--title-field", "")
    assert "indexed 26 docs" in rebuilt.stderr
    assert SearchIndex(index).search("birds", 1)[0].id == "26"  # no id field: the line number (0-based)
    assert "indexed 26 docs" in _cli("build", corpus, index, "--text-field", "body", "--id-field", "",
                                     "--title-field", "", "--force").stderr
    assert not list(index.parent.glob(".*.tmp"))
    query = _cli("query", index, "birds", "-k", "1")
    assert query.returncode == 0 and "a new doc about birds" in query.stdout


def test_bad_corpora_name_the_line_and_field(tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"text": "fine"}\n{"title": "no text here"}\n')
    with pytest.raises(ConfigError, match=r"line 2: field 'text' \(--text-field\) is missing; fields: \['title'\]"):
        build_index(corpus, tmp_path / "i.db", progress=False)
    corpus.write_text('{"text": "fine"}\n{not json\n')
    with pytest.raises(ConfigError, match="line 2 is not valid JSON"):
        build_index(corpus, tmp_path / "i.db", progress=False)
    corpus.write_text('["a list"]\n')
    with pytest.raises(ConfigError, match="line 1: expected a JSON object, got list"):
        build_index(corpus, tmp_path / "i.db", progress=False)
    with pytest.raises(ConfigError, match="does not exist"):
        build_index(tmp_path / "missing.jsonl", tmp_path / "i.db", progress=False)
    assert not (tmp_path / "i.db").exists() and not list(tmp_path.glob(".*.tmp"))  # no half index left
    r = _cli("build", corpus, tmp_path / "i.db")
    assert r.returncode == 2 and "expected a JSON object" in r.stderr


def test_missing_index_names_the_build_command(tmp_path):
    missing = tmp_path / "nope.db"
    expected = f"build it with: python -m verl_agentic.tools.search build CORPUS.jsonl {missing}"
    with pytest.raises(ConfigError) as e:
        load_tools([{"class_name": "search", "config": {"index": str(missing)}}])
    assert expected in str(e.value) and "does not exist" in str(e.value)
    r = _cli("query", missing, "eggs")
    assert r.returncode == 2 and expected in r.stderr
    not_an_index = tmp_path / "x.db"
    not_an_index.write_text("hello")
    with pytest.raises(ConfigError, match="is not a search index of this version; rebuild it with"):
        SearchIndex(not_an_index)
    with pytest.raises(ConfigError, match="exactly one of 'index'"):
        SearchTool({})
    with pytest.raises(ConfigError, match=r"unknown config keys \['k'\]"):
        SearchTool({"url": "http://127.0.0.1:1", "k": 3})


async def test_search_tool_local_and_over_http_give_the_same_results(gsm8k_index):
    local = SearchTool({"index": str(gsm8k_index), "top_k": 2, "max_chars": 80})
    question = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
    out = await local.execute("i", {"query": question})
    assert out.status == "ok" and out.metrics == {"hits": 2}
    assert out.text.startswith("[1] Natalia sold clips to 48 of her friends") and "\n\n[2] " in out.text
    assert " ..." in out.text  # results cut to max_chars
    bad = await local.execute("i", {"query": "  "})
    assert bad.status == "error" and "needs a 'query'" in bad.text
    async with serve(gsm8k_index) as url:
        remote = SearchTool({"url": url, "top_k": 2, "max_chars": 80})
        assert (await remote.execute("i", {"query": question})).text == out.text
        assert [h.as_dict() for h in await remote.search(question, 5)] == \
            [h.as_dict() for h in await local.search(question, 5)]
    down = await remote.execute("i", {"query": question})  # the service is gone: an error for the model
    assert down.status == "error" and "unreachable" in down.text


def test_serve_subprocess_answers_search_and_health(gsm8k_index):
    import urllib.request

    with ServiceProcess("verl_agentic.tools.search", "serve", str(gsm8k_index),
                        ready="search server listening on ") as server:
        url = server.url
        assert url.startswith("http://127.0.0.1:")
        health = json.load(urllib.request.urlopen(f"{url}/health", timeout=10))
        assert health == {"status": "ok", "docs": 7473, "index": str(gsm8k_index)}
        req = urllib.request.Request(f"{url}/search", data=json.dumps({"query": "clips April May", "k": 1}).encode(),
                                     headers={"Content-Type": "application/json"})
        results = json.load(urllib.request.urlopen(req, timeout=10))["results"]
        assert len(results) == 1 and "clips" in results[0]["title"]
        bad = urllib.request.Request(f"{url}/search", data=b'{"query": "x", "k": 0}')
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(bad, timeout=10)
        assert e.value.code == 400 and json.load(e.value)["error"]["type"] == "bad_request"
        assert server.stop() == 0
