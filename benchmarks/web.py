"""Web tools on the offline web: search latency (in-process, over HTTP, from the disk cache), browse
throughput (sequential vs concurrent), and replay lookups over the reference's real recorded queries.

Run: ``python benchmarks/web.py [--quick]``, or ``--extraction`` for page extraction alone: ``extract_page``
on a ~200 KB encyclopedia-style page built from the shared wiki sample, against the same call plus
trafilatura's ``extract_metadata``, which is how the title was read before issue #21.

Everything runs on loopback against the procedural knowledge base served by ``RAPO-Web-v0`` (built and cached
on first use). Baselines measured in the same run: uncached Bing-v7-over-HTTP search (for the in-process and
cached rows) and sequential browsing (for the concurrent rows), both on the offline site and on a site that
answers after 100 ms, like a remote server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _report import report
from rapo_env.envs.web import WebEnv
from rapo_tools.aio import run_sync
from rapo_tools.serving import serve_in_thread
from rapo_tools.web.browse import BrowseTool
from rapo_tools.web.extract import extract_page, page_title
from rapo_tools.web.fetch import FetchedPage
from rapo_tools.web.providers.replay import ReplayProvider
from rapo_tools.web.search_tool import WebSearchTool

KEY_ENV = "RAPO_BENCH_SITE_KEY"


def median_ms(tools: dict[str, WebSearchTool], queries: list[str]) -> dict[str, float]:
    """Median latency of each tool over ``queries``; calls are interleaved so that load from other
    processes hits every tool alike."""
    timings: dict[str, list[float]] = {name: [] for name in tools}
    for query in queries:
        for name, tool in tools.items():
            result = tool.call(query)
            if not result.ok:
                raise RuntimeError(f"{name} search failed: {result.text}")
            timings[name].append(result.latency_s)
    return {name: statistics.median(values) * 1e3 for name, values in timings.items()}


def latency_site(delay_s: float):
    """Pages served after ``delay_s`` seconds, like a remote server's round trip."""
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse

    app = FastAPI()

    @app.get("/page/{number}", response_class=HTMLResponse)
    async def page(number: int) -> str:
        await asyncio.sleep(delay_s)
        body = f"<article><p>Fact number {number}.</p></article>"
        return f"<html><head><title>Page {number}</title></head><body>{body}</body></html>"

    return app


def pages_per_second(browser: BrowseTool, urls: list[str], concurrency: int) -> float:
    async def run_all():
        semaphore = asyncio.Semaphore(concurrency)

        async def one(url):
            async with semaphore:
                return await browser.acall(url)

        return await asyncio.gather(*(one(url) for url in urls))

    start = time.perf_counter()
    results = asyncio.run(run_all())
    elapsed = time.perf_counter() - start
    if not all(result.ok for result in results):
        raise RuntimeError("a benchmark page failed to load")
    return len(urls) / elapsed


def large_page(target_bytes: int = 200_000) -> FetchedPage:
    """An encyclopedia-style page of about ``target_bytes``: meta tags, navigation, a long article of real wiki
    passages with links and tables, and a footer."""
    import html

    data = Path(os.environ.get("RAPO_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    with (data / "corpus" / "flashrag_wiki18_sample_1000.jsonl").open() as handle:
        passages = [json.loads(line)["contents"] for line in handle]
    navigation = "".join(f'<a href="/section/{i}">Section {i}</a> | ' for i in range(60))
    head = ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>Evan Morris - RapoPedia</title>'
            '<meta property="og:title" content="Evan Morris"><meta name="description" content="An article">'
            f'</head><body><nav>{navigation}</nav><article><h1>Evan Morris</h1>')
    body, number = [], 0
    while len(head) + sum(map(len, body)) < target_bytes:
        text = html.escape(passages[number % len(passages)])
        body.append(f'<h2>Part {number}</h2><p>{text} <a href="/pages/{number}">more</a></p>')
        if number % 20 == 0:
            rows = "".join(f"<tr><td>{row}</td><td>{row * number}</td></tr>" for row in range(8))
            body.append(f"<table>{rows}</table>")
        number += 1
    page = head + "".join(body) + "</article><footer>Cookie settings | Privacy | Terms</footer></body></html>"
    return FetchedPage("https://rapopedia.example/evan", 200, "text/html", "utf-8", page.encode(), False)


def extraction_rows(rounds: int) -> list[dict]:
    """Milliseconds per extraction of `large_page`, after (title from the parsed tree) and before (plus
    trafilatura's ``extract_metadata``), interleaved; and the two title readers alone."""
    import lxml.html
    import trafilatura

    page = large_page()
    text = page.body.decode("utf-8")
    tree = lxml.html.fromstring(text)
    systems = {
        "extract_page, title from trafilatura.extract_metadata (before)":
            lambda: (extract_page(page), trafilatura.extract_metadata(text, default_url=page.url)),
        "extract_page, title from the parsed tree (after)": lambda: extract_page(page),
        "title alone: trafilatura.extract_metadata": lambda: trafilatura.extract_metadata(text, default_url=page.url),
        "title alone: page_title on the parsed tree": lambda: page_title(tree),
    }
    for system in systems.values():
        system()  # warm up
    timings: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(rounds):
        for name, system in systems.items():
            start = time.perf_counter()
            system()
            timings[name].append((time.perf_counter() - start) * 1e3)
    return [
        {"setting": name, "page_kb": len(page.body) / 1e3, "median_ms": statistics.median(values),
         "min_ms": min(values), "max_ms": max(values)}
        for name, values in timings.items()
    ]


def replay_rows(cache_file: Path) -> list[dict]:
    recorded = json.loads(cache_file.read_text(encoding="utf-8"))
    provider = ReplayProvider(cache_file)
    start = time.perf_counter()
    hits = sum(run_sync(provider.search(query.upper(), 10)) is not None for query in recorded)
    elapsed = time.perf_counter() - start
    return [
        {
            "setting": f"replay, {len(recorded)} real queries (case changed)",
            "hits": hits,
            "lookups_per_s": len(recorded) / elapsed,
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer queries and pages")
    parser.add_argument("--extraction", action="store_true", help="only the page extraction benchmark")
    parser.add_argument("--rounds", type=int, default=15, help="rounds of the extraction benchmark")
    args = parser.parse_args()
    if args.extraction:
        load = os.getloadavg()[0]
        rows = extraction_rows(args.rounds)
        report("web_extract", f"Page extraction, median of {args.rounds} interleaved rounds",
               ["setting", "page_kb", "median_ms", "min_ms", "max_ms"], rows,
               {"load_average_1m": {"start": load, "end": os.getloadavg()[0]},
                "gain": rows[0]["median_ms"] / rows[1]["median_ms"]})
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ[KEY_ENV] = "offline-site"
    env = WebEnv()
    questions = [task.question for task in env.tasks[: 20 if args.quick else 100]]
    endpoint = f"{env.offline_web.base_url}/v7.0/search"
    bing = {"provider": "bing", "endpoint": endpoint, "api_key_env": KEY_ENV}
    with tempfile.TemporaryDirectory() as folder:
        with WebSearchTool(bing) as uncached, WebSearchTool({**bing, "cache_path": f"{folder}/c.sqlite"}) as cached:
            tools = {"uncached": uncached, "local": env.tools["search"], "cached": cached}
            median_ms(tools, questions[:5])  # warm up the encoder, the connections, and fill part of the cache
            median_ms({"cached": cached}, questions)  # fill the rest of the cache
            medians = median_ms(tools, questions)
    search_rows = [
        {
            "setting": "bing v7 JSON over loopback HTTP, uncached (baseline)",
            "median_ms": medians["uncached"],
            "speedup": 1.0,
        },
        {
            "setting": "local provider, in-process",
            "median_ms": medians["local"],
            "speedup": medians["uncached"] / medians["local"],
        },
        {
            "setting": "bing v7 over HTTP, disk cache hit",
            "median_ms": medians["cached"],
            "speedup": medians["uncached"] / medians["cached"],
        },
    ]
    pages = [f"{env.offline_web.base_url}{page.path}" for page in env.offline_web.pages]
    urls = (pages * 4)[: 64 if args.quick else 256]
    browser = env.tools["browse"]
    pages_per_second(browser, urls[:8], 1)  # warm up
    sequential = pages_per_second(browser, urls, 1)
    concurrent = pages_per_second(browser, urls, 16)
    env.close()
    delay_s = 0.1
    with (
        serve_in_thread(latency_site(delay_s)) as slow_url,
        BrowseTool({"allowed_origins": (slow_url,)}) as slow_browser,
    ):
        slow_urls = [f"{slow_url}/page/{number}" for number in range(32 if args.quick else 128)]
        slow_sequential = pages_per_second(slow_browser, slow_urls, 1)
        slow_concurrent = pages_per_second(slow_browser, slow_urls, 16)
    browse_rows = [
        {"setting": "offline site (CPU-bound), sequential (baseline)", "pages_per_s": sequential, "speedup": 1.0},
        {
            "setting": "offline site (CPU-bound), 16 concurrent",
            "pages_per_s": concurrent,
            "speedup": concurrent / sequential,
        },
        {
            "setting": f"pages with {delay_s * 1e3:.0f} ms server latency, sequential (baseline)",
            "pages_per_s": slow_sequential,
            "speedup": 1.0,
        },
        {
            "setting": f"pages with {delay_s * 1e3:.0f} ms server latency, 16 concurrent",
            "pages_per_s": slow_concurrent,
            "speedup": slow_concurrent / slow_sequential,
        },
    ]
    data = Path(os.environ.get("RAPO_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    cache_file = data / "web" / "arpo_search_cache.json"
    replay = replay_rows(cache_file) if cache_file.is_file() else []
    report(
        "web_search",
        f"Web search latency ({len(questions)} knowledge-base questions)",
        ["setting", "median_ms", "speedup"],
        search_rows,
        {"browse": browse_rows, "replay": replay},
    )
    report(
        "web_browse",
        "Browse throughput (fetch + trafilatura extraction)",
        ["setting", "pages_per_s", "speedup"],
        browse_rows,
    )
    if replay:
        report(
            "web_replay",
            "Replay of the reference's recorded Bing results",
            ["setting", "hits", "lookups_per_s"],
            replay,
        )


if __name__ == "__main__":
    main()
