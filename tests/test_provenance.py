"""Provenance: the reference is the authors' code at commit 480af9d, and nothing tracked points elsewhere.

Later commits of that copy are not the authors' (another account rewrote its README into a download
page for a Windows executable and added an opaque binary zip). A file that names such a commit as the
reference would send a reader there, so none may.
"""

import pathlib
import subprocess
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PINNED = "480af9d"
# Built from pieces so that this file does not name the commit it forbids, nor link the copy.
FORBIDDEN = "19b" + "8fbe"
COPY_URL = "github.com/" + "gross-barium938/rapo"


def tracked_files() -> list[pathlib.Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.decode().split("\0") if name]


def tracked_texts() -> Iterator[tuple[str, str]]:
    """``(path, text)`` of every tracked text file."""
    for path in tracked_files():
        try:
            yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def test_no_tracked_file_names_a_commit_after_the_authors_as_the_reference():
    # The one allowed mention is the diff that shows the later commits touch no code.
    offenders = [path for path, text in tracked_texts()
                 if FORBIDDEN in text.replace(f"git diff {PINNED} {FORBIDDEN}", "")]
    assert offenders == []


def test_no_tracked_file_links_the_copy():
    # Any link to the copy opens its README (or leads to the zip), which is no longer the authors'.
    assert [path for path, text in tracked_texts() if COPY_URL in text.lower()] == []


def test_the_fidelity_page_pins_the_authors_commit_and_warns_about_the_later_ones():
    page = (ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8")
    assert f"at commit {PINNED}" in page
    assert "not the authors'" in page
    assert "README.md" in page and "zip" in page
    assert COPY_URL not in page.lower()  # its README is never linked
