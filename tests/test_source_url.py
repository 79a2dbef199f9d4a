"""The image's `org.opencontainers.image.source` label comes from what is committed, so
that two clones of one commit (another remote, a local path, a fork) get one image id."""

from __future__ import annotations

from kiln.domain.images import image_naming


def test_no_committed_url_no_label(tmp_path, monkeypatch):
    monkeypatch.setattr(image_naming, "repo_root", lambda: tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert image_naming._source_url() == ""
    labels = image_naming._oci_labels("kiln/x", "1", image_naming.sourcedate.SourceDate(0, "unknown"))
    assert "org.opencontainers.image.source" not in labels


def test_committed_url_is_the_label(tmp_path, monkeypatch):
    monkeypatch.setattr(image_naming, "repo_root", lambda: tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[project.urls]\nSource = "https://example.org/kiln.git"\n'
    )
    labels = image_naming._oci_labels("kiln/x", "1", image_naming.sourcedate.SourceDate(0, "unknown"))
    assert labels["org.opencontainers.image.source"] == "https://example.org/kiln.git"


def test_unreadable_pyproject_no_label(tmp_path, monkeypatch):
    monkeypatch.setattr(image_naming, "repo_root", lambda: tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project\n")
    assert image_naming._source_url() == ""
