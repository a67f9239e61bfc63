"""A small web site on loopback: HTML pages plus a Bing-v7-compatible search endpoint.

This is the offline web of ``RAPO-Web-v0``. The pages are the passages of a corpus
(the procedural knowledge base); the server is real HTTP, so ``<browse>`` fetches real pages and the ``bing`` provider
can be pointed at ``{base_url}/v7.0/search``.

Routes: ``/`` (index of all pages), ``/wiki/{slug}``, ``/v7.0/search?q=&count=``
(Bing v7 JSON from the `LocalProvider`), ``/health``.

Example:
    >>> import httpx
    >>> pages = [SitePage("ada-lovelace", "Ada Lovelace", ("Ada Lovelace was an English mathematician.",))]
    >>> with serve_site(pages) as base_url:
    ...     html = httpx.get(f"{base_url}/wiki/{pages[0].slug}").text
    >>> pages[0].title in html
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
from collections.abc import Iterator, Sequence

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from rapo_tools.serving import serve_in_thread
from rapo_tools.web.providers.local import LocalProvider, slugify


@dataclasses.dataclass(frozen=True)
class SitePage:
    """One page of the site."""

    slug: str
    """The page's path segment under ``/wiki/``."""
    title: str
    """The page title."""
    paragraphs: tuple[str, ...]
    """Body paragraphs (plain text)."""
    links: tuple[tuple[str, str], ...] = ()
    """(anchor text, slug) of related pages, shown as a "See also" list."""

    @property
    def path(self) -> str:
        return f"/wiki/{self.slug}"

    @classmethod
    def from_passage(cls, title: str, text: str, related_titles: Sequence[str] = ()) -> SitePage:
        """The page of one corpus passage, at the path the `LocalProvider` gives it, linking to related pages."""
        links = tuple((related, slugify(related)) for related in related_titles if related != title)
        return cls(slugify(title), title, (text,), links)

    @property
    def text(self) -> str:
        return "\n".join(self.paragraphs)


def render_page(page: SitePage) -> str:
    """The page as a complete HTML document (navigation, article, related links, footer)."""
    body = "\n".join(f"<p>{html.escape(paragraph)}</p>" for paragraph in page.paragraphs)
    related = "".join(f'<li><a href="/wiki/{slug}">{html.escape(text)}</a></li>' for text, slug in page.links)
    see_also = f"<h2>See also</h2><ul>{related}</ul>" if related else ""
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f"<title>{html.escape(page.title)} - RapoPedia</title></head><body>"
        '<nav><a href="/">Main page</a> | <a href="/">All articles</a></nav>'
        f"<main><article><h1>{html.escape(page.title)}</h1>{body}{see_also}</article></main>"
        "<footer>RapoPedia is a generated encyclopedia for offline agent training.</footer></body></html>"
    )


def render_index(pages: Sequence[SitePage]) -> str:
    items = "".join(f'<li><a href="{page.path}">{html.escape(page.title)}</a></li>' for page in pages)
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>RapoPedia - all articles</title></head>'
        f"<body><main><h1>All articles</h1><ul>{items}</ul></main></body></html>"
    )


def build_site_app(pages: Sequence[SitePage], provider: LocalProvider | None = None):
    """The FastAPI app serving ``pages`` (and, when ``provider`` is given, the Bing-v7 search endpoint)."""
    by_slug = {page.slug: page for page in pages}
    if len(by_slug) != len(pages):
        raise ValueError("two pages share a slug (titles that differ only in punctuation or case)")
    app = FastAPI(title="rapo offline web site")

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return render_index(pages)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "pages": len(pages)}

    @app.get("/wiki/{slug}", response_class=HTMLResponse)
    def page(slug: str) -> str:
        if slug not in by_slug:
            raise HTTPException(status_code=404, detail=f"no page {slug!r}")
        return render_page(by_slug[slug])

    if provider is not None:

        @app.get("/v7.0/search")
        def search(
            request: Request, q: str = Query(..., min_length=1, max_length=2000), count: int = Query(10, ge=1, le=50)
        ) -> dict:
            base_url = str(request.base_url).rstrip("/")
            hits = provider.with_url_prefix(base_url).search_sync(q, count)
            return {
                "_type": "SearchResponse",
                "queryContext": {"originalQuery": q},
                "webPages": {
                    "totalEstimatedMatches": len(hits),
                    "value": [
                        {
                            "id": f"{base_url}/v7.0/search#WebPages.{i}",
                            "name": hit.title,
                            "url": hit.url,
                            "snippet": hit.snippet,
                        }
                        for i, hit in enumerate(hits)
                    ],
                },
            }

    return app


@contextlib.contextmanager
def serve_site(
    pages: Sequence[SitePage], provider: LocalProvider | None = None, host: str = "127.0.0.1", port: int = 0
) -> Iterator[str]:
    """Serve the site on loopback in a background thread; yields its base URL."""
    with serve_in_thread(build_site_app(pages, provider), host=host, port=port) as base_url:
        yield base_url
