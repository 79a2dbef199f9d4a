"""Errors of platforms: linux/amd64 and linux/arm64 images of one recipe, and emulation
of the other architecture."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError, ManyProblems


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
    hint = (
        "as root: `scripts/setup.sh --arm64` (installs qemu-user 10+, mounts binfmt_misc, registers qemu-aarch64); "
        "`kiln doctor` shows the state"
    )
