"""The embedded models are found where `make setup` puts them: an installed package, or a wheel unpacked in the venv."""

from pathlib import Path

import pytest

from rapo_tools import models


def test_an_installed_package_is_found_where_python_imports_it():
    assert models.default_embedding_model().endswith("model")


def test_a_wheel_unpacked_under_the_venv_share_folder_stands_in_for_an_installed_package(tmp_path, monkeypatch):
    (tmp_path / "rapo_unpacked_model_pkg").mkdir()
    monkeypatch.setattr(models, "UNPACKED_PACKAGES_DIR", tmp_path)
    assert models._package_dir("rapo_unpacked_model_pkg", "pip install x") == tmp_path / "rapo_unpacked_model_pkg"


def test_a_missing_model_package_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "UNPACKED_PACKAGES_DIR", tmp_path)
    with pytest.raises(models.EmbeddedModelMissingError, match="make setup.*pip install x"):
        models._package_dir("rapo_no_such_model_pkg", "pip install x")


def test_the_policy_gguf_is_present_after_make_setup():
    directory, file_name = models.default_policy_gguf()
    assert (Path(directory) / file_name).stat().st_size > 50_000_000
