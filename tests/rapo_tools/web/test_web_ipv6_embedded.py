"""``<browse>`` refuses IPv6 addresses that lead to a loopback or private IPv4 host.

NAT64 (64:ff9b::/96, and the local-use 64:ff9b:1::/48), 6to4 (2002::/16), IPv4-mapped (::ffff:0:0/96),
SIIT (::ffff:0:0:0/96), IPv4-compatible (::/96) and Teredo addresses each carry an IPv4 address that a
gateway or the host's own stack may connect to; an address is as internal as the IPv4 host it reaches.
"""

from __future__ import annotations

import pytest

from rapo_tools.web.browse import BrowseTool

EMBEDDING_INTERNAL = [
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254, the cloud metadata service
    "64:ff9b:1::a00:1",  # local-use NAT64
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
    "::ffff:7f00:1",  # IPv4-mapped
    "::ffff:0:a00:1",  # SIIT of 10.0.0.1
    "::7f00:1",  # IPv4-compatible
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo whose client is 127.0.0.1
]


@pytest.mark.parametrize("address", EMBEDDING_INTERNAL)
def test_a_name_resolving_to_an_ipv6_form_of_an_internal_ipv4_is_refused(address):
    async def resolve(host: str, port: int) -> list[str]:
        return [address]

    with BrowseTool({"timeout_s": 2.0}, resolver=resolve) as tool:
        result = tool.call("http://innocent.test/")
    assert result.error == "blocked_address", result.text


@pytest.mark.parametrize("address", EMBEDDING_INTERNAL)
def test_a_literal_ipv6_form_of_an_internal_ipv4_is_refused(address):
    with BrowseTool({"timeout_s": 2.0}) as tool:
        result = tool.call(f"http://[{address}]/")
    assert result.error == "blocked_address", result.text


@pytest.mark.parametrize("address", ["64:ff9b::808:808", "2002:808:808::1", "2606:4700:4700::1111"])
def test_ipv6_forms_of_public_hosts_pass_the_address_policy(address):
    from rapo_tools.web.fetch import _is_internal

    assert not _is_internal(address)
