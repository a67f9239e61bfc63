"""DNS rebinding: ``<browse>`` connects to the address it checked, on every hop, under a resolver we control.

The resolver plays a hostile DNS server: it answers a public address to the first question about a name
and loopback to every later one. A fetcher that resolves once to check and again to connect would reach
the loopback server (`raw_site`); rapo's must not.
"""

from __future__ import annotations

import pytest

from rapo_tools.web.browse import BrowseTool

PUBLIC_ADDRESS = "93.184.215.14"  # example.com: global, so the address policy lets it through
SECRET = (b"<html><head><title>Secret</title></head><body><article><h1>Secret</h1><p>The internal "
          b"service answered this page, which the open web must never see.</p></article></body></html>")


@pytest.fixture
def internal_site(raw_site):
    raw_site.routes["/secret"] = (200, {"Content-Type": "text/html; charset=utf-8"}, SECRET)
    return raw_site


def resolver_for(answers: dict[str, list[list[str]]]):
    """A resolver answering ``answers[host][i]`` to the i-th question about ``host`` (the last answer after)."""
    asked: dict[str, int] = {}

    async def resolve(host: str, port: int) -> list[str]:
        count = asked.get(host, 0)
        asked[host] = count + 1
        replies = answers[host]
        return replies[min(count, len(replies) - 1)]

    resolve.asked = asked
    return resolve


def test_a_rebinding_name_cannot_reach_loopback(internal_site):
    resolver = resolver_for({"rebind.test": [[PUBLIC_ADDRESS], ["127.0.0.1"]]})
    with BrowseTool({"timeout_s": 2.0}, resolver=resolver) as tool:
        result = tool.call(f"http://rebind.test:{internal_site.port}/secret")
    assert not result.ok and "internal service" not in result.text
    assert internal_site.seen == []  # the loopback server was never reached
    assert resolver.asked == {"rebind.test": 1}  # one question, whose checked answer is where it connected


def test_a_name_with_any_internal_address_is_refused(internal_site):
    resolver = resolver_for({"mixed.test": [[PUBLIC_ADDRESS, "127.0.0.1"]]})
    with BrowseTool(resolver=resolver) as tool:
        result = tool.call(f"http://mixed.test:{internal_site.port}/secret")
    assert result.error == "blocked_address" and "127.0.0.1" in result.text
    assert internal_site.seen == []


def test_the_connection_goes_to_the_checked_address_with_the_original_host(internal_site):
    port = internal_site.port
    resolver = resolver_for({"site.test": [["127.0.0.1"]]})
    with BrowseTool({"allowed_origins": (f"http://site.test:{port}",)}, resolver=resolver) as tool:
        result = tool.call(f"http://site.test:{port}/secret")
    assert result.ok, result.text
    assert "Title: Secret" in result.text
    assert internal_site.seen == [(f"site.test:{port}", "/secret")]


def test_every_redirect_hop_is_checked_at_connection(internal_site):
    port = internal_site.port
    internal_site.routes["/hop"] = (302, {"Location": f"http://rebind.test:{port}/secret"}, b"")
    resolver = resolver_for({"site.test": [["127.0.0.1"]], "rebind.test": [["127.0.0.1"]]})
    with BrowseTool({"allowed_origins": (f"http://site.test:{port}",)}, resolver=resolver) as tool:
        result = tool.call(f"http://site.test:{port}/hop")
    assert result.error == "blocked_address" and "rebind.test" in result.text
    assert [path for _, path in internal_site.seen] == ["/hop"]  # /secret was never asked for


@pytest.fixture
def tls_listener(tmp_path):
    """A TLS socket on loopback with a self-signed certificate, recording the server name (SNI) of each hello."""
    import datetime
    import socket
    import ssl
    import threading

    pytest.importorskip("cryptography", reason="the self-signed test certificate is made with cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "site.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
                   .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    names: list[str | None] = []
    context.sni_callback = lambda _socket, server_name, _context: names.append(server_name)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        connection, _ = listener.accept()
        try:
            with context.wrap_socket(connection, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass  # the client refuses the self-signed certificate, after sending its hello

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], names
    listener.close()


def test_tls_goes_to_the_checked_address_with_the_original_server_name(tls_listener):
    port, names = tls_listener
    resolver = resolver_for({"site.test": [["127.0.0.1"]]})
    with BrowseTool({"allowed_origins": (f"https://site.test:{port}",), "timeout_s": 3.0}, resolver=resolver) as tool:
        result = tool.call(f"https://site.test:{port}/")
    assert names == ["site.test"]  # SNI names the URL's host, although the socket went to 127.0.0.1
    assert not result.ok and "CERTIFICATE_VERIFY_FAILED" in result.text  # and the certificate is checked against it
