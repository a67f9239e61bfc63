"""Provenance: the reference is the authors' code at commit 480af9d, and nothing tracked points elsewhere.

Later commits of that copy are not the authors' (another account rewrote its README into a download
page for a Windows executable and added an opaque binary zip). A file that names such a commit as the
reference would send a reader there, so none may.
"""

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PINNED = "480af9d"
# Built from pieces so that this file does not name the commit it forbids.
FORBIDDEN = "19b" + "8fbe"


def tracked_files() -> list[pathlib.Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_no_tracked_file_names_a_commit_after_the_authors_as_the_reference():
    offenders = []
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        # The one allowed mention is the diff that shows the later commits touch no code.
        if FORBIDDEN in text.replace(f"git diff {PINNED} {FORBIDDEN}", ""):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_the_fidelity_page_pins_the_authors_commit_and_warns_about_the_later_ones():
    page = (ROOT / "docs" / "fidelity.md").read_text(encoding="utf-8")
    assert f"at commit {PINNED}" in page
    assert "not the authors'" in page
    assert "README.md" in page and "zip" in page
    assert "github.com/Gross-barium938/RAPO/blob" not in page  # its README is never linked
