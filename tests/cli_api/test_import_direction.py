"""Imports flow one way (design.md §2): every import of every module — top level or inside a
function — may only point down these layers. A new arrow against them fails here, naming it."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# source folder → the installed package it is (setup.cfg package_dir)
PACKAGES = ("encoder", "indexer", "retrieval", "pipelines", "bench")
# What each layer may import besides itself. "base" is the package root every layer sits on
# (relsearch/__init__.py: the version; relsearch/faults.py: the test-only kill points both writers
# use); "api" is the Python API, the HTTP server and client (relsearch/api.py, serve/, client.py);
# "cli" is the rest of relsearch/ (click commands). explorer.py, completion.py: the server's helpers for the explorer page.
ALLOWED = {
    "base": set(),
    "encoder": {"base"},
    "indexer": {"base"},
    "retrieval": {"base", "encoder", "indexer"},
    "pipelines": {"base", "encoder", "indexer", "retrieval"},
    "api": {"base", "encoder", "indexer", "retrieval", "pipelines"},
    "bench": {"base", "encoder", "indexer", "retrieval", "pipelines", "api"},
    "cli": {"base", "encoder", "indexer", "retrieval", "pipelines", "api", "bench"},
}
API_MODULES = {"api", "serve", "client", "explorer", "completion"}
# relsearch/__init__.py re-exports the API lazily (module __getattr__): its own imports are not an arrow
EXEMPT = {"relsearch/__init__.py"}


def _layer(dotted: tuple[str, ...]) -> str:
    """The layer of an absolute module path inside the installed package (``relsearch.x.y``)."""
    if len(dotted) == 1 or dotted[1] in ("faults", "files", "version"):
        return "base"
    if dotted[1] in PACKAGES:
        return dotted[1]
    if dotted[1] in API_MODULES:
        return "api"
    cli_module = (ROOT / "relsearch" / f"{dotted[1]}.py").is_file() or (ROOT / "relsearch" / dotted[1]).is_dir()
    return "cli" if cli_module else "base"


def _module_path(folder: str, file: Path) -> tuple[str, ...]:
    parts = file.relative_to(ROOT / folder).with_suffix("").parts
    inner = () if folder == "relsearch" else (folder,)
    return ("relsearch", *inner, *parts)


def _imports(module: tuple[str, ...], tree: ast.AST, is_package: bool):
    """Absolute ``relsearch.*`` module paths imported anywhere in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "relsearch":
                    yield tuple(alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module[:-1]
                base = base[:len(base) - (node.level - 1)]
            else:
                base = ()
            target = base + tuple(node.module.split(".") if node.module else ())
            if target[:1] != ("relsearch",):
                continue
            if node.module is None:  # from . import x: each name is a module
                yield from (target + (alias.name,) for alias in node.names)
            else:
                yield target


def arrows_against_the_design() -> list[str]:
    wrong = []
    for folder in (*PACKAGES, "relsearch"):
        for file in sorted((ROOT / folder).rglob("*.py")):
            if str(file.relative_to(ROOT)) in EXEMPT:
                continue
            module = _module_path(folder, file)
            is_package = file.name == "__init__.py"
            if is_package:
                module = module[:-1]
            here = _layer(module)
            for target in _imports(module, ast.parse(file.read_text(encoding="utf-8")), is_package):
                there = _layer(target)
                if there != here and there not in ALLOWED[here]:
                    wrong.append(f"{file.relative_to(ROOT)}: {here} imports {'.'.join(target)} ({there})")
    return wrong


def test_imports_flow_one_way():
    assert arrows_against_the_design() == []


# Inside the HTTP server (relsearch/serve/, its __init__ lists them): each module imports only those before it here.
SERVE_ORDER = ("models", "errors", "metrics", "batching", "security", "served", "routers", "app")


def arrows_inside_the_server() -> list[str]:
    wrong = []
    for file in sorted((ROOT / "relsearch" / "serve").rglob("*.py")):
        module = _module_path("relsearch", file)
        is_package = file.name == "__init__.py"
        if is_package:
            module = module[:-1]
        if module == ("relsearch", "serve"):
            continue  # the package re-exports every module's names
        if module[2] not in SERVE_ORDER:
            wrong.append(f"{file.relative_to(ROOT)}: not in SERVE_ORDER ({', '.join(SERVE_ORDER)})")
            continue
        for target in _imports(module, ast.parse(file.read_text(encoding="utf-8")), is_package):
            if target[:2] != ("relsearch", "serve") or target[2:3] == module[2:3]:
                continue
            if len(target) == 2 or target[2] not in SERVE_ORDER:
                wrong.append(f"{file.relative_to(ROOT)} imports {'.'.join(target)}: name one of SERVE_ORDER "
                             f"({', '.join(SERVE_ORDER)})")
            elif SERVE_ORDER.index(target[2]) > SERVE_ORDER.index(module[2]):
                wrong.append(f"{file.relative_to(ROOT)} imports {'.'.join(target)}, which comes after it in SERVE_ORDER")
    return wrong


def test_the_server_modules_import_one_way():
    assert arrows_inside_the_server() == []


def test_the_check_sees_imports_inside_functions(tmp_path, monkeypatch):
    """The check itself can fail: a function-level import of pipelines from retrieval is found."""
    tree = ast.parse("def f():\n    from ..pipelines.index import run_index\n")
    found = list(_imports(("relsearch", "retrieval", "search"), tree, is_package=False))
    assert found == [("relsearch", "pipelines", "index")]
    assert _layer(found[0]) == "pipelines" and "pipelines" not in ALLOWED["retrieval"]


def import_cycles() -> list[list[str]]:
    """Groups of modules that import each other, directly or round a loop, counting imports inside
    functions (a cycle hidden in a function still ties the modules into one unit)."""
    modules: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for folder in (*PACKAGES, "relsearch"):
        for file in sorted((ROOT / folder).rglob("*.py")):
            module = _module_path(folder, file)
            is_package = file.name == "__init__.py"
            modules[module[:-1] if is_package else module] = set(
                _imports(module[:-1] if is_package else module, ast.parse(file.read_text(encoding="utf-8")), is_package))
    graph = {}
    for module, targets in modules.items():
        edges = set()
        for target in targets:
            while target and target not in modules:  # `from a.b import name`: the module a.b
                target = target[:-1]
            if target and target != module:
                edges.add(target)
        graph[module] = edges
    # strongly connected groups (Tarjan, iterative)
    index, low, on, stack, groups = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    group.append(".".join(member))
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_module_imports_itself_round_a_loop():
    assert import_cycles() == []


MAX_FILE_LINES, MAX_FUNCTION_LINES, LONG_FUNCTIONS_ALLOWED = 600, 60, 8  # issue 49: units a reader takes in


def test_source_files_and_functions_stay_small():
    """No source file over 600 lines, at most 8 functions over 60 (docstrings and comments count)."""
    big, long = [], []
    for folder in (*PACKAGES, "relsearch"):
        for file in sorted((ROOT / folder).rglob("*.py")):
            text = file.read_text(encoding="utf-8")
            name = str(file.relative_to(ROOT))
            if text.count("\n") > MAX_FILE_LINES:
                big.append(f"{name}: {text.count(chr(10))} lines")
            long += [f"{name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
                     for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert big == []
    assert len(long) <= LONG_FUNCTIONS_ALLOWED, long


def test_each_request_option_is_named_in_at_most_three_source_files():
    """A request's options are declared once (retrieval/request.py): the four issue 49 counted stay
    named in at most three source files (tests aside; tools count), as its checker counts them."""
    sources = [f for folder in (*PACKAGES, "relsearch", "tools") for f in sorted((ROOT / folder).rglob("*.py"))]
    texts = {str(f.relative_to(ROOT)): f.read_text(encoding="utf-8") for f in sources}
    named = {option: [name for name, text in texts.items() if option in text]
             for option in ("facet_depth", "min_score", "hybrid_weight", "unlike")}
    assert {o: files for o, files in named.items() if len(files) > 3} == {}
    assert all(named.values())  # each is still an option somewhere: the check reads the right files
