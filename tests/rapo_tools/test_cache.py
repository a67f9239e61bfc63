"""rapo's one cache folder: RAPO_CACHE_DIR moves it, else the platform's user cache folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rapo_tools.cache import rapo_cache_dir


def test_rapo_cache_dir_follows_the_environment_variable_at_call_time(monkeypatch, tmp_path):
    monkeypatch.setenv("RAPO_CACHE_DIR", str(tmp_path))
    assert rapo_cache_dir() == tmp_path
    assert rapo_cache_dir("models", "smollm2") == tmp_path / "models" / "smollm2"
    assert not (tmp_path / "models").exists()  # naming a folder does not create it


def test_rapo_cache_dir_expands_a_home_relative_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RAPO_CACHE_DIR", "~/rapo-cache")
    assert rapo_cache_dir() == tmp_path / "rapo-cache"


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG rule is Linux's user cache folder")
def test_an_unset_or_empty_setting_means_the_user_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for value in (None, ""):
        if value is None:
            monkeypatch.delenv("RAPO_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("RAPO_CACHE_DIR", value)
        assert rapo_cache_dir() == tmp_path / ".cache" / "rapo"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert rapo_cache_dir("indexes") == Path(tmp_path / "xdg" / "rapo" / "indexes")
