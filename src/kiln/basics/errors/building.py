"""Errors of building images: the base image, the build itself, the checks before a tag
(size budget, engine versions, disk space, the CA bundle), and reproducible images."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError


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
    ) -> None:
        super().__init__(message, hint=hint)
        self.step = step
        self.tail = list(tail or [])
        self.status = status


class BudgetExceeded(KilnError):
    """A built image is larger than its recipe's size budget."""

    exit_code = 18
    hint = "shrink the image or raise budgets.max_image_size_gb in the recipe"


class CABundleInvalid(KilnError):
    """The CA bundle given for builds is missing or not PEM."""

    exit_code = 19
    hint = "point KILN_CA_BUNDLE (or --ca-bundle) at a readable PEM file"


class EngineMismatch(KilnError):
    """The engine versions a built image really carries contradict the recipe's pin."""

    exit_code = 21
    hint = "the built engine does not match the recipe's engine pin; fix engine.* in the recipe"


class ImageNotBuilt(KilnError):
    """No image built from the recipe's current inputs."""

    exit_code = 22
    hint = "run `kiln build NAME` first"


class DebootstrapMissing(KilnError):
    """`kiln base build` needs debootstrap, and it is not installed."""

    exit_code = 24
    hint = "install it (`apt-get install debootstrap`) and run `kiln base build` as root"


class RebuildDiffers(KilnError):
    """`kiln rebuild --verify`: the image rebuilt from the recorded sources is not the one given."""

    exit_code = 31
    hint = (
        "the first layer and file that differ are named above; see docs/reproducibility.md "
        "for what is reproducible across what"
    )


class RebuildSourceMissing(KilnError):
    """`kiln rebuild --verify`: the image's labels name no recipe or revision to rebuild from,
    or the revision is not in this checkout."""

    exit_code = 32
    hint = (
        "only images kiln built carry ai.kiln.recipe and org.opencontainers.image.revision; "
        "`git fetch` the commit first"
    )


class BaseLockMismatch(KilnError):
    """`kiln base build`: debootstrap installed other Debian packages than
    docker-images/base/locks/<suite>.lock.json pins."""

    exit_code = 33
    hint = (
        "the mirror moved on (a point release or a security update): `kiln base build --relock` "
        "writes the new set into the lock; commit it (base and engine image ids change with it)"
    )


class DiskSpaceShort(KilnError):
    """The engine builds a command is about to start need more disk than the Docker
    daemon's data root has free (domain/images/disk_space.py says how much each needs)."""

    exit_code = 35
    hint = (
        "free space (`kiln prune`, `docker image prune`), build one platform at a time (--platform P), or "
        "pass --skip-disk-check when the daemon's layer cache already holds the builder stages"
    )
