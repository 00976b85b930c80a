"""Console sessions and the tokens they hand out (no HTTP)."""

from __future__ import annotations

import jwt
import pytest

from app.console.schemas import valid_name
from app.console.services import ConsoleIdentity, issue_token, open_session, read_session

SECRET = "s" * 40
CONFIG = {"JWT_SECRET": SECRET, "JWT_ISSUER": "iss", "JWT_AUDIENCE": "aud", "CONSOLE_TOKEN_TTL_SECONDS": 900}
ALICE = ConsoleIdentity(org_id="acme", user_id="alice", role="admin", product="default", email="a@example.com")


def test_a_session_reads_back_as_its_identity():
    assert read_session(open_session(ALICE, secret=SECRET), secret=SECRET, max_age=60) == ALICE


@pytest.mark.parametrize("cookie", [None, "", "x", "e30.e30", "eyJvcmdfaWQiOiJhY21lIn0.abc.def"])
def test_missing_or_forged_cookies_have_no_identity(cookie):
    assert read_session(cookie, secret=SECRET, max_age=60) is None


def test_a_cookie_signed_with_another_secret_has_no_identity():
    assert read_session(open_session(ALICE, secret="t" * 40), secret=SECRET, max_age=60) is None


def test_a_session_older_than_max_age_has_no_identity(monkeypatch):
    import itsdangerous.timed

    cookie = open_session(ALICE, secret=SECRET)
    now = itsdangerous.timed.time.time()
    monkeypatch.setattr(itsdangerous.timed.time, "time", lambda: now + 3601)
    assert read_session(cookie, secret=SECRET, max_age=3600) is None
    assert read_session(cookie, secret=SECRET, max_age=7200) == ALICE


def test_a_signed_cookie_with_foreign_fields_has_no_identity():
    from itsdangerous import URLSafeTimedSerializer

    forged = URLSafeTimedSerializer(SECRET, salt="platform-gateway console session").dumps({"org_id": "x", "evil": 1})
    assert read_session(forged, secret=SECRET, max_age=60) is None


def test_issue_token_carries_the_identity_and_only_the_read_analytics_scope():
    answer = issue_token(ALICE, CONFIG, now=1_800_000_000)
    assert answer["expiresIn"] == 900
    claims = jwt.decode(answer["token"], SECRET, algorithms=["HS256"], audience="aud", issuer="iss",
                        options={"verify_exp": False, "verify_iat": False})
    assert claims == {"org_id": "acme", "user_id": "alice", "role": "admin", "product": "default",
                      "email": "a@example.com", "scopes": ["read:analytics"], "iat": 1_800_000_000,
                      "exp": 1_800_000_900, "iss": "iss", "aud": "aud"}


def test_the_session_cookie_is_not_a_token():
    with pytest.raises(jwt.InvalidTokenError):
        jwt.decode(open_session(ALICE, secret=SECRET), SECRET, algorithms=["HS256"], audience="aud")


@pytest.mark.parametrize("name,ok", [("acme", True), ("org-1.a_b@c:d", True), ("", False), ("-acme", False),
                                     ("a b", False), ("a/b", False), ("x" * 128, True), ("x" * 129, False),
                                     ("ä", False), ("acme\n", False)])
def test_valid_name(name, ok):
    assert valid_name(name) is ok
