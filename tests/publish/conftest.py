"""Fixtures for the publish tests: a real registry on 127.0.0.1 and kiln-test-mini
built once per module in a throwaway kiln tree that has a `publish:` section."""

from __future__ import annotations

import pytest
from clijson import validated
from kilntest import remove_images, renamed_mini, run_kiln
from localregistry import LocalRegistry, available
from pubtest import NAME, PUBLISH_SECTION, Mini
from signing import SIGNING_PASSWORD, publish_signed


@pytest.fixture(scope="session")
def registry_tools():
    why = available()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def registry(registry_tools, tmp_path_factory):
    """One registry shared by a module's tests (they use their own repositories or
    namespaces where they must not see each other's tags)."""
    reg = LocalRegistry(tmp_path_factory.mktemp("registry")).start()
    yield reg
    reg.stop()


@pytest.fixture
def fresh_registry(registry_tools, tmp_path):
    """An empty registry for tests that kill it or need every layer to travel."""
    reg = LocalRegistry(tmp_path / "registry").start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def mini(tmp_path_factory, base_image, docker_daemon):
    from kiln.basics import paths

    tmp = tmp_path_factory.mktemp("publish-tree")
    root = renamed_mini(tmp / "tree", NAME, PUBLISH_SECTION)
    (tmp / "docker-config").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_ROOT", str(root))
        mp.setenv("KILN_RESULTS_DIR", str(tmp / "results"))
        paths.repo_root.cache_clear()
        built = run_kiln("build", NAME, env={"KILN_ROOT": str(root)}, cwd=root)
        assert built.returncode == 0, built.stderr[-3000:]
        from kiln.domain.images.definitions import resolve
        from kiln.domain.publishing.rules import _engine_tag

        resolved = resolve(NAME)
        loaded, recipe_image = resolved.loaded, resolved.recipe_image
        image = docker_daemon.image(recipe_image.tag)
        yield Mini(
            root,
            tmp / "results",
            tmp / "docker-config",
            image.id,
            recipe_image.short,
            recipe_image.digest,
            _engine_tag(loaded),
            [],
        )
    paths.repo_root.cache_clear()
    remove_images(docker_daemon, f"kiln/{NAME}")


# -- the signed-publishing tests' registry, keys and signed image (test_sign_*.py) ------------
@pytest.fixture(scope="module")
def reg(registry_tools, tmp_path_factory):
    r = LocalRegistry(tmp_path_factory.mktemp("sign-registry"), log_level="info").start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def signing_keys(tmp_path_factory):
    from kiln.domain.signing import keys

    d = tmp_path_factory.mktemp("keys")
    ours = keys.write_key_pair(d / "team", SIGNING_PASSWORD.encode())
    other = keys.write_key_pair(d / "other", b"other-pw")
    return ours, other


@pytest.fixture(scope="module")
def signed(mini, reg, signing_keys):
    """The mini image published signed into namespace `signed/`; (publish result, digest)."""
    ours, _ = signing_keys
    result = publish_signed(mini, reg, "signed", ours.private, "--json")
    doc = validated("publish", result.stdout)
    return result, doc
