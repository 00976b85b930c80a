"""`make bench` (python -m bench without arguments) runs every benchmark that needs nothing from
outside the project; the Directus comparison runs only when named (`make bench-peers`)."""

from bench.__main__ import default_names


def test_default_benchmarks_leave_out_the_directus_comparison():
    names = default_names()
    assert "peers" not in names
    assert {"entities", "records_http"} <= set(names)
