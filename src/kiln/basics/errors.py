"""Every fatal, user-facing error kiln raises.

Each class carries its own exit code and a hint that tells the user what to do next.
The CLI prints ``kiln: error: <message>`` plus ``  hint: <hint>`` and exits with the
code; tracebacks only appear with ``--debug``. Codes are part of the CLI contract:
scripts and CI branch on them, so never renumber an existing class.
"""

from __future__ import annotations

import unicodedata


class KilnError(Exception):
    """Base class: a problem the user can act on."""

    exit_code = 1
    hint = ""

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint

    def lines(self) -> list[str]:
        """The lines the CLI prints, message first."""
        out = [self.message]
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


def one_line(text: str) -> str:
    """``text`` with control, format and line-separator characters escaped, so a hostile
    key or file name can neither split an error line nor send terminal escapes to CI logs."""
    return "".join(
        ch if ch == " " or unicodedata.category(ch) not in {"Cc", "Cf", "Zl", "Zp", "Cs"}
        else ascii(ch)[1:-1]
        for ch in text
    )


class ManyProblems:
    """Mixed in before KilnError: several problems at once, each printed as its own
    ``kiln: error:`` line (every hunk that fails, every invalid field), then the hint.
    (A mixin, not a KilnError itself: it has no exit code of its own.)"""

    hint: str

    def __init__(self, problems: list[str] | str, *, hint: str | None = None):
        problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(problems), hint=hint)  # type: ignore[call-arg]  # a mixin: KilnError is next in the MRO
        self.problems = problems

    def lines(self) -> list[str]:
        return [*self.problems, *([f"hint: {self.hint}"] if self.hint else [])]


class RecipeInvalid(ManyProblems, KilnError):
    """One or more recipe problems; each is its own ``file:line: field: message`` line."""

    exit_code = 2
    hint = "fix the field(s) above; `kiln schema` prints the JSON Schema for editors"

    def __init__(self, problems: list[str], *, hint: str | None = None):
        super().__init__([one_line(p) for p in problems], hint=hint)


class DockerUnavailable(KilnError):
    """The Docker daemon cannot be reached."""

    exit_code = 3
    hint = "start the daemon (`sudo dockerd &` or `systemctl start docker`) and check `kiln doctor`"


class DockerDaemonError(KilnError):
    """The Docker daemon answered a request with an error, or broke off its answer (it is
    reachable: that is `DockerUnavailable`). The message names what kiln was doing and
    quotes the daemon."""

    exit_code = 34
    hint = ("`docker info` and the daemon's log (`journalctl -u docker`, or dockerd's output) show its state; "
            "rerun once it answers normally")


class BaseImageMissing(KilnError):
    """The base image a Dockerfile starts FROM is neither local nor pullable."""

    exit_code = 4
    hint = "run `kiln base build` (air-gapped Debian base) or name a registry image with its digest"


class BuildFailed(KilnError):
    """A build that stopped at a step. `step` is the builder's `Step N/M : INSTRUCTION`
    line, `tail` that step's own output lines, `status` the exit status of a failed RUN
    (None when the step failed otherwise): callers map known statuses to typed errors."""

    exit_code = 5
    hint = "read the failing step's output above; rerun with `--debug` for the full log"

    def __init__(self, message: str, *, hint: str | None = None, step: str = "",
                 tail: list[str] | None = None, status: int | None = None):
        super().__init__(message, hint=hint)
        self.step = step
        self.tail = list(tail or [])
        self.status = status


class PatchFailed(ManyProblems, KilnError):
    """Hunks of a series that do not apply (or leave Python that does not compile); one line each."""

    exit_code = 6
    hint = "run `kiln patches check` to reproduce without Docker, or `kiln engine bump --to VERSION --dry-run`"


class OverrideDrift(ManyProblems, KilnError):
    """Whole-file replacements forked from another upstream file than the engine's; one line each."""

    exit_code = 7
    hint = "run `kiln override rebase RECIPE FEATURE --from OLD_VERSION` to 3-way merge onto the pinned engine"


class SmokeFailed(KilnError):
    """A smoke check of a served image failed (or the server never turned healthy)."""

    exit_code = 8
    record: dict | None = None  # the smoke record of the failed run, when one was made
    hint = "the last container log lines are printed above; `kiln run NAME` serves it interactively"


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


class ContainerStartFailed(KilnError):
    """A serving container exited or never turned healthy while starting."""

    exit_code = 13
    hint = "see the container log above; `kiln run NAME --print` shows the exact docker command"


class PortInUse(KilnError):
    """The host port to serve on is taken."""

    exit_code = 14
    hint = "pick another port with --port, or stop whatever listens there"


class ModelPathMissing(KilnError):
    """A recipe's host-path model folder does not exist on this host."""

    exit_code = 15
    hint = "download the weights to that path on the host, or point model.host_path at them"


class NoGPU(KilnError):
    """A CUDA recipe, and no NVIDIA GPU or container runtime here."""

    exit_code = 16
    hint = "this recipe needs NVIDIA GPUs and the NVIDIA container runtime; use --print to see the command"


class LaunchArgInvalid(ManyProblems, KilnError):
    """The pinned engine refuses the launch command: a flag, a value or a feature knob;
    each problem its own ``file:line: field: message`` line."""

    exit_code = 17
    hint = "the pinned engine refuses it; check `vllm serve --help=all` (and kiln-engine's knobs) for that version"

    def __init__(self, problems: list[str] | str, *, hint: str | None = None):
        problems = [problems] if isinstance(problems, str) else problems
        super().__init__([one_line(p) for p in problems], hint=hint)


class BudgetExceeded(KilnError):
    """A built image is larger than its recipe's size budget."""

    exit_code = 18
    hint = "shrink the image or raise budgets.max_image_size_gb in the recipe"


class CABundleInvalid(KilnError):
    """The CA bundle given for builds is missing or not PEM."""

    exit_code = 19
    hint = "point KILN_CA_BUNDLE (or --ca-bundle) at a readable PEM file"


class EngineFetchFailed(KilnError):
    """The engine's wheels could not be downloaded."""

    exit_code = 20
    hint = "check network access to PyPI (pip config) or pre-fill ~/.cache/kiln/wheels"


class EngineMismatch(KilnError):
    """The engine versions a built image really carries contradict the recipe's pin."""

    exit_code = 21
    hint = "the built engine does not match the recipe's engine pin; fix engine.* in the recipe"


class ImageNotBuilt(KilnError):
    """No image built from the recipe's current inputs."""

    exit_code = 22
    hint = "run `kiln build NAME` first"


class RebaseConflict(ManyProblems, KilnError):
    """Conflict blocks `kiln override rebase` left in the override's files; one line each."""

    exit_code = 23
    hint = "resolve the conflict markers in the override file, then rebuild"


class DebootstrapMissing(KilnError):
    """`kiln base build` needs debootstrap, and it is not installed."""

    exit_code = 24
    hint = "install it (`apt-get install debootstrap`) and run `kiln base build` as root"


class WheelHashMismatch(KilnError):
    """A wheel for a locked engine image is not the file the lock names (other sha256)."""

    exit_code = 26
    hint = ("the file in the wheel cache or on the index changed; delete it from ~/.cache/kiln/wheels/locked and "
            "rebuild, or re-lock (`kiln engine lock RECIPE`) if the new file is the one you want")


class LockInvalid(KilnError):
    """An engine lock that cannot be read, or no longer matches what it locks."""

    exit_code = 27
    hint = "re-lock: `kiln engine lock RECIPE` (or `--all`), then review the diff"


class DebianPinUnavailable(KilnError):
    """The Debian mirror no longer serves a version the engine lock pins."""

    exit_code = 28
    hint = ("Debian's mirrors keep only the newest version of each package: re-lock with `kiln engine lock RECIPE` "
            "and rebuild (the input digest changes with the lock)")


class LockMissing(KilnError):
    """An engine image that is built from a lock has none for this engine version."""

    exit_code = 29
    hint = "write it: `kiln engine lock RECIPE`, then commit the lock file"


class ContainerNotFound(KilnError):
    """`kiln logs/stop NAME` where NAME is not a container kiln started (or it is gone)."""

    exit_code = 50
    hint = "`kiln ps` lists the containers kiln started"


class ServerExited(KilnError):
    """A served container died after it had turned healthy."""

    exit_code = 51
    hint = "the last container log lines are printed above; `kiln run NAME --print` shows the exact docker command"


class NotACheckout(KilnError):
    """kiln runs outside a checkout and KILN_ROOT does not name one."""

    exit_code = 25
    hint = "cd into your kiln checkout, or set KILN_ROOT=/path/to/checkout"


class UsageError(KilnError):
    """A command line kiln does not accept, or an option it cannot act on."""

    exit_code = 64
    hint = "see `kiln --help`"


class PatchInvalid(ManyProblems, KilnError):
    """Malformed patches or series files; each problem is its own line naming the file."""

    exit_code = 30
    hint = "each patch is a unified diff (-p1) with a free-text header holding `Why:` and `Upstream:` lines; see docs/patches.md"


# -- reproducible images (kiln rebuild --verify, kiln base build) -------------------------
class RebuildDiffers(KilnError):
    """`kiln rebuild --verify`: the image rebuilt from the recorded sources is not the one given."""

    exit_code = 31
    hint = ("the first layer and file that differ are named above; see docs/reproducibility.md "
            "for what is reproducible across what")


class RebuildSourceMissing(KilnError):
    """`kiln rebuild --verify`: the image's labels name no recipe or revision to rebuild from, or the revision is not in this checkout."""

    exit_code = 32
    hint = "only images kiln built carry ai.kiln.recipe and org.opencontainers.image.revision; `git fetch` the commit first"


class BaseLockMismatch(KilnError):
    """`kiln base build`: debootstrap installed other Debian packages than docker-images/base/locks/<suite>.lock.json pins."""

    exit_code = 33
    hint = ("the mirror moved on (a point release or a security update): `kiln base build --relock` "
            "writes the new set into the lock; commit it (base and engine image ids change with it)")


# -- publishing (kiln publish / kiln promote) ---------------------------------------------
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


class NodeLost(KilnError):
    """A node of a multi-node group exited while the group started or served."""

    exit_code = 70
    hint = "its log tail is above; every node of the group was stopped and removed"


class ImageNotPublished(KilnError):
    """`kiln render k8s` needs the image by digest and this recipe was never published."""

    exit_code = 71
    hint = "`kiln publish NAME` first (it records the digest), or pass --image REPO@sha256:..."


# -- signing and verification (80-89): one class per kind of failure, so that a script or
# an admission hook can tell "nobody signed this" from "somebody tampered with this"
class SigningKeyInvalid(KilnError):
    """A key file kiln cannot use: missing, not a cosign/PEM key, an unsupported algorithm,
    a key pair that would overwrite files, or a key other than the one the recipe pins."""

    exit_code = 80
    hint = "`kiln keys generate` writes a cosign-compatible pair (ECDSA P-256); pass the .key to --sign, the .pub to --key"


class SigningPasswordInvalid(KilnError):
    """The private key's password is wrong or could not be read."""

    exit_code = 81
    hint = "set KILN_SIGNING_PASSWORD (or COSIGN_PASSWORD), or type the password when asked; never on the command line"


class SignatureMissing(KilnError):
    """No signature (`sha256-<hex>.sig`) or no attestation of a required type for the digest."""

    exit_code = 82
    hint = "publish it with `kiln publish NAME --sign KEY`; an image whose tag moved needs a signature of its own"


class SignatureInvalid(KilnError):
    """A signature or DSSE envelope does not verify: the payload, the signature or the key changed."""

    exit_code = 83
    hint = "do not deploy it: the signed bytes were altered, or the key is not the one that signed"


class SignedByOtherKey(KilnError):
    """The signature names (and verifies with) another key than the one given."""

    exit_code = 84
    hint = "verify with the public key that signed it (see its fingerprint above), or re-sign with yours"


class SignedDigestMismatch(KilnError):
    """The signature is genuine but for another image digest (a tag moved, or a signature copied)."""

    exit_code = 85
    hint = "the image under this reference is not the one that was signed; pin the digest you verified (REPO@sha256:...)"


class SignedIdentityMismatch(KilnError):
    """The signature is genuine but names another repository (a signature copied across repositories)."""

    exit_code = 86
    hint = "verify the image in the repository it was signed for, or re-sign it for this one"


class SignatureMalformed(KilnError):
    """A `.sig`/`.att` manifest, payload or DSSE envelope that is not in cosign's format."""

    exit_code = 87
    hint = "the signature artefacts in the registry are damaged or were not written by cosign or kiln; re-sign the image"


class AttestationSubjectMismatch(KilnError):
    """A genuine attestation whose in-toto subject is another image digest."""

    exit_code = 88
    hint = "the SBOM/provenance attached here describes another image; re-attest this digest (`kiln publish --sign`)"


class SigningRequired(KilnError):
    """The recipe requires signatures (publish.require_signature) and no key was given."""

    exit_code = 89
    hint = "pass --sign KEY to publish, --key PUB to promote (or pin publish.public_key in the recipe)"


# NOTE (sign branch): 88 and 89 are allocated to signing (80-89); these two came from the
# sbom branch as 88/89 and are renumbered 90/91 here until the integrator assigns them.
# -- supply chain (kiln sbom; the SBOM and provenance documents) ---------------------------
class SbomReadFailed(KilnError):
    """What an image holds could not be read (the in-image read failed): no SBOM is
    printed rather than one with parts missing (an unreadable engine lock is LockInvalid)."""

    exit_code = 96
    hint = "rerun with --debug; `docker run --rm --entrypoint python IMAGE -V` shows whether the image has a Python"


class SbomWriteFailed(KilnError):
    """`kiln sbom -o FILE` could not write FILE (nothing half-written is left there)."""

    exit_code = 97
    hint = "pick a writable path for -o, or leave -o out to print to stdout"


# -- the collection: fitting a recipe to its GPUs, and weights from a Hugging Face cache
# (92-95 of the 90-95 allocation)
class PlanDoesNotFit(ManyProblems, KilnError):
    """`kiln plan` / `kiln check`: the recipe's weights, KV cache and engine reserve exceed
    what its GPUs give vLLM (capacity x gpu-memory-utilization)."""

    exit_code = 92
    hint = "`kiln plan NAME --gpu G --gpus N` shows the table; use more or larger GPUs, a lower max-model-len, or a smaller dtype"


class HfSnapshotMissing(ManyProblems, KilnError):
    """A Hugging Face cache lacks a pinned snapshot, or part of one (the server runs
    offline and would fail inside the hub client)."""

    exit_code = 93
    hint = "`kiln fetch NAME` fills the cache where the hub is reachable (KILN_HF_CACHE picks the cache folder)"


class FetchFailed(KilnError):
    """`kiln fetch` could not download a pinned snapshot (network, authorisation, a
    revision the hub does not have), or the download left it incomplete."""

    exit_code = 94
    hint = "check the network and HF_TOKEN (a gated repo needs one); nothing half-downloaded is used: rerun to resume"


class ModelShapeUnknown(KilnError):
    """`kiln plan` has neither the model's config.json nor a `shape:` block in the recipe,
    or the config lacks a number the plan needs."""

    exit_code = 95
    hint = "add a `shape:` block to the model in recipe.yaml (config.json's keys, with their source), or fetch the weights"


# -- platforms: linux/amd64 and linux/arm64 images of one recipe, one index (100-105)
class PlatformUnsupported(ManyProblems, KilnError):
    """A recipe declares a platform (engine.platforms) for which the pinned engine's lock
    holds no wheel; each problem names the wheel looked for."""

    exit_code = 100
    hint = ("`kiln engine lock RECIPE --platform P` adds a platform where the index has its wheels; "
            "otherwise drop P from engine.platforms")


class PlatformNotDeclared(KilnError):
    """`--platform P` for a recipe whose engine.platforms does not list P."""

    exit_code = 101
    hint = "add P to engine.platforms in recipe.yaml (`kiln check` then says whether the engine has its wheels)"


class EmulationUnavailable(KilnError):
    """A build or run for another architecture than the host's, and no qemu emulation is
    registered with binfmt_misc for it."""

    exit_code = 102
    hint = "as root: `scripts/setup.sh --arm64` (installs qemu-user-static, mounts binfmt_misc, enables qemu-aarch64); `kiln doctor` shows the state"
