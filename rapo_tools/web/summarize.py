"""Summarise a browsed page against the current question, as the reference evaluation does.

Long pages overwhelm small policies; the reference evaluation asks a helper model to
keep only what bears on the question. The summary replaces the page text in the
observation.
"""

from __future__ import annotations

from rapo_tools.web.chat import ChatClient

SUMMARY_INSTRUCTIONS = (
    "You read a web page for someone answering a question. Extract the information on the page that helps "
    "answer the question: facts, names, dates, numbers, and the sentences that state them. Quote exact values. "
    "If the page holds nothing relevant, say exactly: No relevant information. Do not answer from your own "
    "knowledge; use only the page."
)


class PageSummarizer:
    """Asks a chat model for the question-relevant content of a page.

    Args:
        client: The OpenAI-compatible chat client.
        max_page_chars: Page text beyond this is cut before it is sent (the helper's context is finite).
    """

    def __init__(self, client: ChatClient, max_page_chars: int = 30_000):
        self.client = client
        self.max_page_chars = max_page_chars

    async def summarize(self, question: str, url: str, title: str, page_text: str) -> str:
        prompt = (
            f"Question: {question or '(no question given; summarise the main facts)'}\n\n"
            f"Page URL: {url}\nPage title: {title}\n\nPage text:\n{page_text[: self.max_page_chars]}"
        )
        messages = [{"role": "system", "content": SUMMARY_INSTRUCTIONS}, {"role": "user", "content": prompt}]
        return (await self.client.complete(messages)).strip()

    async def aclose(self) -> None:
        await self.client.aclose()
