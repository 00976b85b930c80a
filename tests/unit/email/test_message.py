"""app.email.services.build_message: the message's identifiers come from the OS's randomness."""

from __future__ import annotations

import email
import random
import re

from app.email.services import build_message
from app.tenancy import Tenant


def test_message_ids_and_boundaries_leave_the_random_module_alone_and_parse_back():
    tenant = Tenant(org_id="acme", user_id="u1", email=None, role=None)
    state = random.getstate()
    html = build_message("noreply@example.com", ["a@example.com"], "Hi", "<p>Hello <b>there</b></p>", tenant)
    plain = build_message("noreply@example.com", ["a@example.com"], "Hi", "Hello there", tenant)
    wire = [m.as_bytes() for m in (html, plain)]  # flattening draws a boundary when none is set
    assert random.getstate() == state
    ids = {html["Message-ID"], plain["Message-ID"]}
    assert len(ids) == 2 and all(re.fullmatch(r"<[0-9a-f]{32}@platform-gateway>", i) for i in ids)
    parsed = email.message_from_bytes(wire[0])
    assert parsed.is_multipart() and parsed.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in parsed.get_payload()] == ["text/plain", "text/html"]
    assert "Hello there" in parsed.get_payload()[0].get_payload(decode=True).decode()
    assert not email.message_from_bytes(wire[1]).is_multipart()
