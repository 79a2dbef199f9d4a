"""Recipes that require signatures (publish.require_signature, publish.public_key) against a
real registry on 127.0.0.1: unsigned and wrong-key publishes refused before anything is
pushed; a signed publish, then a promote that verifies."""

from __future__ import annotations

import pytest
from clijson import validated
from pubtest import NAME, REPOSITORY
from signing import config_digest, signing_env

pytestmark = [pytest.mark.docker, pytest.mark.registry]


# -- recipes that require signatures ---------------------------------------------------------------
@pytest.fixture(scope="module")
def strict(mini, signing_keys, tmp_path_factory, docker_daemon):
    """The mini recipe with publish.require_signature and publish.public_key pinned, built
    in a copy of the tree (its own input digest)."""
    import shutil

    from kilntest import run_kiln

    ours, _ = signing_keys
    root = tmp_path_factory.mktemp("strict") / "tree"
    shutil.copytree(mini.root, root)
    recipe_dir = root / "recipes" / NAME
    shutil.copy(ours.public, recipe_dir / "team.pub")
    recipe = recipe_dir / "recipe.yaml"
    recipe.write_text(
        recipe.read_text().replace(
            f"  repository: {REPOSITORY}\n",
            f"  repository: {REPOSITORY}\n  require_signature: true\n  public_key: team.pub\n",
        )
    )
    built = run_kiln("build", NAME, env={"KILN_ROOT": str(root)}, cwd=root)
    assert built.returncode == 0, built.stderr[-3000:]
    import dataclasses

    from kiln.basics import paths
    from kiln.domain.images.definitions import resolve

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_ROOT", str(root))
        paths.repo_root.cache_clear()
        recipe_image = resolve(NAME).recipe_image
        image_id = docker_daemon.image(recipe_image.tag).id
    paths.repo_root.cache_clear()
    return dataclasses.replace(
        mini,
        root=root,
        image_id=image_id,
        short=recipe_image.short,
        input_digest=recipe_image.digest,
        outputs=mini.outputs,
    )


def test_required_signature_refuses_unsigned_and_wrong_key_publishes_before_pushing(
    strict, reg, signing_keys, monkeypatch
):
    ours, other = signing_keys
    strict.pass_smoke()
    unsigned = strict.kiln("publish", NAME, "--registry", f"{reg.host}/strict", registry=reg)
    assert unsigned.returncode == 89 and "publish.require_signature" in unsigned.stderr, unsigned.stderr
    wrong_key = strict.kiln(
        "publish",
        NAME,
        "--registry",
        f"{reg.host}/strict",
        "--sign",
        str(other.private),
        registry=reg,
        **signing_env(KILN_SIGNING_PASSWORD="other-pw"),
    )
    assert wrong_key.returncode == 80 and "pins" in wrong_key.stderr, wrong_key.stderr
    wrong_pw = strict.kiln(
        "publish",
        NAME,
        "--registry",
        f"{reg.host}/strict",
        "--sign",
        str(ours.private),
        registry=reg,
        **signing_env(KILN_SIGNING_PASSWORD="nope"),
    )
    assert wrong_pw.returncode == 81 and "nope" not in wrong_pw.stderr, wrong_pw.stderr
    # with stdin taken by the registry password, the signing password must come from the environment
    for name in ("KILN_SIGNING_PASSWORD", "COSIGN_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    clash = strict.kiln(
        "publish",
        NAME,
        "--registry",
        f"{reg.host}/strict",
        "--sign",
        str(ours.private),
        "--password-stdin",
        registry=reg,
        input=reg.password + "\n",
        KILN_REGISTRY_PASSWORD="",
    )
    assert clash.returncode == 81 and "cannot come from there too" in clash.stderr, clash.stderr
    assert reg.tags(f"strict/{REPOSITORY}") == []  # nothing was pushed by any of them


def test_required_signature_publish_then_promote_verifies(strict, reg, signing_keys):
    ours, other = signing_keys
    ns = f"{reg.host}/strict"
    strict.pass_smoke()
    result = strict.kiln(
        "publish", NAME, "--registry", ns, "--sign", str(ours.private), "--json", registry=reg, **signing_env()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    digest = validated("publish", result.stdout)["manifest_digest"]
    # promote verifies with the recipe's pinned key (no --key needed) ...
    promoted = strict.kiln(
        "promote", NAME, "--registry", ns, "--from", "experimental", "--to", "stable", "--json", registry=reg
    )
    assert promoted.returncode == 0, promoted.stderr
    assert validated("promote", promoted.stdout)["signature"]["key_fingerprint"] == ours.fingerprint
    # ... and refuses to move a channel to an image that fails verification
    other_image, _ = reg.push_tiny(f"strict/{REPOSITORY}", "experimental")
    refused = strict.kiln("promote", NAME, "--registry", ns, "--from", "experimental", "--to", "stable", registry=reg)
    assert refused.returncode in (12, 82), refused.stderr  # no smoke record for it, or no signature
    strict.pass_smoke(config_digest(reg, f"strict/{REPOSITORY}", "experimental"))
    refused = strict.kiln("promote", NAME, "--registry", ns, "--from", "experimental", "--to", "stable", registry=reg)
    assert refused.returncode == 82 and other_image in refused.stderr, refused.stderr
    assert reg.manifest(f"strict/{REPOSITORY}", "stable")[0] == digest  # the channel did not move
    wrong = strict.kiln(
        "promote",
        NAME,
        "--registry",
        ns,
        "--from",
        "stable",
        "--to",
        "experimental",
        "--key",
        str(other.public),
        registry=reg,
    )
    assert wrong.returncode == 84, wrong.stderr
