"""Page extraction: the title read from the parsed tree, and the body decoded with the charset the server sent."""

from __future__ import annotations

import lxml.html
import pytest

from rapo_tools.web.browse import BrowseTool
from rapo_tools.web.extract import page_title


@pytest.mark.parametrize(
    ("head", "body", "title"),
    [
        ('<meta property="og:title" content=" Ada  Lovelace "><title>Ada - Wiki</title>', "<h1>A</h1>", "Ada Lovelace"),
        ('<meta name="twitter:title" content="Ada"><title>Ada - Wiki</title>', "", "Ada"),
        ("<title>Ada - Wiki</title>", "<h1>Ada Lovelace</h1>", "Ada Lovelace"),
        ("<title>Ada - Wiki</title>", "<h1>One</h1><h1>Two</h1>", "Ada - Wiki"),
        ("", "<p>no title at all</p>", ""),
    ],
)
def test_title_follows_trafilaturas_order(head, body, title):
    document = lxml.html.fromstring(f"<html><head>{head}</head><body>{body}<p>text</p></body></html>")
    assert page_title(document) == title


def test_the_declared_charset_decodes_the_page(raw_site):
    body = ("<html><head><title>Zürich</title></head><body><article><h1>Zürich</h1><p>Zürich liegt am "
            "Zürichsee, die größte Stadt der Schweiz.</p></article></body></html>").encode("iso-8859-1")
    raw_site.routes["/"] = (200, {"Content-Type": 'text/html; charset="ISO-8859-1"'}, body)
    with BrowseTool({"allow_private": True, "timeout_s": 3.0}) as tool:
        result = tool.call(f"http://127.0.0.1:{raw_site.port}/")
    assert result.ok, result.text
    assert "Title: Zürich" in result.text and "die größte Stadt" in result.text
