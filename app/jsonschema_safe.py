"""The one JSON Schema validator factory: caller-supplied regular expressions run on RE2.

Python's `re` backtracks: `{"pattern": "^(a+)+$"}` against 40 × "a" + "!" runs for minutes and takes a
gunicorn worker down. Every schema a caller supplies (entity definitions, agent `configSchema`,
tool-definition `configSchema`) is evaluated through `validator_for()` here, and every regular
expression jsonschema evaluates (`pattern`, `patternProperties`, the `additionalProperties` /
`unevaluatedProperties` checks that consult `patternProperties`, and `format: regex`) goes to RE2, a
linear-time engine. `schema_pattern_problems()` lists the patterns RE2 cannot compile
(backreferences, lookaround), so they are refused with a 400 when the schema is saved.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import re2
from jsonschema import Draft202012Validator, FormatChecker, _keywords, _legacy_keywords, _utils, validators
from jsonschema.exceptions import SchemaError

from app.errors import ValidationFailed

MAX_PATTERN_LENGTH = 1000
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is a 400, not a line on stderr
_OPTIONS.max_mem = 8 << 20   # bounds the DFA of one pattern (8 MiB)
# Subtrees that hold data, not schema: a "pattern" key in them is not a keyword.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example"})


class UnsupportedPattern(ValueError):
    pass


@functools.lru_cache(maxsize=4096)
def compile_pattern(pattern: str):
    """The RE2 program of an ECMA-262-style JSON Schema pattern (cached); UnsupportedPattern if
    RE2 cannot run it."""
    if not isinstance(pattern, str):
        raise UnsupportedPattern("a pattern must be a string")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise UnsupportedPattern(f"a pattern may have at most {MAX_PATTERN_LENGTH} characters")
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise UnsupportedPattern(f"pattern {pattern[:100]!r} is not supported ({reason}); patterns run on "
                                 "RE2: no backreferences or lookaround") from None


def search(pattern: str, string: str, flags: int = 0):
    """`re.search` with RE2. A stored schema whose pattern RE2 refuses (saved before this check) is a
    400, never a 500 and never a backtracking run."""
    try:
        program = compile_pattern(pattern)
    except UnsupportedPattern as exc:
        raise ValidationFailed("The schema cannot be applied.", {"schema": [str(exc)]}) from None
    return program.search(string)


class _Re2Module:
    """What jsonschema's keyword modules see as `re`: `search` is RE2, everything else is `re`."""

    search = staticmethod(search)

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)


def _install() -> None:
    # jsonschema's keyword implementations call `re.search(pattern, …)` on module globals; pointing
    # those globals at RE2 covers every keyword that evaluates a caller's pattern, in every draft.
    shim = _Re2Module()
    for module in (_keywords, _legacy_keywords, _utils):
        module.re = shim


_install()


def _is_regex(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        compile_pattern(value)
    except UnsupportedPattern:
        return False
    return True


def format_checker(base: FormatChecker | None) -> FormatChecker:
    """`base` with `format: regex` judged by RE2 (Python's `re` would accept backtracking bombs)."""
    checker = FormatChecker(formats=())
    if base is not None:
        checker.checkers = dict(base.checkers)
    if "regex" in checker.checkers:
        checker.checkers["regex"] = (_is_regex, ())
    return checker


def validator_class(schema: Any, default=Draft202012Validator):
    """The validator class for `schema` (draft from `$schema`, else `default`)."""
    return validators.validator_for(schema, default=default) if isinstance(schema, dict) else default


def check_schema(schema: Any, default=Draft202012Validator) -> None:
    """Check `schema` against its draft's metaschema (SchemaError), judging `format: regex` (the
    `pattern` keyword's own format) with RE2, then every pattern: UnsupportedPattern → SchemaError."""
    cls = validator_class(schema, default)
    cls.check_schema(schema, format_checker=format_checker(cls.FORMAT_CHECKER))
    problems = schema_pattern_problems(schema)
    if problems:
        raise SchemaError("; ".join(problems))


def validator_for(schema: Any, *, format_checker_base: FormatChecker | None = None, default=Draft202012Validator):
    """A validator instance for a caller-supplied schema; regexes on RE2. `format_checker_base`
    None = the draft's own format checker."""
    cls = validator_class(schema, default)
    base = cls.FORMAT_CHECKER if format_checker_base is None else format_checker_base
    return cls(schema, format_checker=format_checker(base))


def iter_patterns(schema: Any) -> Iterator[tuple[str, Any]]:
    """(location, pattern) of every `pattern` and `patternProperties` key in a schema (iterative)."""
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                here = f"{where}/{key}"
                if key in _DATA_KEYWORDS:
                    continue
                if key == "pattern" and not isinstance(value, dict):
                    yield here, value
                elif key == "patternProperties" and isinstance(value, dict):
                    for pattern in value:
                        yield f"{here}/{pattern}", pattern
                if isinstance(value, dict | list):
                    stack.append((here, value))
        elif isinstance(node, list):
            stack.extend((f"{where}/{i}", item) for i, item in enumerate(node))


def schema_pattern_problems(schema: Any) -> list[str]:
    """Messages for every pattern of `schema` RE2 cannot run (empty = fine)."""
    problems = []
    for where, pattern in iter_patterns(schema):
        try:
            compile_pattern(pattern)
        except UnsupportedPattern as exc:
            problems.append(f"{exc} (at {where or '/'})")
    return problems
