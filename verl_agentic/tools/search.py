"""Full-text search over a jsonl corpus: a SQLite FTS5 index with BM25 ranking, the ``search`` tool,
and a small HTTP search service.

Build an index once (any jsonl corpus; one JSON object per line)::

    python -m verl_agentic.tools.search build CORPUS.jsonl INDEX.db \\
        [--text-field text] [--title-field title] [--id-field id] [--force] [--quiet]
    python -m verl_agentic.tools.search query INDEX.db "how many clips did Natalia sell" -k 3
    python -m verl_agentic.tools.search serve INDEX.db --port 8200      # POST /search, GET /health

- ``build`` indexes the title and text fields (``porter unicode61`` tokenizer: lower case,
  punctuation split, English stemming) into an FTS5 table. Fields may be dotted paths
  (``meta.title``); a missing title is empty, a missing id is the line number, a missing or
  non-string text is an error naming the line. It writes to a temporary file and renames it, so
  an interrupted build never leaves a half index. It is idempotent: when ``INDEX.db`` was built
  from the same corpus bytes (SHA-256) with the same options, it says so and does nothing
  (``--force`` rebuilds).
- Queries are free text: the words are OR-ed (FTS5 syntax characters in the query are never
  interpreted) and ranked with FTS5's ``bm25()`` (k1=1.2, b=0.75), title and text weighted by
  ``title_weight`` / ``text_weight``.
- ``serve`` answers ``POST /search`` ``{"query": str, "k"?: int}`` with
  ``{"results": [{"id", "title", "text", "score"}]}`` (higher score = better) and ``GET /health``
  with ``{"status": "ok", "docs", "index"}``; errors are ``{"error": {"type", "message"}}``.

The ``search`` tool (registered tool class ``search``) takes ``{"query": str}`` and answers the
``top_k`` best documents, each cut to ``max_chars`` characters. Its config names a local
``index`` (opened read-only, queried in a worker thread) or the ``url`` of a search service
(``timeout_s`` per request)::

    tools: [{class_name: search, config: {index: outputs/gsm8k_train.db, top_k: 3}}]
    tools: [{class_name: search, config: {url: http://127.0.0.1:8200}}]

An index that does not exist is a ``ConfigError`` that names the build command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Optional, Sequence

from aiohttp import web

from verl_agentic.interfaces import ConfigError
from verl_agentic.jsonl import iter_json_lines
from verl_agentic.serving import (
    HttpTransport,
    ServiceError,
    error_middleware,
    read_json_object,
    run_until_signalled,
    serve_app,
)
from verl_agentic.tools.base import BaseTool, ToolResult
from verl_agentic.tools.registry import register_tool_class

SCHEMA_VERSION = 1
BUILD_COMMAND = "python -m verl_agentic.tools.search build CORPUS.jsonl {index}"
MAX_QUERY_TERMS = 64
MAX_K = 50
# Words that carry no topic: dropping them keeps OR-queries small (BM25 would weigh them ~0 anyway).
STOPWORDS = frozenset(
    "a an and are as at be but by for from has have he her his how i if in into is it its of on or she so "
    "than that the their them then there they this to was were what when where which who will with you your"
    .split()
)


class SearchError(Exception):
    """A search that could not be answered (bad index file, unreachable service, bad answer)."""


def _missing_index_error(path: Path) -> ConfigError:
    return ConfigError(f"search index {str(path)!r} does not exist; build it with: "
                       + BUILD_COMMAND.format(index=path))


@dataclass
class Hit:
    id: str
    title: str
    text: str
    score: float  # -bm25(): higher is better

    def as_dict(self) -> dict:
        return {"id": self.id, "title": self.title, "text": self.text, "score": self.score}


def fts_query(text: str) -> Optional[str]:
    """A free-text query as an FTS5 expression: its distinct words, quoted, OR-ed (None: no words)."""
    terms: list[str] = []
    for word in re.findall(r"\w+", text.lower()):
        if word not in STOPWORDS and word not in terms:
            terms.append(word)
    if not terms:  # a query of stopwords only still searches for them
        terms = list(dict.fromkeys(re.findall(r"\w+", text.lower())))
    if not terms:
        return None
    return " OR ".join(f'"{t}"' for t in terms[:MAX_QUERY_TERMS])


# ------------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------------
def _field(obj: dict, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_meta(index: Path) -> Optional[dict]:
    """The build metadata of an existing index, or None when it is not one of ours."""
    try:
        con = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT key, value FROM meta").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return {k: json.loads(v) for k, v in rows}


def build_index(corpus: str | os.PathLike, index: str | os.PathLike, *, text_field: str = "text",
                title_field: Optional[str] = "title", id_field: Optional[str] = "id", force: bool = False,
                progress: bool = True, progress_every: int = 10_000) -> dict:
    """Index ``corpus`` (jsonl) into ``index``; returns the build metadata (``skipped`` when up to date).

    Raises:
        ConfigError: the corpus is missing, has no documents, or a line is not a JSON object
            with a string ``text_field`` (the message names the line).
    """
    corpus, index = Path(corpus), Path(index)
    if not corpus.is_file():
        raise ConfigError(f"corpus {str(corpus)!r} does not exist")
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    options = {"text_field": text_field, "title_field": title_field, "id_field": id_field}
    digest = _sha256(corpus)
    if index.exists() and not force:
        meta = _read_meta(index)
        if meta and meta.get("schema_version") == SCHEMA_VERSION and meta.get("corpus_sha256") == digest \
                and meta.get("options") == options:
            log(f"{index}: up to date ({meta['docs']} docs from {corpus}); --force rebuilds")
            return {**meta, "skipped": True}
    total = sum(1 for line in open(corpus, "rb") if line.strip())
    tmp = index.with_name(f".{index.name}.{os.getpid()}.tmp")
    index.parent.mkdir(parents=True, exist_ok=True)
    tmp.unlink(missing_ok=True)
    t0 = time.perf_counter()
    con = sqlite3.connect(tmp)
    try:
        con.execute("CREATE VIRTUAL TABLE docs USING fts5(doc_id UNINDEXED, title, text, "
                    "tokenize='porter unicode61')")
        con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        n = 0
        batch: list[tuple[str, str, str]] = []
        with open(corpus, encoding="utf-8") as f:
            for lineno, obj in iter_json_lines(f, str(corpus)):
                where = f"{corpus}: line {lineno}"
                text = _field(obj, text_field)
                if not isinstance(text, str):
                    raise ConfigError(f"{where}: field {text_field!r} (--text-field) is "
                                      f"{'missing' if text is None else 'not a string'}; "
                                      f"fields: {sorted(obj)}")
                title = _field(obj, title_field) if title_field else None
                doc_id = _field(obj, id_field) if id_field else None
                batch.append((str(lineno - 1 if doc_id is None else doc_id), "" if title is None else str(title),
                              text))
                n += 1
                if len(batch) >= 1000:
                    con.executemany("INSERT INTO docs (doc_id, title, text) VALUES (?, ?, ?)", batch)
                    batch.clear()
                if n % progress_every == 0:
                    log(f"indexed {n}/{total} docs ({time.perf_counter() - t0:.1f} s)")
        con.executemany("INSERT INTO docs (doc_id, title, text) VALUES (?, ?, ?)", batch)
        if n == 0:
            raise ConfigError(f"corpus {str(corpus)!r} has no documents")
        con.execute("INSERT INTO docs(docs) VALUES ('optimize')")  # merge the b-trees: faster queries
        meta = {"schema_version": SCHEMA_VERSION, "corpus": str(corpus), "corpus_sha256": digest,
                "options": options, "docs": n, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        con.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()])
        con.commit()
    except BaseException:
        con.close()
        tmp.unlink(missing_ok=True)
        raise
    con.close()
    os.replace(tmp, index)
    log(f"indexed {n} docs from {corpus} into {index} in {time.perf_counter() - t0:.1f} s")
    return {**meta, "skipped": False}


# ------------------------------------------------------------------------------------------------
# searching
# ------------------------------------------------------------------------------------------------
class SearchIndex:
    """A read-only handle on an index built by ``build_index``; ``search`` is thread-safe."""

    def __init__(self, path: str | os.PathLike, *, title_weight: float = 1.0, text_weight: float = 1.0):
        self.path = Path(path)
        if not self.path.is_file():
            raise _missing_index_error(self.path)
        meta = _read_meta(self.path)
        if meta is None or meta.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError(f"{str(self.path)!r} is not a search index of this version; rebuild it with: "
                              + BUILD_COMMAND.format(index=self.path) + " --force")
        self.meta = meta
        self.weights = (float(title_weight), float(text_weight))
        self._con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()

    @property
    def num_docs(self) -> int:
        return int(self.meta["docs"])

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """The ``k`` best documents for the free-text ``query`` (BM25), best first."""
        expr = fts_query(query)
        if expr is None or k < 1:
            return []
        with self._lock:
            rows = self._con.execute(
                "SELECT doc_id, title, text, bm25(docs, 0.0, ?, ?) AS rank FROM docs WHERE docs MATCH ? "
                "ORDER BY rank LIMIT ?", (*self.weights, expr, min(int(k), MAX_K))).fetchall()
        return [Hit(str(i), t, x, -float(r)) for i, t, x, r in rows]

    def close(self) -> None:
        with self._lock:
            self._con.close()


class RemoteSearch:
    """The client of ``python -m verl_agentic.tools.search serve`` (one attempt per search: a tool
    call has its own time limit)."""

    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url = self._transport(url, timeout_s).url  # checks the url now
        self.timeout_s = timeout_s

    @staticmethod
    def _transport(url: str, timeout_s: float) -> HttpTransport:
        return HttpTransport(url, name="search service", request_timeout_s=timeout_s, max_retries=0)

    async def search(self, query: str, k: int = 3) -> list[Hit]:
        try:
            # a transport per search: the tool may be called from different event loops
            async with self._transport(self.url, self.timeout_s) as http:
                payload = await http.request("POST", "/search", json_body={"query": query, "k": k})
        except ServiceError as e:
            if e.status is None:
                raise SearchError(f"search service {self.url} unreachable: {e.message}") from None
            raise SearchError(f"search service {self.url} answered {e.status}: {e.message}") from None
        results = payload.get("results")
        if not isinstance(results, list):
            raise SearchError(f"search service {self.url} answered without a 'results' list")
        try:
            return [Hit(str(h["id"]), str(h["title"]), str(h["text"]), float(h["score"])) for h in results]
        except (KeyError, TypeError, ValueError) as e:
            raise SearchError(f"search service {self.url}: malformed result ({e})") from None


def format_hits(hits: list[Hit], max_chars: int) -> str:
    """The tool message: numbered results, title then text, each cut to ``max_chars``."""
    if not hits:
        return "No results."
    blocks = []
    for i, h in enumerate(hits, 1):
        body = h.text if len(h.text) <= max_chars else h.text[:max_chars].rstrip() + " ..."
        blocks.append(f"[{i}] {h.title}\n{body}" if h.title else f"[{i}] {body}")
    return "\n\n".join(blocks)


@register_tool_class("search")
class SearchTool(BaseTool):
    """BM25 search over a local index or a search service (see the module docstring)."""

    DEFAULT_SCHEMA = {"type": "function", "function": {
        "name": "search",
        "description": "Search the document collection and return the most relevant documents.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "Words to look for, e.g. a question or key phrases."}},
            "required": ["query"]}}}
    CONFIG_KEYS = ("index", "url", "top_k", "max_chars", "timeout_s", "title_weight", "text_weight")

    def __init__(self, config: Optional[dict] = None, tool_schema: Optional[dict] = None):
        super().__init__(config, tool_schema)
        unknown = set(self.config) - set(self.CONFIG_KEYS)
        if unknown:
            raise ConfigError(f"search tool: unknown config keys {sorted(unknown)}; known: {list(self.CONFIG_KEYS)}")
        index, url = self.config.get("index"), self.config.get("url")
        if bool(index) == bool(url):
            raise ConfigError("search tool: set exactly one of 'index' (a local index; build it with: "
                              f"{BUILD_COMMAND.format(index='INDEX.db')}) and 'url' (a search service)")
        self.top_k = int(self.config.get("top_k", 3))
        self.max_chars = int(self.config.get("max_chars", 600))
        if not 1 <= self.top_k <= MAX_K or self.max_chars < 1:
            raise ConfigError(f"search tool: top_k must be in [1, {MAX_K}] and max_chars >= 1, "
                              f"got {self.top_k} and {self.max_chars}")
        if index:
            self.backend: Any = SearchIndex(index, title_weight=self.config.get("title_weight", 1.0),
                                            text_weight=self.config.get("text_weight", 1.0))
        else:
            self.backend = RemoteSearch(url, float(self.config.get("timeout_s", 10.0)))

    async def search(self, query: str, k: Optional[int] = None) -> list[Hit]:
        k = k or self.top_k
        if isinstance(self.backend, SearchIndex):
            return await asyncio.to_thread(self.backend.search, query, k)
        return await self.backend.search(query, k)

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> ToolResult:
        query = parameters.get("query") if isinstance(parameters, dict) else None
        if not isinstance(query, str) or not query.strip():
            return ToolResult("Error: search() needs a 'query' argument: the words to look for.", status="error")
        try:
            hits = await self.search(query)
        except SearchError as e:
            return ToolResult(f"Error: {e}", status="error")
        return ToolResult(format_hits(hits, self.max_chars), metrics={"hits": len(hits)})


# ------------------------------------------------------------------------------------------------
# the HTTP service
# ------------------------------------------------------------------------------------------------
def make_app(index: SearchIndex) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "docs": index.num_docs, "index": str(index.path)})

    async def search(request: web.Request) -> web.Response:
        payload = await read_json_object(request, ("query", "k"))
        if not isinstance(payload.get("query"), str):
            raise ServiceError(400, "bad_request", 'expected {"query": str, "k"?: int}')
        k = payload.get("k", 3)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise ServiceError(400, "bad_request", f"'k' must be an integer in [1, {MAX_K}], got {k!r}")
        hits = await asyncio.to_thread(index.search, payload["query"], k)
        return web.json_response({"results": [h.as_dict() for h in hits]})

    app = web.Application(middlewares=[error_middleware()])
    app.router.add_get("/health", health)
    app.router.add_post("/search", search)
    return app


@contextlib.asynccontextmanager
async def serve(index: str | os.PathLike | SearchIndex, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``index`` in this event loop; yields ``http://host:port`` (the real port when ``port=0``)."""
    idx = index if isinstance(index, SearchIndex) else SearchIndex(index)
    try:
        async with serve_app(make_app(idx), host, port, shutdown_timeout=1.0) as url:
            yield url
    finally:
        if idx is not index:
            idx.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_agentic.tools.search",
                                 description="Build, query and serve BM25 (SQLite FTS5) search indexes.")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="index a jsonl corpus")
    b.add_argument("corpus", help="jsonl file, one JSON object per line")
    b.add_argument("index", help="the index file to write (SQLite)")
    b.add_argument("--text-field", default="text", help="the document text (dotted paths allowed; default: text)")
    b.add_argument("--title-field", default="title", help="the title, searched too ('' = none; default: title)")
    b.add_argument("--id-field", default="id", help="the document id ('' = line number; default: id)")
    b.add_argument("--force", action="store_true", help="rebuild even when the index is up to date")
    b.add_argument("--quiet", action="store_true", help="no progress output")
    q = sub.add_parser("query", help="print the best documents for a query")
    q.add_argument("index")
    q.add_argument("query")
    q.add_argument("-k", type=int, default=3)
    q.add_argument("--max-chars", type=int, default=300)
    s = sub.add_parser("serve", help="serve an index over HTTP (POST /search, GET /health)")
    s.add_argument("index")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8200, help="0 = a free port (printed)")
    args = ap.parse_args(argv)
    try:
        if args.command == "build":
            build_index(args.corpus, args.index, text_field=args.text_field, title_field=args.title_field or None,
                        id_field=args.id_field or None, force=args.force, progress=not args.quiet)
        elif args.command == "query":
            for rank, hit in enumerate(SearchIndex(args.index).search(args.query, args.k), 1):
                print(f"#{rank}  id={hit.id}  score={hit.score:.3f}\n{format_hits([hit], args.max_chars)[4:]}\n")
        else:
            index = SearchIndex(args.index)
            asyncio.run(run_until_signalled(serve(index, args.host, args.port),
                                            lambda url: f"search server listening on {url} ({index.num_docs} docs)"))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
