"""docs/api.md's curl flows run as written and answer what the document says.

The `sh` blocks of the sections below are read from docs/api.md, in order, as one shell session would
run them: `NAME=value` and `NAME=$(curl … | jq -r .path)` set variables, `$NAME` is expanded, and each
`curl` is sent through the app (a real worker embeds records for `$similar`). Every call must answer
2xx, unless the comment after it names another status (`# 409 …`, `→ 409`); a comment that shows a JSON
object names its first key, which the answer must have; a `$similar` query must find records, closest
first. Tokens minted with `flask token mint` are minted for this test's organization instead.
"""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest

from tests.conftest import ROOT, wait_for

DOC = os.path.join(ROOT, "docs", "api.md")
SECTIONS = ("Entity store", "Entity aggregation", "Analytics")  # "### Semantic search" is inside "Entity store"
STATUS_IN_COMMENT = re.compile(r"(?:^|→\s*)([1-5]\d\d)\b")
FIRST_KEY = re.compile(r'^\{\s*"([A-Za-z_]+)"')
ASSIGN = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$", re.S)


def _section_blocks(text: str, title: str) -> list[str]:
    """The ```sh blocks of `## title` (its ### subsections included)."""
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 4)
    body = text[start:end if end >= 0 else len(text)]
    return re.findall(r"```sh\n(.*?)```", body, re.S)


def _split_comment(line: str) -> tuple[str, str]:
    """`code  # comment` → (code, comment), a `#` inside quotes being code."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def _commands(block: str):
    """(command text, the comment after it) of each logical command of a block: backslash-continued
    lines and quotes that span lines are joined; `# …` lines right after a command are its comment."""
    pending, commands = "", []
    for raw in block.splitlines():
        code, comment = _split_comment(raw) if not pending or _closed(pending) else (raw, "")
        if not pending and not code.strip():
            if comment and commands:
                commands[-1][1] += " " + comment
            continue
        pending = f"{pending}\n{code}" if pending else code
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        if not _closed(pending):
            continue
        commands.append([pending.strip(), comment])
        pending = ""
    return commands


def _closed(text: str) -> bool:
    try:
        shlex.split(text)
        return True
    except ValueError:
        return False


class Session:
    """The shell session of the document, through the Flask test client."""

    def __init__(self, client, make_headers):
        self.client, self.make_headers = client, make_headers
        self.vars: dict[str, str] = {}
        self.failures: list[str] = []

    def expand(self, text: str) -> str:
        def value(match):
            name = match.group(1) or match.group(2)
            if name not in self.vars:
                self.failures.append(f"${name} is used before the document sets it: {text[:120]}")
                return ""
            return self.vars[name]

        return re.sub(r"\$\{([A-Z_][A-Z0-9_]*)\}|\$([A-Z_][A-Z0-9_]*)", value, text)

    def run(self, command: str, comment: str) -> None:
        match = ASSIGN.match(command)
        if match:
            name, rhs = match.groups()
            if rhs.startswith("$(") and "token mint" in rhs:
                role = re.search(r"--role (\w+)", rhs)
                headers = self.make_headers(role=role.group(1) if role else None)
                self.vars[name] = headers["Authorization"].split(" ", 1)[1]
                return
            if rhs.startswith("$(curl"):
                inner, _, path = rhs[2:-1].rpartition("| jq -r ")
                answer = self.curl(inner.strip(), comment)
                self.vars[name] = str(_jq(answer, path.strip()))
                return
            self.vars[name] = shlex.split(self.expand(rhs))[0] if rhs else ""
            return
        if command.startswith("curl "):
            self.curl(command, comment)

    def curl(self, command: str, comment: str):
        args = shlex.split(self.expand(command))[1:]
        method, headers, data, url = None, {}, None, None
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "-X":
                method, i = args[i + 1], i + 2
            elif arg == "-H":
                key, _, val = args[i + 1].partition(":")
                headers[key.strip()] = val.strip()
                i += 2
            elif arg == "-d":
                data, i = args[i + 1], i + 2
            elif arg.startswith("-"):
                i += 1
            else:
                url, i = arg, i + 1
        path = re.sub(r"^(https?://)?localhost:8000", "", url)
        method = method or ("POST" if data is not None else "GET")
        resp = self.client.open(path, method=method, headers=headers, data=data)
        answer = resp.get_json(silent=True)
        wanted = STATUS_IN_COMMENT.search(comment)
        expected = int(wanted.group(1)) if wanted else None
        ok = resp.status_code == expected if expected else 200 <= resp.status_code < 300
        label = f"{method} {path}"
        if not ok:
            self.failures.append(f"{label}: {resp.status_code} (the document says {expected or '2xx'}): "
                                 f"{resp.get_data(as_text=True)[:300]}")
            return answer
        key = FIRST_KEY.match(comment)
        if key and isinstance(answer, dict) and key.group(1) not in answer:
            self.failures.append(f"{label}: no `{key.group(1)}` in {json.dumps(answer)[:300]} ({comment[:80]})")
        if data and '"$similar"' in data and isinstance(answer, dict):
            distances = [r.get("distance") for r in answer.get("records", [])]
            if not distances or distances != sorted(distances):
                self.failures.append(f"{label}: $similar found {distances} (the document shows records, closest first)")
        return answer


def _jq(answer, path: str):
    value = answer
    for part in path.strip(".").split("."):
        value = value[part]
    return value


@pytest.fixture()
def session(client, auth, celery_worker):
    made = Session(client, lambda role=None: auth("read", "write", role=role))
    # the document's opening lines: TOKEN (scopes read,write) and H
    made.vars["TOKEN"] = auth("read", "write")["Authorization"].split(" ", 1)[1]
    made.vars["H"] = f"Authorization: Bearer {made.vars['TOKEN']}"
    return made


def test_the_entity_store_flows_of_docs_api_md_run_as_written(session, client):
    text = open(DOC, encoding="utf-8").read()
    blocks = [block for title in SECTIONS for block in _section_blocks(text, title)]
    assert blocks
    similar_waited = False
    for block in blocks:
        for command, comment in _commands(block):
            if '"$similar"' in command and not similar_waited:
                # the document says records are embedded "shortly after each write": wait for it once
                headers = {"Authorization": session.vars["H"].split(": ", 1)[1]}
                try:
                    wait_for(lambda h=headers: _embedded(client, h), timeout=90, what="the deals records embedded")
                except pytest.fail.Exception as exc:
                    session.failures.append(str(exc))
                similar_waited = True
            session.run(command, comment)
    assert session.failures == [], "\n".join(session.failures)
    assert similar_waited


def _embedded(client, headers) -> bool:
    body = {"query": {"pageSize": 100, "filters": {"$similar": "anything"}}}
    resp = client.post("/api/v1/entities/deals/records/query", json=body, headers=headers)
    records = resp.get_json().get("records", []) if resp.status_code == 200 else []
    return len(records) >= 2
