"""The README's and docs/ pages' commands, run as written (`make test-docs`), and their hygiene.

Every fenced ```bash and ```python block of README.md and docs/*.md is either run by
`make test-docs` (pytest marker `docs`) or carries a skip reason in the page itself. The
conventions, which docs/testing.md documents for writers:

- A ```bash block runs as one bash script in a scratch folder (one folder per page, shared by the
  page's blocks in order), command by command; each must exit 0. The folder starts with a copy of
  the demo index, ``demo-index``, which `make demo` built once for the whole run, and with
  ``relsearch/data`` and ``tools`` reachable as from the repository root.
- ``# → TEXT`` after a command (or on its own line right under it) is what the command must
  print (stdout and stderr together). Fragments separated by `` … `` must appear in that order.
  In a ```python block the same comments check the whole block's output.
- ``<!-- test-docs: skip: REASON -->`` as the last line before a block skips it; the run lists it
  as skipped with REASON. ``<!-- test-docs: skip-command `PREFIX`: REASON -->`` skips only the
  commands of the next block that start with PREFIX (listed the same way).
- ``make demo``, and the ``relsearch index`` line `make demo` runs, are answered from the run
  that built the demo index (its output is checked against their ``# →`` lines); any other
  ``make TARGET`` runs in the repository with ``DEMO_INDEX`` and ``SITE_DIR`` in the scratch
  folder.
- A command that starts ``relsearch serve`` and ends in ``&`` starts a server in the background
  on a free port (``:8000`` in the block's commands becomes that port); the next command waits
  until its /health answers, and the server is stopped when the block ends.
  ``<!-- test-docs: serve INDEX -->`` before a ```python block runs it against
  ``relsearch serve --index INDEX`` the same way.

The default suite checks, quickly, that every block is runnable or skipped with a reason, that
the `relsearch` commands in them name real subcommands and options (`relsearch --help`), that
relative links between the pages resolve, and that the README stays short.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 150

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^`\s]*)")
DIRECTIVE = re.compile(r"^\s*<!--\s*test-docs:\s*(?P<body>.*?)\s*-->\s*$")
SKIP_COMMAND = re.compile(r"^skip-command\s+`(?P<prefix>[^`]+)`\s*:\s*(?P<reason>.+)$")
EXPECT = re.compile(r"(?:^|\s)#\s*→\s*(?P<text>.+?)\s*$")
SHELLS = {"bash", "sh", "shell", "console"}
RUNNABLE = SHELLS | {"python"}
# The one index every run starts from, and the commands whose output that build already gave.
DEMO_INDEX = "demo-index"
DEMO_BUILD = "relsearch index relsearch/data/sp500_2017.jsonl --index demo-index"
FROM_DEMO_RUN = {"make demo", DEMO_BUILD}


@dataclass
class Command:
    line: int  # the page line it starts on
    text: str  # as written, continuation lines joined
    expect: list[str] = field(default_factory=list)


@dataclass
class Block:
    page: Path
    line: int  # the opening fence's line
    lang: str
    body: list[str]
    skip: str | None = None
    skip_commands: dict[str, str] = field(default_factory=dict)  # prefix -> reason
    serve: str | None = None  # a python block run against `relsearch serve --index SERVE`
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def commands(self) -> list[Command]:
        """The block's commands: comments dropped, continuations joined, `# →` lines kept."""
        out: list[Command] = []
        pending: list[str] = []
        start = 0
        for offset, raw in enumerate(self.body):
            line = raw.rstrip()
            if not pending:
                stripped = line.strip()
                if not stripped:
                    continue
                if stripped.startswith("#"):
                    m = EXPECT.match(stripped)
                    if m and out:  # an expectation on its own line: the command above
                        out[-1].expect.extend(_fragments(m["text"]))
                    continue
                start = self.line + 1 + offset
            pending.append(line)
            if line.endswith("\\"):
                continue
            text = "\n".join(pending)
            pending = []
            m = EXPECT.search(text)
            expect = _fragments(m["text"]) if m else []
            out.append(Command(start, text, expect))
        return out

    def expectations(self) -> list[str]:
        return [frag for raw in self.body for m in [EXPECT.search(raw)] if m for frag in _fragments(m["text"])]


def _fragments(text: str) -> list[str]:
    return [part.strip() for part in text.split(" … ") if part.strip()]


def parse(page: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    directives: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        d = DIRECTIVE.match(line)
        if d:
            directives.append((i + 1, d["body"]))
            i += 1
            continue
        m = FENCE.match(line)
        if not m:
            if line.strip() and directives:
                blocks.append(Block(page, directives[0][0], "", [],
                                    problems=[f"line {n}: test-docs directive not followed by a code block"
                                              for n, _ in directives]))
                directives = []
            i += 1
            continue
        fence, info = m["fence"], m["info"].lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(m["indent"]):] if lines[j].startswith(m["indent"]) else lines[j])
            j += 1
        block = Block(page, i + 1, info, body)
        for n, text in directives:
            if text.startswith("skip:"):
                reason = text[len("skip:"):].strip()
                block.skip = reason
                if not reason:
                    block.problems.append(f"line {n}: skip without a reason")
            elif (sc := SKIP_COMMAND.match(text)):
                block.skip_commands[sc["prefix"].strip()] = sc["reason"].strip()
            elif text.startswith("serve "):
                block.serve = text[len("serve "):].strip()
            else:
                block.problems.append(f"line {n}: unknown test-docs directive {text!r}")
        directives = []
        blocks.append(block)
        i = j + 1
    if directives:
        blocks.append(Block(page, directives[0][0], "", [], problems=["test-docs directive at the end of the page"]))
    return blocks


ALL_BLOCKS = [b for page in PAGES for b in parse(page)]
CODE_BLOCKS = [b for b in ALL_BLOCKS if b.lang in RUNNABLE]


def _skipped(block: Block, command: Command) -> str | None:
    for prefix, reason in block.skip_commands.items():
        if command.text.startswith(prefix):
            return reason
    return None


def _items():
    """One pytest item per runnable block, and one per skipped block or skipped command."""
    for block in CODE_BLOCKS:
        if block.skip is not None:
            yield pytest.param(block, None, id=f"{block.name} skipped")
            continue
        if block.lang in SHELLS:
            for command in block.commands():
                if _skipped(block, command):
                    yield pytest.param(block, command, id=f"{block.name} {command.text.split(chr(10))[0][:40]}")
        yield pytest.param(block, "run", id=block.name)


# ---------------------------------------------------------------- the default suite: hygiene


def test_every_fence_is_labelled_and_every_directive_is_well_formed():
    problems = [f"{b.name}: {p}" for b in ALL_BLOCKS for p in b.problems]
    problems += [f"{b.name}: a code block without a language (```text for output, ```bash for commands)"
                 for b in ALL_BLOCKS if not b.lang and not b.problems]
    for block in CODE_BLOCKS:
        if block.lang == "python" and block.skip_commands:
            problems.append(f"{block.name}: skip-command applies to bash blocks only")
        if block.lang != "python" and block.serve:
            problems.append(f"{block.name}: serve applies to python blocks only (bash: `relsearch serve ... &`)")
        commands = block.commands() if block.lang in SHELLS else []
        for prefix in block.skip_commands:
            if not any(c.text.startswith(prefix) for c in commands):
                problems.append(f"{block.name}: skip-command `{prefix}` matches no command of the block")
    assert not problems, "\n".join(problems)


COMMAND_LINE = re.compile(r"^\s*(\$ )?(relsearch (index|query|lookup|serve|train|bench|score|relations|delete|compact"
                          r"|snapshots|rollback)\b|make [a-z]|curl |python (-|tools/))")


def test_command_lines_live_in_bash_blocks():
    """A command shown in a ```text block (or unlabelled) would be neither run nor skipped."""
    problems = []
    for block in ALL_BLOCKS:
        if block.lang in RUNNABLE or block.problems:
            continue
        for n, line in enumerate(block.body):
            if COMMAND_LINE.match(line):
                problems.append(f"{block.name}+{n + 1}: {line.strip()[:80]}")
    for page in PAGES:  # indented code blocks: neither run nor skipped either
        fenced, previous = False, ""
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if FENCE.match(line):
                fenced = not fenced
            elif not fenced and line.startswith("    ") and (not previous.strip() or previous.startswith("    ")) \
                    and COMMAND_LINE.match(line):
                problems.append(f"{page.relative_to(REPO)}:{n} (an indented block): {line.strip()[:80]}")
            previous = line
    assert not problems, "commands outside ```bash blocks:\n" + "\n".join(problems)


def _simple_commands(text: str) -> list[list[str]]:
    """Split a shell line into simple commands (at ; && || | &), words unquoted, comments dropped."""
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out, current = [], []
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: not for this check
        return []
    for token in tokens:
        if set(token) <= set(";&|()"):
            out.append(current)
            current = []
        else:
            current.append(token)
    out.append(current)
    return [c for c in out if c]


def _relsearch_calls():
    for block in CODE_BLOCKS:
        if block.lang not in SHELLS:
            continue
        for command in block.commands():
            for words in _simple_commands(command.text):
                while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value relsearch ...
                    words = words[1:]
                if words and words[0] == "relsearch":
                    yield block, command, words


def _cli_problems(words: list[str]) -> list[str]:
    """What is wrong with one `relsearch ...` call against the CLI's own definitions (--help)."""
    import click

    from relsearch.cli import cli

    command, i = cli, 1
    while isinstance(command, click.Group) and i < len(words) and not words[i].startswith("-"):
        sub = command.get_command(None, words[i])
        if sub is None:
            return [f"`relsearch {' '.join(words[1:i + 1])}` is not a command"]
        command, i = sub, i + 1
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"-h", "--help", "--version"}
    lenient = (command.context_settings or {}).get("ignore_unknown_options", False)
    problems = []
    for word in words[i:]:
        word = word.strip("[]")
        if not word.startswith("-") or word in {"-", "--"} or re.match(r"^-\d", word):
            continue
        name = word.split("=", 1)[0]
        if name in known or (lenient and ("_" in name or name == "--runner")):  # Beam's own options
            continue
        problems.append(f"`relsearch {' '.join(words[1:i])}` has no option {name}")
    return problems


def test_relsearch_commands_name_real_subcommands_and_options():
    """Every `relsearch ...` line, run or skipped, against the CLI's own definitions (--help)."""
    assert _cli_problems(["relsearch", "query", "x", "--index", "i", "--relaton", "r"]) == [
        "`relsearch query` has no option --relaton"]
    assert _cli_problems(["relsearch", "bench", "linkprd"]) == ["`relsearch bench linkprd` is not a command"]
    problems = [f"{block.page.relative_to(REPO)}:{command.line}: {problem}"
                for block, command, words in _relsearch_calls() for problem in _cli_problems(words)]
    assert not problems, "\n".join(problems)


def _slug(text: str) -> str:
    """Python-Markdown's toc slug (what mkdocs links to), close to GitHub's for plain headings."""
    text = re.sub(r"`|\*\*|\*", "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    anchors, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            anchors.add(_slug(m[1]))
    return anchors


LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _links(page: Path):
    fenced = False
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            yield n, m["target"]


def test_relative_links_resolve():
    """Links between the README and docs/ pages (and their #anchors) point at something."""
    problems = []
    for page in PAGES:
        for n, target in _links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}:{n}"
            if not dest.exists():
                problems.append(f"{where}: {target} does not exist")
                continue
            if page.parent.name == "docs" and dest.parent != REPO / "docs" and dest != REPO / "README.md":
                problems.append(f"{where}: {target} leaves docs/ (the site cannot serve it; name the file in `code`)")
            if page.name == "README.md" and path and dest.suffix == ".md" and dest.parent != REPO / "docs":
                problems.append(f"{where}: {target}: the README links to docs/ pages only")
            if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_in_the_site_nav():
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [p.name for p in PAGES if p.parent.name == "docs" and p.name not in nav]
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"


def test_the_readme_stays_a_ten_minute_read():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): put reference and measurements in docs/")


def test_make_demo_indexes_what_the_docs_say_it_does():
    """The docs answer DEMO_BUILD from `make demo`'s run: the Makefile's demo must run exactly that."""
    recipe = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "$(RELSEARCH) index relsearch/data/sp500_2017.jsonl --index $(DEMO_INDEX)" in recipe
    assert DEMO_BUILD.endswith(f"--index {DEMO_INDEX}")


# ---------------------------------------------------------------- `make test-docs`: run them


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """`make demo` once, into a scratch DEMO_INDEX: its output answers FROM_DEMO_RUN."""
    folder = tmp_path_factory.mktemp("demo")
    venv = Path(sys.prefix)
    proc = subprocess.run(["make", "-C", str(REPO), "demo", f"DEMO_INDEX={folder / DEMO_INDEX}", f"VENV={venv}"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), timeout=1500)
    out = folder / "make-demo.out"
    out.write_text(proc.stdout)
    assert proc.returncode == 0, f"make demo failed ({proc.returncode}):\n{proc.stdout[-4000:]}"
    return folder


_SCRATCH: dict[Path, Path] = {}


def _scratch(page: Path, demo: Path, tmp_path_factory) -> Path:
    """One folder per page, shared by its blocks in order, starting from a copy of the demo index."""
    if page not in _SCRATCH:
        folder = tmp_path_factory.mktemp(page.stem)
        shutil.copytree(demo / DEMO_INDEX, folder / DEMO_INDEX, symlinks=True)
        (folder / "relsearch").mkdir()
        (folder / "relsearch" / "data").symlink_to(REPO / "relsearch" / "data")
        (folder / "tools").symlink_to(REPO / "tools")
        venv = Path(sys.prefix)
        (folder / ".venv").symlink_to(venv)
        _SCRATCH[page] = folder
    return _SCRATCH[page]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    # the scratch folder's relsearch/data would otherwise shadow the installed package for `python -c`
    env["PYTHONSAFEPATH"] = "1"
    env.pop("VIRTUAL_ENV", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _script(block: Block, folder: Path, demo: Path) -> tuple[str, list[Command]]:
    port = _free_port()
    serves = any(c.text.startswith("relsearch serve") for c in block.commands())
    lines = ["__bg=''", "trap 'for p in $__bg; do kill $p 2>/dev/null; done; wait 2>/dev/null' EXIT", "exec 2>&1"]
    commands = []
    for n, command in enumerate(block.commands()):
        if _skipped(block, command):
            continue
        commands.append(command)
        text = command.text
        if serves:
            text = re.sub(r"(localhost|127\.0\.0\.1):8000\b", rf"\g<1>:{port}", text)
        core = re.sub(r"\s+#[^'\"]*$", "", text).rstrip()  # the command without its comment
        if core in FROM_DEMO_RUN:
            text = core = f"cat {shlex.quote(str(demo / 'make-demo.out'))}"
        elif core.startswith("make "):
            text = core = (f"make -C {shlex.quote(str(REPO))} {core[len('make '):]} DEMO_INDEX={folder / DEMO_INDEX} "
                           f"SITE_DIR={folder / 'site'} VENV={Path(sys.prefix)}")
        background = core.endswith("&") and not core.endswith("&&")
        lines.append(f"printf '\\n@@test-docs {n} begin@@\\n'")
        if background:  # its output goes to a log, shown in its own section once it is up
            if core.startswith("relsearch serve") and "--port" not in core:
                core = core.replace("relsearch serve", f"relsearch serve --port {port}", 1)
            log = shlex.quote(str(folder / f"background-{block.line}-{n}.log"))
            lines.append(f"{core[:-1].rstrip()} > {log} 2>&1 &")
            lines.append("__bg=\"$__bg $!\"")
            if core.startswith("relsearch serve"):
                lines.append(f"for i in $(seq 600); do curl -sf 127.0.0.1:{port}/health >/dev/null && break; sleep 0.5; done")
            lines.append(f"cat {log}; printf '\\n@@test-docs {n} end 0@@\\n'")
            continue
        lines.append(text)
        lines.append(f"__rc=$?; printf '\\n@@test-docs {n} end %d@@\\n' $__rc; [ $__rc -eq 0 ] || exit $__rc")
    return "\n".join(lines) + "\n", commands


def _start_server(folder: Path, index: str, port: int) -> subprocess.Popen:
    log = open(folder / f"serve-{port}.log", "w")  # noqa: SIM115 (the server's lifetime)
    server = subprocess.Popen(["relsearch", "serve", "--index", index, "--port", str(port)], cwd=folder,
                              env=_env(), stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        if server.poll() is not None:
            break
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise AssertionError(f"relsearch serve --index {index} did not start:\n{(folder / log.name).read_text()[-3000:]}")


def _check_in_order(output: str, fragments: list[str]) -> str | None:
    at = 0
    for frag in fragments:
        found = output.find(frag, at)
        if found < 0:
            return frag
        at = found + len(frag)
    return None


def _run(block: Block, folder: Path, demo: Path) -> str | None:
    """Run one block in ``folder``; None when it did what the page says, else what went wrong."""
    if block.lang == "python":
        script = folder / f"block-{block.line}.py"
        code = "\n".join(block.body) + "\n"
        server = None
        if block.serve:
            port = _free_port()
            code = re.sub(r"(localhost|127\.0\.0\.1):8000\b", rf"\g<1>:{port}", code)
            server = _start_server(folder, block.serve, port)
        script.write_text(code)
        try:
            proc = subprocess.run([sys.executable, script.name], cwd=folder, env=_env(), timeout=900,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=60)
        if proc.returncode != 0:
            return f"{block.name} exited {proc.returncode}:\n{proc.stdout[-4000:]}"
        missing = _check_in_order(proc.stdout, block.expectations())
        return None if missing is None else f"{block.name}: the output lacks {missing!r}:\n{proc.stdout[-4000:]}"
    text, commands = _script(block, folder, demo)
    script = folder / f"block-{block.line}.sh"
    script.write_text(text)
    proc = subprocess.run(["bash", script.name], cwd=folder, env=_env(), timeout=900,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    parts = re.split(r"\n?@@test-docs (\d+) (begin|end(?: -?\d+)?)@@\n", proc.stdout)
    outputs: dict[int, str] = {}
    codes: dict[int, int] = {}
    for i in range(1, len(parts) - 2, 3):
        n, kind, following = int(parts[i]), parts[i + 1], parts[i + 2]
        if kind == "begin":
            outputs[n] = following
        else:
            codes[n] = int(kind.split()[1])
    for n, command in enumerate(block.commands()):
        if command not in commands:
            continue
        where = f"{block.page.relative_to(REPO)}:{command.line}: {command.text.splitlines()[0][:100]}"
        out = outputs.get(n)
        if out is None:
            return f"{where}: never ran (the block stopped before it):\n{proc.stdout[-3000:]}"
        if codes.get(n) != 0:
            return f"{where}: exit status {codes.get(n)}:\n{out[-3000:]}"
        missing = _check_in_order(out, command.expect)
        if missing is not None:
            return f"{where}: the output lacks {missing!r}:\n{out[-3000:]}"
    if proc.returncode != 0:
        return f"{block.name}: the script exited {proc.returncode}:\n{proc.stdout[-3000:]}"
    return None


def test_the_runner_catches_what_the_text_gets_wrong(tmp_path):
    """The machinery itself, on made-up blocks (no relsearch): a wrong `# →`, a failing command."""
    page = REPO / "docs" / "made-up.md"

    def block(*lines: str, lang: str = "bash") -> Block:
        return Block(page, 1, lang, list(lines))

    demo = tmp_path
    assert _run(block("X=hello", "echo $X world   # → hello … world", "printf 'a\\nb\\n'", "# → a … b"),
                tmp_path, demo) is None
    wrong = _run(block("echo hello   # → goodbye"), tmp_path, demo)
    assert wrong and "lacks 'goodbye'" in wrong
    order = _run(block("echo b a   # → a … b"), tmp_path, demo)
    assert order and "lacks 'b'" in order
    failing = _run(block("echo one", "false", "echo never"), tmp_path, demo)
    assert failing and "exit status 1" in failing and "false" in failing
    assert _run(block("echo hello \\", "  world   # → hello world"), tmp_path, demo) is None
    assert _run(block("print('hi')", "# → hi", lang="python"), tmp_path, demo) is None
    assert "lacks 'bye'" in _run(block("print('hi')  # → bye", lang="python"), tmp_path, demo)
    skipping = Block(page, 1, "bash", ["echo ok   # → ok", "make test"], skip_commands={"make test": "why"})
    assert _run(skipping, tmp_path, demo) is None  # `make test` is not run


@pytest.mark.docs
@pytest.mark.parametrize(("block", "what"), list(_items()))
def test_docs_command(block: Block, what, demo_run, tmp_path_factory):
    if what is None:
        pytest.skip(f"{block.name}: {block.skip}")
    if isinstance(what, Command):
        pytest.skip(f"{block.name}: `{what.text.splitlines()[0]}`: {_skipped(block, what)}")
    problem = _run(block, _scratch(block.page, demo_run, tmp_path_factory), demo_run)
    assert problem is None, problem
