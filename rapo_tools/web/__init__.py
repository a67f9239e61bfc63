"""Web tools: ``<search>`` over a web search provider and ``<browse>`` for reading pages.

- `WebSearchTool` (tag ``search``): providers ``bing`` (Bing Web Search v7), ``brave``, ``replay``
  (the reference's recorded results, offline) and ``local`` (rapo's dense index over a local site);
  normalised title/url/snippet results, a disk cache safe under concurrent writers, a rate budget shared
  by every process using that cache, retries on 429/5xx that honour ``Retry-After``, clear failed observations.
- `BrowseTool` (tag ``browse``): httpx fetch with size and time caps, http(s) only, internal addresses
  refused unless allowed and checked where the socket connects (no DNS rebinding), redirects checked hop
  by hop, main-text extraction with trafilatura, optional summarisation through an OpenAI-compatible endpoint.
- `rapo_tools.web.website`: the offline site (HTML pages + a Bing-v7-compatible endpoint) on loopback.

Example:
    >>> from rapo_tools.web import BrowseTool, WebSearchTool
    >>> WebSearchTool.name, BrowseTool.name
    ('search', 'browse')
"""

from rapo_tools.web.browse import BrowseConfig, BrowseTool
from rapo_tools.web.chat import ChatClient, ChatConfig
from rapo_tools.web.providers.base import MissingApiKeyError, ReplayMissError, SearchProvider
from rapo_tools.web.results import SearchResult, render_results
from rapo_tools.web.search_tool import WebSearchConfig, WebSearchTool

__all__ = [
    "BrowseConfig",
    "BrowseTool",
    "ChatClient",
    "ChatConfig",
    "MissingApiKeyError",
    "ReplayMissError",
    "SearchProvider",
    "SearchResult",
    "WebSearchConfig",
    "WebSearchTool",
    "render_results",
]
