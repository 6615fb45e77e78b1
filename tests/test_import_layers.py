"""The import rule (issue 17), checked by parsing every module of ``verl_agentic``:

- a module imports only from its own layer or below (module-level and function-level imports alike);
- no import cycles, among module-level imports (a package's ``__init__`` included) nor when imports inside
  functions count too (an import moved into a function hides a cycle, it does not remove it);
- no registry imports the built-ins that register into it (they are entry points: ``pyproject.toml``);
- an import of ``verl_agentic`` inside a function says why it is not at the top (start-up time, an
  optional dependency, a worker process): a comment on it, or on the line above its block of imports.

``KNOWN_UPWARD`` lists the upward imports not yet untangled. It may only shrink: an upward import
that is not listed fails, and so does a listed one that is gone (delete its line).
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "verl_agentic"

# lowest first; the longest matching prefix decides a module's layer
LAYERS: list[tuple[str, ...]] = [
    ("interfaces", "stats"),  # stats: the result tables' numbers (standard library only)
    ("registry", "serving", "isolation", "models", "jsonl", "provenance", "monitors", "shm",
     "record"),  # the tape every door records on (tools, interactions and the HTTP clients are its doors)
    ("tools", "interactions", "reward", "sandbox.runtime", "sandbox.client", "envserver.client"),
    ("rollout", "backends"),
    ("tasks", "config",  # config: the hydra files, and what the CLIs and trainers build from them
     "interactions.simulated_user"),  # an interaction that generates with a backend (a language model as the user)
    ("trainer", "verl_plugin", "inspect", "envserver", "sandbox"),  # trainers, the plugin, the services
    ("main_rollout", "main_ppo", "agentic_utils", "reward.compare",
     "replay"),  # CLIs (and every package's __main__)
]

KNOWN_UPWARD: set[tuple[str, str]] = set()

REGISTRIES = {  # registry module -> the entry-point group its built-ins come through
    "rollout.task_spec": "verl_agentic.tasks",
    "tasks.data": "verl_agentic.tasks",
    "reward.scorers": "verl_agentic.scorers",
    "interactions.registry": "verl_agentic.interactions",
    "reward.base": "verl_agentic.reward_managers",
    "tools.registry": "verl_agentic.tools",
    "tools.parsers.base": "verl_agentic.tool_parsers",
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def layer(mod: str) -> int:
    if mod.rpartition(".")[2] == "__main__":
        return len(LAYERS) - 1
    best, found = -1, None
    for i, names in enumerate(LAYERS):
        for n in names:
            if (mod == n or mod.startswith(n + ".")) and len(n) > best:
                best, found = len(n), i
    assert found is not None, f"verl_agentic.{mod} is in no layer: add it to LAYERS"
    return found


def _known(name: str) -> str | None:
    """The module ``name`` (relative to verl_agentic) imports, or its nearest package."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(mod: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for each import of verl_agentic in ``mod``."""
    path = MODULES[mod]
    is_pkg = path.name == "__init__.py"
    out = []

    def add(target: str, node: ast.AST, top: bool) -> None:
        if target == "verl_agentic" or target.startswith("verl_agentic."):
            known = _known(target[len("verl_agentic."):] if "." in target else "")
            if known and known != mod:
                out.append((known, node.lineno, top))

    def walk(node: ast.AST, top: bool) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(ch, False)
            elif isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test):
                continue
            elif isinstance(ch, ast.Import):
                for a in ch.names:
                    add(a.name, ch, top)
            elif isinstance(ch, ast.ImportFrom):
                if ch.level:
                    base = ("verl_agentic." + mod).split(".")
                    base = base if is_pkg else base[:-1]
                    base = base[:len(base) - (ch.level - 1)]
                    prefix = ".".join(base + ([ch.module] if ch.module else []))
                else:
                    prefix = ch.module or ""
                for a in ch.names:
                    full = f"{prefix}.{a.name}"
                    add(full if _known(full[len("verl_agentic."):]) == full[len("verl_agentic."):] else prefix, ch, top)
            else:
                walk(ch, top)

    walk(ast.parse(path.read_text()), True)
    return out


def upward_imports() -> set[tuple[str, str]]:
    return {(mod, target) for mod in MODULES for target, _, _ in imports(mod) if layer(target) > layer(mod)}


def test_every_module_is_in_a_layer():
    for mod in MODULES:
        if mod:
            layer(mod)


def test_no_module_imports_a_layer_above_it():
    found = upward_imports()
    new = sorted(found - KNOWN_UPWARD)
    gone = sorted(KNOWN_UPWARD - found)
    assert not new, "upward imports (move the code down, or the import up): " + ", ".join(f"{a} -> {b}" for a, b in new)
    assert not gone, "fixed, so delete from KNOWN_UPWARD: " + ", ".join(f"{a} -> {b}" for a, b in gone)


def _cycles(function_level: bool = False) -> list[list[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for mod in MODULES:
        for target, _, top in imports(mod):
            if top or function_level:
                graph[mod].add(target)
                parts = target.split(".")  # importing a.b.c runs a/__init__ and a/b/__init__ first
                for i in range(1, len(parts)):
                    pkg = ".".join(parts[:i])
                    if pkg in MODULES and not mod.startswith(pkg + ".") and pkg != mod:
                        graph[mod].add(pkg)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for mod in list(MODULES):
        if mod not in index:
            visit(mod)
    return out


KNOWN_CYCLES: list[list[str]] = []


def test_no_import_cycles():
    assert sorted(_cycles()) == sorted(KNOWN_CYCLES)


def test_no_import_cycles_through_imports_inside_functions():
    """The whole package as ``python3`` would find it: e.g. ``verl_plugin/cpu/vllm_replica.py`` and
    ``vllm_setup.py`` imported each other, one of them inside a function."""
    assert _cycles(function_level=True) == []


def test_the_cycle_check_catches_a_planted_cycle(tmp_path, monkeypatch):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from verl_agentic.planted_b import x\n")
    b.write_text("def f():\n    from verl_agentic.planted_a import y  # on first use\n")
    monkeypatch.setitem(MODULES, "planted_a", a)
    monkeypatch.setitem(MODULES, "planted_b", b)
    assert _cycles() == [] and _cycles(function_level=True) == [["planted_a", "planted_b"]]


def test_registries_do_not_import_their_builtins_and_find_them_as_entry_points():
    groups = tomllib.loads((PKG.parent / "pyproject.toml").read_text())["project"]["entry-points"]
    for registry, group in REGISTRIES.items():
        builtins = {v.removeprefix("verl_agentic.") for v in groups[group].values()}
        assert builtins, group
        for target, line, _ in imports(registry):
            assert not any(target == b or target.startswith(b + ".") for b in builtins), \
                f"verl_agentic/{registry.replace('.', '/')}.py:{line} imports its built-in {target}"
    for group in set(REGISTRIES.values()):
        for name, value in groups[group].items():
            assert _known(value.removeprefix("verl_agentic.")) == value.removeprefix("verl_agentic."), (group, name, value)


def _unexplained_function_level_imports(path: Path, mod: str) -> list[int]:
    lines = path.read_text().splitlines()
    out = []
    for _, line, top in imports(mod):
        if top:
            continue
        i = line - 1  # walk up the block of import lines this one belongs to
        while i > 0 and lines[i - 1].lstrip().startswith(("from ", "import ")):
            i -= 1
        block = lines[i - 1:line] if i > 0 else lines[:line]
        if not any("#" in text for text in block):
            out.append(line)
    return out


def test_function_level_imports_say_why():
    missing = [f"verl_agentic/{MODULES[m].relative_to(PKG)}:{line}" for m in MODULES
               for line in _unexplained_function_level_imports(MODULES[m], m)]
    assert not missing, "function-level imports without a reason (move them to the top, or say why): " + \
        ", ".join(missing)


def test_the_layer_check_catches_a_planted_upward_import(tmp_path, monkeypatch):
    """The checker is not vacuous: an import of a task from the reward layer is reported."""
    planted = tmp_path / "planted.py"
    planted.write_text("from verl_agentic.tasks.gsm8k import extract_answer\n\n\ndef f():\n    import verl_agentic.trainer\n")
    monkeypatch.setitem(MODULES, "reward.planted", planted)
    assert {("reward.planted", "tasks.gsm8k"), ("reward.planted", "trainer")} <= upward_imports()
    assert _unexplained_function_level_imports(planted, "reward.planted") == [5]


def _silent_broad_excepts(path: Path) -> list[int]:
    """Lines of ``except Exception`` / ``except BaseException`` / bare ``except`` handlers that neither raise
    nor report the exception (use the name they bind) with a comment on the ``except`` line saying why going
    on is safe."""
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ExceptHandler):
            continue
        caught = node.type
        broad = caught is None or (isinstance(caught, ast.Name) and caught.id in ("Exception", "BaseException"))
        if not broad:
            continue
        body = [n for stmt in node.body for n in ast.walk(stmt)]
        if any(isinstance(n, ast.Raise) for n in body):
            continue
        reported = any((isinstance(n, ast.Name) and n.id == node.name) or (isinstance(n, ast.Attribute) and n.attr in (
            "format_exc", "print_exc", "exception")) for n in body)
        if not (reported and "#" in lines[node.lineno - 1]):
            out.append(node.lineno)
    return out


def test_no_broad_except_is_silent():
    """Issue 37: each ``except Exception`` either re-raises, or reports the exception with the reason it is
    safe to go on (a comment on its line); none swallows it."""
    silent = [f"verl_agentic/{MODULES[m].relative_to(PKG)}:{line}" for m in MODULES
              for line in _silent_broad_excepts(MODULES[m])]
    assert not silent, "broad excepts that neither raise nor report (with the reason): " + ", ".join(silent)


def test_the_broad_except_check_catches_a_silent_one(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    try:\n        g()\n    except Exception:\n        return None\n    try:\n"
                       "        g()\n    except Exception as e:  # reported: the caller shows it\n        return str(e)\n"
                       "    try:\n        g()\n    except Exception as e:\n        return str(e)\n")
    assert _silent_broad_excepts(planted) == [4, 12]
