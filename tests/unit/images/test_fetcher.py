"""The SSRF-safe reference fetcher, alone: text rules, address policy, and a real TLS server on loopback."""

from __future__ import annotations

import ipaddress
import time

import pytest

from app.images.fetcher import REFUSED_MESSAGE, ReferenceFetcher, ReferenceRefused, public_address_allowed
from tests.images_fakes import RESOLUTION_CASES, TEXT_CASES, TRANSFER_CASES, LoopbackNet, TlsImageServer

ALLOWED = ["cdn.example.com", "images.example.com", "internal.example.com", "rebind.example.com",
           "mixed.example.com", "meta.example.com"]


@pytest.fixture(scope="module")
def server():
    srv = TlsImageServer()
    yield srv
    srv.close()


@pytest.fixture()
def net(server):
    return LoopbackNet(server.port, {"cdn.example.com": ["127.0.0.1"], "images.example.com": ["127.0.0.1"],
                                     "internal.example.com": ["10.0.0.5"]})


def make_fetcher(server, net, **kwargs) -> ReferenceFetcher:
    return ReferenceFetcher(ALLOWED, resolver=net.resolve, connector=net.connect, address_allowed=net.policy,
                            ssl_context=server.client_context(), **kwargs)


def test_fetches_allowed_png_over_tls_to_the_checked_address(server, net):
    data = make_fetcher(server, net).fetch("https://cdn.example.com/ok.png")
    assert data == server.png
    assert net.lookups == ["cdn.example.com"]  # resolved once
    assert net.connections == [("127.0.0.1", 443)]
    assert server.hits[-1] == ("cdn.example.com", "/ok.png")  # original Host header


def test_host_is_normalised_before_the_allowlist(server, net):
    assert make_fetcher(server, net).fetch("https://CDN.Example.COM./ok.jpg") == server.jpeg


def test_follows_a_redirect_to_an_allowed_host(server, net):
    data = make_fetcher(server, net).fetch("https://cdn.example.com/redirect?to=https://images.example.com/ok.png")
    assert data == server.png
    assert net.lookups == ["cdn.example.com", "images.example.com"]


def test_certificate_is_checked_against_the_original_name(server, net):
    other = LoopbackNet(server.port, {"unlisted.example.com": ["127.0.0.1"]})
    fetcher = ReferenceFetcher(["unlisted.example.com"], resolver=other.resolve, connector=other.connect,
                               address_allowed=other.policy, ssl_context=server.client_context())
    with pytest.raises(ReferenceRefused) as info:
        fetcher.fetch("https://unlisted.example.com/ok.png")  # cert does not name this host
    assert "connection failed" in info.value.reason


def test_default_trust_store_refuses_a_self_signed_server(server, net):
    fetcher = ReferenceFetcher(ALLOWED, resolver=net.resolve, connector=net.connect, address_allowed=net.policy)
    with pytest.raises(ReferenceRefused):
        fetcher.fetch("https://cdn.example.com/ok.png")


# -- the production address policy ---------------------------------------------------------------

FORBIDDEN_ADDRESSES = [
    "127.0.0.1", "127.255.255.254", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254",
    "100.64.0.1", "100.100.100.200", "0.0.0.0", "0.1.2.3", "192.0.0.170", "198.18.0.1", "224.0.0.1",
    "255.255.255.255", "::1", "::", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1",
    "::127.0.0.1", "fe80::1", "fc00::1", "fd00:ec2::254", "64:ff9b::a00:1", "64:ff9b:1::1", "2002:7f00:1::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2", "fec0::1", "5f00::1", "ff02::1", "2001:db8::1",
]


@pytest.mark.parametrize("address", FORBIDDEN_ADDRESSES)
def test_policy_refuses(address):
    assert public_address_allowed(ipaddress.ip_address(address)) is False


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_policy_allows_public_unicast(address):
    assert public_address_allowed(ipaddress.ip_address(address)) is True


# -- refusals: text, resolution, transfer --------------------------------------------------------

@pytest.mark.parametrize("url", TEXT_CASES)
def test_refused_on_text_without_any_lookup(server, net, url):
    fetcher = make_fetcher(server, net)
    with pytest.raises(ReferenceRefused) as info:
        fetcher.fetch(url)
    assert str(info.value.public_message) == REFUSED_MESSAGE
    assert net.lookups == [] and net.connections == []


@pytest.mark.parametrize("case", sorted(RESOLUTION_CASES))
def test_refused_after_resolution_without_connecting(server, case):
    net = LoopbackNet(server.port, {"rebind.example.com": RESOLUTION_CASES[case]})
    # the production policy: not even the loopback test server is allowed here
    fetcher = ReferenceFetcher(ALLOWED, resolver=net.resolve, connector=net.connect,
                               ssl_context=server.client_context())
    with pytest.raises(ReferenceRefused):
        fetcher.fetch("https://rebind.example.com/ok.png")
    assert net.lookups == ["rebind.example.com"]
    assert net.connections == []


def test_resolution_failure_is_refused(server, net):
    with pytest.raises(ReferenceRefused):
        make_fetcher(server, net).fetch("https://mixed.example.com/ok.png")  # unknown to the resolver
    assert net.connections == []


@pytest.mark.parametrize("path", TRANSFER_CASES)
def test_refused_during_transfer(server, net, path):
    fetcher = make_fetcher(server, net)
    with pytest.raises(ReferenceRefused):
        fetcher.fetch(f"https://cdn.example.com{path}")
    assert all(address == "127.0.0.1" for address, _ in net.connections)
    assert "internal.example.com" not in [h for h, _ in server.hits]


def test_redirect_to_private_name_never_connects_there(server, net):
    with pytest.raises(ReferenceRefused):
        make_fetcher(server, net).fetch("https://cdn.example.com/redirect?to=https://internal.example.com/x")
    assert net.lookups == ["cdn.example.com", "internal.example.com"]
    assert net.connections == [("127.0.0.1", 443)]


def test_redirect_hops_are_capped(server, net):
    with pytest.raises(ReferenceRefused) as info:
        make_fetcher(server, net).fetch("https://cdn.example.com/loop0")
    assert info.value.reason == "too many redirects"
    assert len(net.connections) == 4  # the first request + 3 re-checked hops


@pytest.mark.parametrize("path", ["/drip", "/drip-headers"])
def test_slow_drip_is_cut_at_the_total_deadline(server, net, path):
    fetcher = make_fetcher(server, net, deadline_seconds=1.0)  # the 10 s rule, scaled down
    started = time.monotonic()
    with pytest.raises(ReferenceRefused) as info:
        fetcher.fetch(f"https://cdn.example.com{path}")
    assert time.monotonic() - started < 2.5  # every read returned quickly; only the total deadline stops it
    assert "deadline" in info.value.reason


def test_byte_cap_applies_whatever_content_length_says(server, net):
    fetcher = make_fetcher(server, net, max_bytes=64)
    with pytest.raises(ReferenceRefused) as info:
        fetcher.fetch("https://cdn.example.com/ok.png")  # honest length, over the (scaled-down) cap
    assert "cap" in info.value.reason


def test_slow_tls_handshake_is_cut_at_the_total_deadline(server):
    """A server that answers the ClientHello one byte at a time never trips a per-recv timeout."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip():
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            for byte in b"\x16\x03\x03\x10\x00" + b"\x00" * 100:  # a handshake record that never completes
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.2)

    threading.Thread(target=drip, daemon=True).start()
    net = LoopbackNet(listener.getsockname()[1], {"cdn.example.com": ["127.0.0.1"]})
    fetcher = make_fetcher(server, net, deadline_seconds=1.0)
    started = time.monotonic()
    try:
        with pytest.raises(ReferenceRefused) as info:
            fetcher.fetch("https://cdn.example.com/ok.png")
    finally:
        stop.set()
        listener.close()
    assert time.monotonic() - started < 2.5
    assert "deadline" in info.value.reason
