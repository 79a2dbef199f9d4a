"""Errors of recipes, the Docker daemon, builds, patches, engine locks, reproducible
images and platforms."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError, ManyProblems, one_line


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
    hint = (
        "`docker info` and the daemon's log (`journalctl -u docker`, or dockerd's output) show its state; "
        "rerun once it answers normally"
    )


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

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        step: str = "",
        tail: list[str] | None = None,
        status: int | None = None,
    ):
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
    """A wheel for a locked image (an engine image, or a recipe's own packages) is not the file the lock names (other sha256)."""

    exit_code = 26
    hint = (
        "the file in the wheel cache or on the index changed; delete it from ~/.cache/kiln/wheels/locked and "
        "rebuild, or re-lock (`kiln engine lock RECIPE`) if the new file is the one you want"
    )


class LockInvalid(KilnError):
    """A lock (an engine image's, or a recipe's recipe.lock.json) that cannot be read, or no longer matches what it locks."""

    exit_code = 27
    hint = "re-lock: `kiln engine lock RECIPE` (or `--all`), then review the diff"


class DebianPinUnavailable(KilnError):
    """The Debian mirror no longer serves a version the engine lock pins."""

    exit_code = 28
    hint = (
        "Debian's mirrors keep only the newest version of each package: re-lock with `kiln engine lock RECIPE` "
        "and rebuild (the input digest changes with the lock)"
    )


class LockMissing(KilnError):
    """An image that is built from a lock has none: an engine image for this engine version, or a recipe naming build.python_packages without its recipe.lock.json."""

    exit_code = 29
    hint = "write it: `kiln engine lock RECIPE`, then commit the lock file"


class PatchInvalid(ManyProblems, KilnError):
    """Malformed patches or series files; each problem is its own line naming the file."""

    exit_code = 30
    hint = "each patch is a unified diff (-p1) with a free-text header holding `Why:` and `Upstream:` lines; see docs/patches.md"


class DiskSpaceShort(KilnError):
    """The engine builds a command is about to start need more disk than the Docker
    daemon's data root has free (domain/images/buildspace.py says how much each needs)."""

    exit_code = 35
    hint = (
        "free space (`kiln prune`, `docker image prune`), build one platform at a time (--platform P), or "
        "pass --skip-disk-check when the daemon's layer cache already holds the builder stages"
    )


# -- the engine's releases on the package index (kiln engine outdated, 36-38) ------------
class EngineOutdated(KilnError):
    """`kiln engine outdated`: a recipe pins an older engine release than the newest one on the package index."""

    exit_code = 36
    hint = (
        "`kiln engine bump --to VERSION` ports the series to the newest release, then "
        "`kiln engine bump --to VERSION --recipe NAME` moves each recipe (docs/patches.md)"
    )


class PackageIndexUnreachable(KilnError):
    """The package index could not be asked: no connection, a TLS failure, a timeout, or an HTTP error status."""

    exit_code = 37
    hint = (
        "check the network and pip's configuration (`pip config list`: index-url, cert), "
        "or name another index with --index-url"
    )


class PackageIndexInvalid(KilnError):
    """The package index answered with a page that is no simple-API page (PEP 691 JSON or PEP 503 HTML), or one too large to read."""

    exit_code = 38
    hint = "--index-url must name a simple index (the URL pip's index-url names, e.g. https://pypi.org/simple)"


# -- reproducible images (kiln rebuild --verify, kiln base build) -------------------------
class RebuildDiffers(KilnError):
    """`kiln rebuild --verify`: the image rebuilt from the recorded sources is not the one given."""

    exit_code = 31
    hint = (
        "the first layer and file that differ are named above; see docs/reproducibility.md "
        "for what is reproducible across what"
    )


class RebuildSourceMissing(KilnError):
    """`kiln rebuild --verify`: the image's labels name no recipe or revision to rebuild from, or the revision is not in this checkout."""

    exit_code = 32
    hint = "only images kiln built carry ai.kiln.recipe and org.opencontainers.image.revision; `git fetch` the commit first"


class BaseLockMismatch(KilnError):
    """`kiln base build`: debootstrap installed other Debian packages than docker-images/base/locks/<suite>.lock.json pins."""

    exit_code = 33
    hint = (
        "the mirror moved on (a point release or a security update): `kiln base build --relock` "
        "writes the new set into the lock; commit it (base and engine image ids change with it)"
    )


# -- platforms: linux/amd64 and linux/arm64 images of one recipe, one index (100-105)
class PlatformUnsupported(ManyProblems, KilnError):
    """A recipe declares a platform (engine.platforms) for which the pinned engine's lock
    holds no wheel; each problem names the wheel looked for."""

    exit_code = 100
    hint = (
        "`kiln engine lock RECIPE --platform P` adds a platform where the index has its wheels; "
        "otherwise drop P from engine.platforms"
    )


class PlatformNotDeclared(KilnError):
    """`--platform P` for a recipe whose engine.platforms does not list P."""

    exit_code = 101
    hint = "add P to engine.platforms in recipe.yaml (`kiln check` then says whether the engine has its wheels)"


class EmulationUnavailable(KilnError):
    """A build or run for another architecture than the host's, and no qemu emulation is
    registered with binfmt_misc for it."""

    exit_code = 102
    hint = "as root: `scripts/setup.sh --arm64` (installs qemu-user 10+, mounts binfmt_misc, registers qemu-aarch64); `kiln doctor` shows the state"
