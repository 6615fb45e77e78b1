"""Where the package changes verl, vLLM, transformers or torch: found by reading its source (``ast``).

A *patch site* is, in any module of ``verl_agentic``:

- a store (``=``, ``+=``, ``del``, ``setattr``) to an attribute of an upstream name, or to an item of one
  (``verl_module._REGISTRY[key] = ...``). An upstream name is bound by importing verl, vllm, transformers
  or torch, or by taking an attribute of an upstream name (``cls = module.Trainer``), or is a module
  fetched from ``sys.modules``; a name bound by ``def``/``class`` in the module is our own;
- a call that registers into upstream (``register*``) or mutates an upstream container
  (``append``, ``update``, ...), e.g. ``PlatformRegistry.register(...)``, ``@register("task_agent")``;
- in ``verl_plugin/``, the same on a function's parameter (other than ``self``/``cls``) or a name taken
  from one: verl hands the plugin its own objects (a trainer, a module just imported);
- a change to the import system (``sys.meta_path``, ``sys.modules``).

Each site is named ``<path under verl_agentic>: <expression>``, e.g.
``verl_plugin/cpu/patches.py: fsdp.CPUOffloadPolicy``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "verl_agentic"
UPSTREAM = ("verl", "vllm", "transformers", "torch")
MUTATORS = {"append", "insert", "extend", "update", "setdefault", "pop", "popitem", "clear", "remove", "discard",
            "add", "__setitem__", "__delitem__"}
IMPORT_SYSTEM = ("sys.meta_path", "sys.modules")


def _is_upstream_module(name: str) -> bool:
    return name.split(".")[0] in UPSTREAM


def _root(node: ast.AST) -> str | None:
    """The name an attribute/item chain starts from (``a`` in ``a.b[c].d``), if it starts from a name."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _chain(node: ast.AST) -> str:
    """``a.b.c`` for an attribute chain (items dropped), else ''."""
    parts = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _scope_nodes(body: list[ast.stmt]):
    """The nodes of a scope, not descending into nested functions (they are scopes of their own)."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        for child in reversed(list(ast.iter_child_nodes(node))):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield child  # seen (its name, its decorators), not entered
                stack.extend(reversed(child.decorator_list if not isinstance(child, ast.Lambda) else []))
                continue
            stack.append(child)


def _sys_modules_lookup(node: ast.AST) -> bool:
    """``sys.modules.get("verl...")`` or ``sys.modules["verl..."]``."""
    if isinstance(node, ast.Call) and _chain(node.func) == "sys.modules.get" and node.args:
        arg = node.args[0]
    elif isinstance(node, ast.Subscript) and _chain(node.value) == "sys.modules":
        arg = node.slice
    else:
        return False
    return isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _is_upstream_module(arg.value)


def _sites_in_scope(body: list[ast.stmt], outer: set[str], params: set[str], out: list[tuple[int, str]]) -> None:
    nodes = list(_scope_nodes(body))
    own = {n.name for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    tracked = (set(outer) | params) - own
    for node in nodes:  # imports of upstream modules
        if isinstance(node, ast.Import):
            tracked |= {(a.asname or a.name.split(".")[0]) for a in node.names if _is_upstream_module(a.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and _is_upstream_module(node.module or ""):
            tracked |= {(a.asname or a.name) for a in node.names}
    changed = True
    while changed:  # names taken from tracked names (attribute chains), or upstream modules from sys.modules
        changed = False
        for node in nodes:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name, value = node.targets[0].id, node.value
                derived = (isinstance(value, (ast.Attribute, ast.Name)) and _root(value) in tracked) \
                    or _sys_modules_lookup(value)
                if derived and name not in tracked and name not in own:
                    tracked.add(name)
                    changed = True

    def flagged(target: ast.AST) -> bool:
        if isinstance(target, ast.Attribute):
            return _root(target.value) in tracked or _chain(target.value) in IMPORT_SYSTEM
        if isinstance(target, ast.Subscript):
            return _chain(target.value) in IMPORT_SYSTEM or (
                isinstance(target.value, ast.Attribute) and _root(target.value) in tracked)
        return False

    for node in nodes:
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                if flagged(t):
                    out.append((node.lineno, ast.unparse(t)))
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "setattr" and node.args and _root(node.args[0]) in tracked:
                out.append((node.lineno, f"setattr({ast.unparse(node.args[0])}, ...)"))
            elif isinstance(func, ast.Name) and func.id in tracked and func.id.startswith("register"):
                out.append((node.lineno, f"{func.id}(...)"))
            elif isinstance(func, ast.Attribute) and (_root(func.value) in tracked or _chain(func.value) in IMPORT_SYSTEM) \
                    and (func.attr in MUTATORS or func.attr.startswith("register")):
                out.append((node.lineno, f"{ast.unparse(func)}(...)"))
    for node in nodes:  # nested scopes see this scope's names
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} - {"self", "cls"}
            _sites_in_scope(node.body, tracked, names if params is not _NO_PARAMS else _NO_PARAMS, out)


_NO_PARAMS: set[str] = set()  # outside verl_plugin/: parameters are not followed


def sites_in(path: Path, rel: str) -> list[tuple[int, str]]:
    """(line, expression) of each patch site in one module (``rel``: its path under verl_agentic)."""
    out: list[tuple[int, str]] = []
    tree = ast.parse(path.read_text())
    _sites_in_scope(tree.body, set(), set() if rel.startswith("verl_plugin/") else _NO_PARAMS, out)
    return sorted(set(out))


def patch_sites(root: Path = PKG) -> dict[str, list[int]]:
    """Every patch site of the package: ``"<path>: <expression>"`` -> the lines it is on."""
    found: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for line, expr in sites_in(path, rel):
            found.setdefault(f"{rel}: {expr}", []).append(line)
    return found
