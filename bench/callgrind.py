"""Callgrind client requests from Python, and a gunicorn configuration that measures a window of requests.

Instruction counts (valgrind --tool=callgrind) do not depend on the machine's load: the same requests
served by the same code count the same instructions whichever other work shares the cores, so a small
difference between two variants of a server can be told apart from noise that a req/s figure would hide.

Valgrind runs the server ~50x slower while it counts, so the process starts with counting off
(`--instr-atstart=no`) and a window is measured by signals to the worker (`measure_window`):
SIGNAL_START zeroes the counters and turns counting on, SIGNAL_DUMP writes the counts (a dump file,
`<out>.<pid>.1`) and turns it off. The client requests valgrind understands are a special instruction
sequence (a no-op when the process does not run under valgrind); they are issued here from a few bytes of
machine code put in executable memory and called through ctypes, so nothing needs compiling.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import platform
import re
import signal

SIGNAL_START = signal.SIGRTMIN + 3
SIGNAL_DUMP = signal.SIGRTMIN + 4

_BASE = (ord("C") << 24) | (ord("T") << 16)  # VG_USERREQ_TOOL_BASE('C','T') of valgrind/callgrind.h
DUMP_STATS, ZERO_STATS, TOGGLE_COLLECT, DUMP_STATS_AT, START_INSTRUMENTATION, STOP_INSTRUMENTATION = (
    _BASE + i for i in range(6))

# uint64 request(uint64 *args): valgrind's amd64 client-request sequence (valgrind/valgrind.h):
# %rax = the 6 arguments, %rdx = the default result, the rotations of %rdi (a no-op: 128 bits in all)
# followed by xchg %rbx,%rbx; the result comes back in %rdx.
_CODE = bytes.fromhex(
    "4889f8"      # mov %rdi,%rax
    "31d2"        # xor %edx,%edx
    "48c1c703"    # rol $3,%rdi
    "48c1c70d"    # rol $13,%rdi
    "48c1c73d"    # rol $61,%rdi
    "48c1c733"    # rol $51,%rdi
    "4887db"      # xchg %rbx,%rbx
    "4889d0"      # mov %rdx,%rax
    "c3")         # ret
_request = None
_keep: list = []


def available() -> bool:
    return platform.machine() in ("x86_64", "AMD64") and os.name == "posix"


def client_request(code: int, arg1: int = 0) -> int:
    global _request
    if _request is None:
        memory = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        memory.write(_CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
        _request = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64))(address)
        _keep.append(memory)
    return _request((ctypes.c_uint64 * 6)(code, arg1, 0, 0, 0, 0))


def start() -> None:
    # A full collection scans every object of the process; one that falls due in a short window would add
    # tens of millions of instructions to that window alone. Frozen, the objects made before the window
    # are left out of collections, and the window counts what its own requests allocate and collect.
    gc.collect()
    gc.freeze()
    client_request(ZERO_STATS)
    client_request(START_INSTRUMENTATION)


def dump(reason: bytes = b"measured") -> None:
    text = ctypes.create_string_buffer(reason)
    client_request(DUMP_STATS_AT, ctypes.addressof(text))
    client_request(STOP_INSTRUMENTATION)


def install_signals(marker: str | None = None, flush=None) -> None:
    """In a process that runs under callgrind: SIGNAL_START starts a window, SIGNAL_DUMP ends it; each
    then creates `<marker>.on` / `<marker>.dumped` (when a marker path is given), so the process that
    sent the signal knows it was handled. `flush` (when given) runs first on both: work the process
    buffers (spans waiting for export) is done before the window, and the window's own is done in it."""

    def handle(action, suffix):
        def handler(*_args):
            if flush is not None:
                flush()
            action()
            if marker:
                with open(marker + suffix, "w"):
                    pass
        return handler

    signal.signal(SIGNAL_START, handle(start, ".on"))
    signal.signal(SIGNAL_DUMP, handle(dump, ".dumped"))


def total_instructions(dump_file: str) -> int:
    """The Ir total of a callgrind dump file."""
    with open(dump_file) as fh:
        text = fh.read()
    found = re.search(r"^(?:totals|summary):\s*(\d+)", text, re.MULTILINE)
    if not found:
        raise RuntimeError(f"no totals in {dump_file}")
    return int(found.group(1))
