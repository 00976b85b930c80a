"""`make bench` / `python -m bench [name ...]`: run benchmark modules bench/bench_<name>.py.

Each module has `main() -> str` that runs, prints and returns its markdown table; the table is
written to bench/results/<name>.md. Benchmarks are not tests: they assert nothing about timing.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# run only when named: `peers` needs Directus from npm (`make bench-peers` installs it)
ON_REQUEST = {"peers"}


def default_names() -> list[str]:
    """What `make bench` / `python -m bench` runs without arguments."""
    return sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([HERE])
                  if m.name.startswith("bench_") and m.name[len("bench_"):] not in ON_REQUEST)


def main(argv: list[str]) -> int:
    names = argv or default_names()
    for name in names:
        print(f"== bench {name}", flush=True)
        module = importlib.import_module(f"bench.bench_{name}")
        module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
