"""Errors of publishing: registries, channels and tags (`kiln publish`, `kiln promote`),
and an image needed by digest that was never published."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError


class PushFailed(KilnError):
    """Pushing an image's layers or manifest to the registry failed."""

    exit_code = 9
    hint = "nothing was tagged in the registry; rerun `kiln publish` once the cause is fixed"


class RegistryUnreachable(KilnError):
    """The registry does not answer at the address given."""

    exit_code = 10
    hint = "check the registry address and that it is up (`curl https://HOST/v2/`, or http:// for a plain-HTTP one)"


class RegistryAuthFailed(KilnError):
    """The registry refused the credentials (or asked for some and none were given)."""

    exit_code = 11
    hint = "set KILN_REGISTRY_USER / KILN_REGISTRY_PASSWORD (or `docker login`) with valid credentials"


class NotSmokeTested(KilnError):
    """`kiln publish` of an image without a passing smoke record."""

    exit_code = 12
    hint = "run `kiln smoke NAME` first, or pass --skip-smoke-check (pushed only under a `-unsmoked` tag)"


class RegistryInvalid(KilnError):
    """No registry given, or one that is not HOST[:PORT][/NAMESPACE]."""

    exit_code = 40
    hint = "pass --registry HOST[:PORT][/NAMESPACE] or set publish.registry in the recipe"


class ChannelInvalid(KilnError):
    """A channel publish cannot move: not in the recipe's publish.channels, or for an unsmoked image."""

    exit_code = 41
    hint = "use one of the recipe's publish.channels (default: experimental, stable)"


class ChannelEmpty(KilnError):
    """`kiln promote --from C` where the registry has no tag C in the repository."""

    exit_code = 42
    hint = "publish to that channel first: `kiln publish NAME --channel CHANNEL`"


class ManifestMismatch(KilnError):
    """What the registry returns is not what was pushed (digest or image id differ)."""

    exit_code = 43
    hint = "the registry (or a proxy in front of it) rewrote the manifest; no channel tag was moved"


class TagWriteFailed(KilnError):
    """The layers are pushed but the registry refused a tag (manifest PUT)."""

    exit_code = 44
    hint = "check the account may push tags to this repository; rerun `kiln publish` (layers are not re-sent)"


class RegistryRateLimited(KilnError):
    """The registry still answered 429 after the bounded retries (Retry-After honoured)."""

    exit_code = 45
    hint = "wait a few minutes and rerun (layers already up are not re-sent); authenticated accounts get higher limits"


class RegistryServerError(KilnError):
    """The registry answered 5xx on every bounded retry: it is up but failing."""

    exit_code = 46
    hint = "the registry itself is failing (see its logs or status page); rerun once it answers again"


class RecordInvalid(KilnError):
    """A record kiln reads back that is not in the shape its writer gives it (a smoke, build or
    publish record in the state folder, a measured build in docs/): damaged or edited, so not
    trusted.

    The message names the file and the field; nothing of the record is used."""

    exit_code = 47
    hint = (
        "move the file named away (kiln trusts no part of it) and redo what wrote it: `kiln smoke NAME` for a "
        "smoke record, `kiln build NAME` for a build record, `kiln publish NAME` for a publish record"
    )


class ImageNotPublished(KilnError):
    """`kiln render k8s` needs the image by digest and this recipe was never published."""

    exit_code = 71
    hint = "`kiln publish NAME` first (it records the digest), or pass --image REPO@sha256:..."
