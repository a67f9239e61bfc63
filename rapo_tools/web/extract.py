"""Readable text from a fetched page: trafilatura for HTML, decoding for text types, refusal for binary data.

Example:
    >>> html = b"<html><head><title>Ada</title></head><body><nav>Home | About</nav>" \\
    ...        b"<article><h1>Ada Lovelace</h1><p>Ada Lovelace was an English mathematician and writer, " \\
    ...        b"chiefly known for her work on the Analytical Engine.</p></article></body></html>"
    >>> page = extract_page(FetchedPage("https://a.example/ada", 200, "text/html", "utf-8", html, False))
    >>> page.title
    'Ada Lovelace'
    >>> "Analytical Engine" in page.text
    True
"""

from __future__ import annotations

import dataclasses
import urllib.parse

import charset_normalizer
import lxml.html
import trafilatura
from lxml import etree
from trafilatura.settings import use_config

from rapo_tools.web.fetch import FetchedPage, FetchError

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/ld+json",
        "application/rss+xml",
        "application/atom+xml",
        "application/x-yaml",
    }
)


def _trafilatura_config():
    config = use_config()
    # Short pages (encyclopedia stubs, the offline site) are main text too; the defaults drop anything under 250 chars.
    config.set("DEFAULT", "MIN_EXTRACTED_SIZE", "20")
    config.set("DEFAULT", "MIN_OUTPUT_SIZE", "1")
    # trafilatura's timeout uses SIGALRM, which only works on the main thread; tools run elsewhere.
    config.set("DEFAULT", "EXTRACTION_TIMEOUT", "0")
    return config


_CONFIG = _trafilatura_config()


@dataclasses.dataclass(frozen=True)
class PageText:
    """What the browse tool shows of a page."""

    url: str
    """The final URL."""
    title: str
    """The page title ("" when none)."""
    text: str
    """The main readable text."""
    links: tuple[tuple[str, str], ...]
    """(anchor text, absolute URL) of the page's links, in page order, duplicates removed."""
    truncated: bool
    """True when the download was cut at the size cap."""


def decode_body(page: FetchedPage) -> str:
    """Decode the body with the declared charset, else UTF-8, else the charset charset-normalizer detects."""
    for encoding in (page.charset, "utf-8"):
        if not encoding:
            continue
        try:
            return page.body.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            continue
    best = charset_normalizer.from_bytes(page.body).best()
    if best is None:
        raise FetchError(f"the page {page.url[:200]} is not text in any encoding that could be detected")
    return str(best)


def _looks_binary(body: bytes) -> bool:
    return b"\x00" in body[:8192]


def _is_text_type(content_type: str) -> bool:
    return content_type.startswith("text/") or content_type in _TEXT_TYPES or content_type.endswith(("+xml", "+json"))


def _links(document: lxml.html.HtmlElement, base_url: str, max_links: int) -> tuple[tuple[str, str], ...]:
    found: dict[str, str] = {}
    for anchor in document.iter("a"):
        href = (anchor.get("href") or "").strip()
        if not href or href.startswith(("#", "javascript:", "mailto:")):
            continue
        target = urllib.parse.urljoin(base_url, href)
        if urllib.parse.urlsplit(target).scheme not in ("http", "https") or target in found:
            continue
        found[target] = " ".join(anchor.text_content().split())
        if len(found) >= max_links:
            break
    return tuple((text, url) for url, text in found.items())


def _squeezed(text: str | None) -> str:
    return " ".join((text or "").split())


def page_title(document: lxml.html.HtmlElement) -> str:
    """The title of a parsed page, chosen as trafilatura's metadata does: ``og:title`` / ``twitter:title``,
    else the only ``<h1>``, else ``<title>`` ("" when none).

    Read from the tree that is parsed for the links anyway: trafilatura's ``extract_metadata`` parses the
    page again and runs every metadata rule, which cost more than half of a page's extraction (issue #21).

    Example:
        >>> page_title(lxml.html.fromstring("<html><head><title>Ada - Wiki</title></head><h1>Ada</h1></html>"))
        'Ada'
    """
    for name in ("og:title", "twitter:title"):
        for meta in document.xpath(".//meta[@property=$name or @name=$name]", name=name):
            if _squeezed(meta.get("content")):
                return _squeezed(meta.get("content"))
    headings = document.findall(".//h1")
    if len(headings) == 1 and _squeezed(headings[0].text_content()):
        return _squeezed(headings[0].text_content())
    return _squeezed(document.findtext(".//title"))


def extract_page(page: FetchedPage, max_links: int = 50) -> PageText:
    """The readable text of ``page``.

    Raises:
        FetchError: for binary content (images, PDFs, archives, ...), which the model cannot read.
    """
    content_type = page.content_type
    if content_type and content_type not in _HTML_TYPES and not _is_text_type(content_type):
        raise FetchError(
            f"the page {page.url[:200]} is {content_type} ({len(page.body)} bytes read), not text or HTML; "
            "it cannot be shown"
        )
    if _looks_binary(page.body):
        raise FetchError(f"the page {page.url[:200]} holds binary data, not text; it cannot be shown")
    text = decode_body(page)
    is_html = content_type in _HTML_TYPES or (
        not content_type and text.lstrip()[:200].lower().startswith(("<!doctype html", "<html"))
    )
    if not is_html:
        return PageText(url=page.url, title="", text=text.strip(), links=(), truncated=page.truncated)
    main_text = trafilatura.extract(
        text, url=page.url, include_tables=True, include_comments=False, favor_recall=True, config=_CONFIG
    )
    if not main_text:
        # Pages with too little "article" structure for trafilatura: fall back to its whole-page text.
        main_text = trafilatura.html2txt(text)
    try:
        document = lxml.html.fromstring(text)
    except (etree.ParserError, ValueError):
        title, links = "", ()
    else:
        title, links = page_title(document), _links(document, page.url, max_links)
    return PageText(url=page.url, title=title, text=(main_text or "").strip(), links=links, truncated=page.truncated)
