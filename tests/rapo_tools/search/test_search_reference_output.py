"""``SearchToolConfig(output="reference")``: the reference ``WikiSearchTool``'s text, byte for byte (D5),
and an empty ``<search></search>`` that ends the episode (D3).

The reference (``wiki_search_tool.py``, ``_passages2string``) writes ``Doc i (Title: <first line>)``,
the rest of the wiki-18 ``contents`` and a blank line per passage, then strips the whole: the title
keeps its quotes and no passage is cut. rapo's default writes the bare title and cuts at 2,000 characters.
"""

import pytest

from rapo_tools.base import EMPTY_CALL
from rapo_tools.search.corpus import Passage
from rapo_tools.search.tool import SearchTool, SearchToolConfig, format_hits_reference
from rapo_tools.search.wiki_search import WikiSearch

LONG = "Paris is the capital of France. " * 100  # 3,200 characters


@pytest.fixture(scope="module")
def wiki():
    return WikiSearch.from_passages([Passage("0", "Paris", LONG.strip()),
                                     Passage("1", "Oslo", "Oslo is the capital of Norway.")])


def reference_passages2string(contents: list[str]) -> str:
    """The reference's ``_passages2string`` as its code reads, over the ``document`` strings of the hits."""
    text = ""
    for index, content in enumerate(contents):
        lines = content.split("\n")
        text += f"Doc {index + 1} (Title: {lines[0]})\n" + "\n".join(lines[1:]) + "\n\n"
    return text.strip()


def test_reference_output_matches_the_references_layout(wiki):
    with SearchTool(wiki, SearchToolConfig(topk=2, output="reference")) as tool:
        text = tool.call("capital of France").text
    assert text == reference_passages2string([f'"Paris"\n{LONG.strip()}', '"Oslo"\nOslo is the capital of Norway.'])
    assert text.startswith('Doc 1 (Title: "Paris")\n') and len(text) > 3_000  # quotes kept, nothing cut


def test_the_paper_layout_is_unchanged(wiki):
    with SearchTool(wiki, SearchToolConfig(topk=1)) as tool:
        text = tool.call("capital of France").text
    assert text.startswith("Doc 1 (Title: Paris)\n") and text.endswith(" ...")


def test_contents_strings_from_the_references_server_are_rendered_as_they_are():
    hits = [{"document": '"A"\nline one\nline two', "score": 0.5}, {"document": '"B"\n', "score": 0.4}]
    assert format_hits_reference(hits) == reference_passages2string(['"A"\nline one\nline two', '"B"\n'])
    assert format_hits_reference([]) == ""


def test_an_empty_search_ends_the_episode_in_reference_mode(wiki):
    with SearchTool(wiki, SearchToolConfig(output="reference")) as tool:
        result = tool.call("  \n ")
    assert (result.ok, result.error, result.text) == (False, EMPTY_CALL, "")
    with SearchTool(wiki) as tool:
        assert tool.call("").error == "bad_input"


def test_an_unknown_output_is_refused():
    with pytest.raises(ValueError, match="output must be 'paper' or 'reference'"):
        SearchToolConfig(output="verbatim")
