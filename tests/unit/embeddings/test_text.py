"""The embedding text builder and the content hash."""

from __future__ import annotations

import pytest

from app.embeddings.text import build_embedding_text, embedding_content_hash, stringify

CAR = {"make": "Honda", "model_year": 2019, "description": "Reliable  family\n car,\tlow mileage"}


def test_name_then_configured_fields_in_configured_order():
    text = build_embedding_text("Civic", CAR, ["description", "make", "model_year"])
    assert text == "Civic\ndescription: Reliable family car, low mileage\nmake: Honda\nmodel year: 2019"


def test_empty_field_list_means_name_only():
    assert build_embedding_text("Civic", CAR, []) == "Civic"
    assert build_embedding_text("Civic", CAR, None) == "Civic"


def test_missing_and_empty_values_are_skipped():
    fields = {"a": "", "b": None, "c": [], "d": {}, "e": "  ", "f": "kept"}
    assert build_embedding_text("N", fields, ["a", "b", "c", "d", "e", "f", "not_in_record"]) == "N\nf: kept"


def test_repeated_field_names_are_used_once():
    assert build_embedding_text("N", {"a": "x"}, ["a", "a"]) == "N\na: x"


def test_no_name_and_no_values_gives_empty_text():
    assert build_embedding_text("", {"a": None}, ["a"]) == ""
    assert build_embedding_text(None, {"a": "only field"}, ["a"]) == "a: only field"


@pytest.mark.parametrize("value, expected", [
    (True, "yes"), (False, "no"), (0, "0"), (42, "42"), (2.5, "2.5"), (3.0, "3"), (-0.125, "-0.125"),
    (1e20, "1e+20"), (float("nan"), ""), (float("inf"), ""),
    ("  padded\n\ttext ", "padded text"),
    (["red", "green", 3], "red, green, 3"),
    (["a", None, "", "b"], "a, b"),
    ({"amount": 12.5, "currency": "EUR"}, "amount: 12.5; currency: EUR"),
    ({"first_name": "Ada", "tags": ["x", "y"]}, "first name: Ada; tags: x, y"),
    ([{"name": "Ada"}, {"name": "Alan"}], "name: Ada, name: Alan"),
    ({"b", "a"}, "a, b"),
])
def test_stringify(value, expected):
    assert stringify(value) == expected


def test_unicode_is_normalised_so_equal_text_hashes_equal():
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert build_embedding_text(composed, {}, []) == build_embedding_text(decomposed, {}, [])


def test_max_chars_caps_the_text():
    text = build_embedding_text("Name", {"body": "word " * 5000}, ["body"], max_chars=100)
    assert len(text) <= 100 and text.startswith("Name\nbody: word word")
    assert len(build_embedding_text("Name", {"body": "word " * 5000}, ["body"], max_chars=None)) > 20000


def test_hash_is_sha256_hex_and_deterministic():
    first = embedding_content_hash("all-MiniLM-L6-v2", 384, "Civic\nmake: Honda")
    assert first == embedding_content_hash("all-MiniLM-L6-v2", 384, "Civic\nmake: Honda")
    assert len(first) == 64 and int(first, 16) >= 0


@pytest.mark.parametrize("other", [
    ("all-MiniLM-L6-v2", 384, "Civic\nmake: Toyota"),       # text changed
    ("text-embedding-3-large", 384, "Civic\nmake: Honda"),  # model changed
    ("all-MiniLM-L6-v2", 256, "Civic\nmake: Honda"),        # dimensions changed
    ("all-MiniLM-L6-v2", None, "Civic\nmake: Honda"),       # dimensions unset
])
def test_hash_changes_with_model_dimensions_or_text(other):
    assert embedding_content_hash(*other) != embedding_content_hash("all-MiniLM-L6-v2", 384, "Civic\nmake: Honda")


def test_hash_parts_cannot_run_into_each_other():
    assert embedding_content_hash("ab", 1, "c") != embedding_content_hash("a", 1, "bc")
    assert embedding_content_hash("m", 12, "3") != embedding_content_hash("m", 1, "23")


def test_record_change_outside_configured_fields_keeps_the_hash():
    before = build_embedding_text("Civic", {**CAR, "price": 9000}, ["make"])
    after = build_embedding_text("Civic", {**CAR, "price": 8500}, ["make"])
    assert embedding_content_hash("m", 384, before) == embedding_content_hash("m", 384, after)
