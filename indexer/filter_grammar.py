"""The ``--filter`` text grammar: one lexer and one recursive-descent parser, shared by every entry point.

``relsearch query --filter`` and ``lookup --filter`` (through retrieval/inputs.py), the explorer's
``POST /filters/parse`` and the page read filter text here, into the JSON form of indexer/filters.py::

    filter     := or_expr END
    or_expr    := and_expr ("or" and_expr)*              loosest: a=1 and b=2 or c=3 is (a=1 and b=2) or c=3
    and_expr   := unary ("and" unary)*
    unary      := ["not"] predicate                      one "not", on one predicate
    predicate  := FIELD OP value | FIELD "in" list | FIELD "has" value
                | FIELD "exists" | FIELD "is" ["not"] "null"
    FIELD      := WORD | STRING
    OP         := = | != | ~= | > | >= | < | <=
    value      := STRING | bare text up to the next " and " / " or " or the end
    list       := "[" item ("," item)* "]"               item: STRING, or bare text up to "," or "]" at its level

Tokens (:func:`tokens`): double-quoted JSON strings (escapes decoded: ``"\\\\"`` is one backslash),
runs of the operator characters ``= ! < > ~``, the brackets ``[ ] { }``, commas, and words (any other
run of non-space characters: numbers, ``and``, ``or``, ``not``, names). Keywords are words in any case.
Bare text is typed by :func:`filter_value` (``1`` a number, ``true`` a boolean, other text a string).
Brackets outside strings nest at most :data:`MAX_FILTER_NESTING` deep; an expression holds at most
MAX_CLAUSES predicates. Anything else is a :class:`FilterSyntaxError`: one line naming the expression,
what was expected and the 1-based character position; nothing is read as something it does not say.
The lexer and the parser loop (no recursion), so no input can exhaust the stack.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .filters import ALL, ANY, MAX_CLAUSES, FilterError

# [ and { outside double quotes nest at most this deep: json.loads recursed once per level (3,000 levels
# raised RecursionError), and no filter value needs more
MAX_FILTER_NESTING = 32
KEYWORDS = ("and", "or", "not")
OP_CHARS = "=!<>~"
_PUNCT = '"[]{},' + OP_CHARS
CMP_OPS = {"=": "eq", "!=": "eq", "~=": "ieq", ">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}
# operators written doubled or reversed → the one meant
DOUBLED = {"==": "=", "=>": ">=", "=<": "<=", "<>": "!=", "!==": "!=", ">==": ">=", "<==": "<=", "~==": "~=",
           "=!": "!=", "=~": "~="}
_OPERATORS = "=, !=, ~=, >, >=, <, <=, in [A,B], has, exists, is [not] null"


class FilterSyntaxError(FilterError):
    """Filter text that cannot be read; ``position``: the 1-based character where reading stopped
    (``len(text) + 1``: at the end)."""

    def __init__(self, text: str, message: str, position: int):
        shown = text if len(text) <= 60 else text[:57] + "..."
        at = f"position {position}" + (" (the end)" if position > len(text) else "")
        super().__init__(f"cannot read filter {shown!r} at {at}: {message}")
        self.position = position


@dataclass(frozen=True)
class Token:
    """``kind``: "string", "word", "op", one of ``[ ] { } ,``, or "end"; ``start``/``end``: its 0-based
    span; ``space``: whitespace comes right before it; ``value``: a string's decoded text."""

    kind: str
    start: int
    end: int
    space: bool
    value: str = ""


def tokens(text: str) -> list[Token]:
    """``text`` → its tokens, the last of kind "end"; FilterSyntaxError for an unterminated string, a
    bad escape, or brackets nested deeper than MAX_FILTER_NESTING."""
    out, i, depth, n = [], 0, 0, len(text)
    while True:
        start = i
        while i < n and text[i].isspace():
            i += 1
        space, start = i > start, i
        if i == n:
            out.append(Token("end", n, n, space))
            return out
        c = text[i]
        if c == '"':
            i = _string_end(text, i)
            try:
                value = json.loads(text[start:i], strict=False)  # strict=False: a tab or newline may be typed
            except json.JSONDecodeError as e:
                raise FilterSyntaxError(text, f"bad escape in the string opened at position {start + 1}",
                                        start + e.pos + 1) from None
            out.append(Token("string", start, i, space, value))
            continue
        if c in OP_CHARS:
            while i < n and text[i] in OP_CHARS:
                i += 1
            out.append(Token("op", start, i, space))
            continue
        if c in "[]{},":
            if c in "[{":
                depth += 1
                if depth > MAX_FILTER_NESTING:
                    raise FilterSyntaxError(text, f"brackets nest more than {MAX_FILTER_NESTING} deep", i + 1)
            elif c in "]}":
                depth = max(depth - 1, 0)
            out.append(Token(c, i, i + 1, space))
            i += 1
            continue
        while i < n and not text[i].isspace() and text[i] not in _PUNCT:
            i += 1
        out.append(Token("word", start, i, space))


def _string_end(text: str, start: int) -> int:
    """The index after the closing quote of the string opened at ``start`` (a backslash escapes the
    character after it); FilterSyntaxError when it is never closed."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    raise FilterSyntaxError(text, f"the string opened at position {start + 1} is never closed", len(text) + 1)


def _no_constant(name: str):
    raise ValueError(name)  # NaN, Infinity: not JSON values, so the text stays a string


def filter_value(text: str):
    """The value a ``--filter FIELD=VALUE`` matches: a JSON number (``1``, ``2.5``; finite), ``true``
    or ``false``, or a JSON string in double quotes (``"1"`` is the string 1); any other text is
    that text as a string (``Financials``, ``null``, ``[1]``)."""
    if text.lstrip()[:1] in ("[", "{"):  # never a scalar: not decoded (a deep one would recurse)
        return text
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return text
    if isinstance(value, float) and not math.isfinite(value):  # 1e999
        return text
    return value if isinstance(value, (str, bool, int, float)) else text


def parse_filter(spec: str) -> tuple[str, str, object, bool]:
    """One ``--filter`` expression → ``(field, operator, value, negated)`` of indexer/filters.py.

    ``FIELD=VALUE`` (typed by :func:`filter_value`), ``FIELD!=VALUE``, ``FIELD>=VALUE`` (also ``>``,
    ``<``, ``<=``), ``FIELD~=TEXT`` (case-insensitive), ``FIELD in [A,B]``, ``FIELD has VALUE``,
    ``FIELD exists``, ``FIELD is [not] null``; ``not`` before one negates it. Several joined by ``and``
    parse to ``("$all", "all", [(field, op, value, negated), ...], False)`` (what :func:`merge_filters`
    reads as separate ``--filter`` options), joined by ``or`` to ``("$any", "any", [filter, ...], False)``
    (``and`` binds tighter). FilterSyntaxError (a ValueError) names the position of anything else.
    """
    return _Parser(spec).parse()


class _Parser:
    def __init__(self, text: str):
        self.text, self.toks, self.i, self.predicates = text, tokens(text), 0, 0

    def fail(self, message: str, tok: Token):
        raise FilterSyntaxError(self.text, message, tok.start + 1)

    def peek(self, ahead: int = 0) -> Token:
        return self.toks[min(self.i + ahead, len(self.toks) - 1)]

    def take(self) -> Token:
        tok = self.peek()
        self.i += tok.kind != "end"
        return tok

    def src(self, tok: Token) -> str:
        return self.text[tok.start:tok.end]

    def got(self, tok: Token) -> str:
        return "" if tok.kind == "end" else f", got {self.src(tok)[:40]!r}"

    def keyword(self, tok: Token, *words: str) -> bool:
        return tok.kind == "word" and self.src(tok).lower() in words

    def joins(self, tok: Token) -> bool:
        """``tok`` ends a bare value: ``and`` / ``or`` after a space."""
        return tok.space and self.keyword(tok, "and", "or")

    def parse(self) -> tuple:
        branches = [self.conjunction(None)]
        while self.keyword(self.peek(), "or"):
            branches.append(self.conjunction(self.take()))
        end = self.peek()
        if end.kind != "end":
            self.fail(f"expected 'and', 'or' or the end{self.got(end)}", end)
        if len(branches) == 1:
            return branches[0]
        return ANY, "any", [merge_filters([b]) for b in branches], False

    def conjunction(self, after: Token | None) -> tuple:
        terms = [self.predicate(after)]
        while self.keyword(self.peek(), "and"):
            terms.append(self.predicate(self.take()))
        return terms[0] if len(terms) == 1 else (ALL, "all", terms, False)

    def predicate(self, after: Token | None) -> tuple:
        self.predicates += 1
        tok = self.peek()
        if self.predicates > MAX_CLAUSES:
            self.fail(f"more than {MAX_CLAUSES:,} expressions joined by 'and' / 'or', at most {MAX_CLAUSES:,} "
                      "are allowed", tok)
        negate = self.keyword(tok, "not") and self.peek(1).kind != "op"  # `not=1`: a field named not
        if negate:
            after = self.take()
        tok = self.take()
        if tok.kind == "string":
            field = tok.value
        elif tok.kind == "word" and not (self.keyword(tok, *KEYWORDS) and self.peek().kind != "op"):
            field = self.src(tok)
        else:
            self.fail(f"expected a field{' after ' + repr(self.src(after)) if after else ''}{self.got(tok)}", tok)
        name, nxt = self.src(tok), self.peek()
        if nxt.kind == "op":
            return self.comparison(field, name, negate)
        word = self.src(nxt).lower() if nxt.kind == "word" else ""
        if word in ("in", "has", "exists", "is"):
            self.take()
        if word == "in":
            return field, "in", self.listed(), negate
        if word == "has":
            return field, "has", filter_value(self.value(nxt)[0]), negate
        if word == "exists":
            return field, "exists", True, negate
        if word == "is":
            null = not self.keyword(self.peek(), "not")
            if not null:
                self.take()
            if not self.keyword(self.peek(), "null"):
                self.fail(f"expected 'null' after '{name} is{'' if null else ' not'}'{self.got(self.peek())}",
                          self.peek())
            self.take()
            return field, "null", null, negate
        hint = " (a field name with spaces goes in double quotes)" if nxt.kind == "word" else ""
        self.fail(f"expected an operator ({_OPERATORS}) after the field {name!r}{self.got(nxt)}{hint}", nxt)

    def comparison(self, field: str, name: str, negate: bool) -> tuple:
        op = self.take()
        written, end, nxt = self.src(op), op.end, self.peek()
        if written in CMP_OPS and nxt.kind == "op":  # `x= =1`, `x = >1`: a value can't start with one unquoted
            written, end = written + self.src(nxt), nxt.end
        if written not in CMP_OPS:
            self.doubled(name, op, written, end)
        value, quoted = self.value(op)
        if not quoted:
            value = value if written == "~=" else filter_value(value)  # ~= compares text: `~=true` is "true"
        return field, CMP_OPS[written], value, negate != (written == "!=")

    def doubled(self, name: str, op: Token, written: str, end: int):
        """Refuse an operator run that is none of CMP_OPS (``==``, ``=>``, ``<>``) naming the form meant."""
        first = next((written[:n] for n in (2, 1) if written[:n] in CMP_OPS), None)
        meant = DOUBLED.get(written, first)
        if meant is None:
            self.fail(f"{written!r} is not an operator (=, !=, ~=, >, >=, <, <=)", op)
        value = _until_joined(self.text[end:])
        message = f"{written!r} is not an operator; write {name}{meant}{value or 'VALUE'}"
        if value:
            quoted = json.dumps(_until_joined(self.text[op.start + len(first):]))
            message += f" (a value that starts with {written[len(first)]!r} goes in double quotes: {name}{first}{quoted})"
        self.fail(message, op)

    def value(self, after: Token) -> tuple[str, bool]:
        """The value after ``after`` (an operator or ``has``): a string token's text (True), or the bare
        text up to the next ``and`` / ``or`` or the end (False)."""
        first = self.peek()
        if first.kind == "end" or self.joins(first):
            self.fail(f"expected a value after {self.src(after)!r}", first)
        if first.kind == "string":
            return self.take().value, True
        word, last = None, first  # word: where the value's latest space-separated word starts
        while (tok := self.peek()).kind != "end" and not self.joins(tok):
            if tok.kind == "string":
                self.fail("a double quote inside an unquoted value; put the whole value in double quotes", tok)
            if tok.space and tok is not first:
                word = tok
            if tok.kind == "op" and word and (self.src(tok) in CMP_OPS or self.src(tok) in DOUBLED):
                # `a=1 b=2` is two filters, not the value "1 b=2"
                self.fail(f"expected 'and' or 'or' before {self.text[word.start:tok.end]!r} (a value holding "
                          "spaces and operators goes in double quotes)", word)
            last = self.take()
        return self.text[first.start:last.end], False

    def listed(self) -> list:
        """``[item, ...]`` after ``in``: each item a string token or bare text typed by filter_value."""
        opened = self.take()
        if opened.kind != "[":
            self.fail(f"'in' takes a list in brackets, e.g. [Energy,Utilities]{self.got(opened)}", opened)
        items = []
        while True:
            first = self.peek()
            if first.kind == "string":
                items.append(self.take().value)
            else:
                items.append(self.item(first))
            sep = self.take()
            if sep.kind == "]":
                return items
            if sep.kind != ",":
                self.fail(f"expected ',' or ']' to close the list opened at position {opened.start + 1}"
                          f"{self.got(sep)}", sep)

    def item(self, first: Token):
        """Bare text from ``first`` to the ``,`` or ``]`` that ends it at its own bracket level."""
        level, last = 0, None
        while (tok := self.peek()).kind != "end" and not (level == 0 and tok.kind in (",", "]")):
            if tok.kind == "string":
                self.fail("a double quote inside an unquoted list value; put the whole value in double quotes",
                          tok)
            level += (tok.kind in ("[", "{")) - (tok.kind in ("]", "}"))
            last = self.take()
        if last is None:
            self.fail("expected a value in the list", first)
        return filter_value(self.text[first.start:last.end])


def read_filters(texts: str | Sequence[str]) -> dict:
    """``--filter`` expressions (one text, or several AND-ed like repeated ``--filter`` options) → the
    JSON form (:func:`parse_filter`, :func:`merge_filters`); a ValueError names the expression at fault."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise FilterError("filter text must be a string or a list of strings")
    return merge_filters([parse_filter(t) for t in texts])


def _until_joined(text: str) -> str:
    """``text`` up to its first `` and `` / `` or ``, spaces collapsed (for messages only)."""
    words = text.split()
    cut = next((j for j, w in enumerate(words) if j and w.lower() in ("and", "or")), len(words))
    return " ".join(words[:cut])


def merge_filters(specs: list[tuple[str, str, object, bool]]) -> dict:
    """Parsed ``--filter`` expressions (AND) → the JSON form: a lone equality stays a plain value,
    anything else becomes ``{operator: value, "not": {...}}``; the same operator twice on a field
    is a ValueError (two values AND-ed would match nothing; use ``in``). An ``and`` expression counts
    as its parts given separately."""
    ops: dict[str, dict] = {}
    anys: list[list] = []
    flat = [part for spec in specs for part in (spec[2] if spec[:2] == (ALL, "all") else [spec])]
    for field, op, value, negate in flat:
        if field == ANY and op == "any":
            anys.append(value)
            continue
        target = ops.setdefault(field, {})
        if negate:
            target = target.setdefault("not", {})
        if op in target:
            raise ValueError(f"filter {field!r}: {'not ' if negate else ''}{op} given twice; use "
                             f"'{field} in [A,B]' for any of several values")
        target[op] = value
    out: dict = {f: o["eq"] if list(o) == ["eq"] else o for f, o in ops.items()}
    if len(anys) == 1:
        out[ANY] = anys[0]
    elif anys:
        out[ALL] = [{ANY: a} for a in anys]
    return out
