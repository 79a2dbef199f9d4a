"""Every fatal, user-facing error kiln raises.

Each class carries its own exit code and a hint that tells the user what to do next.
The CLI prints ``kiln: error: <message>`` plus ``  hint: <hint>`` and exits with the
code; tracebacks only appear with ``--debug``. Codes are part of the CLI contract:
scripts and CI branch on them, so never renumber an existing class (docs/cli-json.md
says why the numbers were kept when the classes were grouped by family).

This package's namespace is the public surface (`from kiln.basics.errors import X`).
`base` holds `KilnError` and what every error shares; the classes live in one module per
family, named in FAMILIES in the order docs/cli-json.md's exit-code table lists them
(`python scripts/exit_codes.py` writes that table): a new class goes into its family's
module, a new family is a new module and a new entry here.
"""

from kiln.basics.errors.base import (
    ErrorBody,
    ErrorDocument,
    KilnError,
    ManyProblems,
    one_line,
)
from kiln.basics.errors.building import (
    BaseImageMissing,
    BaseLockMismatch,
    BudgetExceeded,
    BuildFailed,
    CABundleInvalid,
    DebootstrapMissing,
    DiskSpaceShort,
    EngineMismatch,
    ImageNotBuilt,
    RebuildDiffers,
    RebuildSourceMissing,
)
from kiln.basics.errors.daemon import (
    DockerDaemonError,
    DockerUnavailable,
)
from kiln.basics.errors.engine import (
    DebianPinUnavailable,
    EngineFetchFailed,
    EngineOutdated,
    LockInvalid,
    LockMissing,
    PackageIndexInvalid,
    PackageIndexUnreachable,
    WheelHashMismatch,
)
from kiln.basics.errors.models import (
    FetchFailed,
    HfSnapshotMissing,
    ModelShapeUnknown,
    PlanDoesNotFit,
)
from kiln.basics.errors.patches import (
    OverrideDrift,
    PatchFailed,
    PatchInvalid,
    RebaseConflict,
)
from kiln.basics.errors.platforms import (
    EmulationUnavailable,
    PlatformNotDeclared,
    PlatformUnsupported,
)
from kiln.basics.errors.publishing import (
    ChannelEmpty,
    ChannelInvalid,
    ImageNotPublished,
    ManifestMismatch,
    NotSmokeTested,
    PushFailed,
    RecordInvalid,
    RegistryAuthFailed,
    RegistryInvalid,
    RegistryRateLimited,
    RegistryServerError,
    RegistryUnreachable,
    TagWriteFailed,
)
from kiln.basics.errors.recipes import (
    LaunchArgInvalid,
    RecipeInvalid,
)
from kiln.basics.errors.serving import (
    ContainerNotFound,
    ContainerStartFailed,
    ModelPathMissing,
    NodeLost,
    NoGPU,
    PortInUse,
    ServerExited,
    SmokeFailed,
)
from kiln.basics.errors.signing import (
    AttestationSubjectMismatch,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    SignedByOtherKey,
    SignedDigestMismatch,
    SignedIdentityMismatch,
    SigningKeyInvalid,
    SigningPasswordInvalid,
    SigningRequired,
)
from kiln.basics.errors.supplychain import (
    SbomReadFailed,
    SbomWriteFailed,
)
from kiln.basics.errors.usage import (
    NotACheckout,
    UsageError,
)

# the modules the error classes live in, one per family, in the order the documented table lists them
FAMILIES = (
    "usage",
    "recipes",
    "daemon",
    "building",
    "patches",
    "engine",
    "platforms",
    "serving",
    "models",
    "publishing",
    "signing",
    "supplychain",
)

__all__ = [
    "FAMILIES",
    "AttestationSubjectMismatch",
    "BaseImageMissing",
    "BaseLockMismatch",
    "BudgetExceeded",
    "BuildFailed",
    "CABundleInvalid",
    "ChannelEmpty",
    "ChannelInvalid",
    "ContainerNotFound",
    "ContainerStartFailed",
    "DebianPinUnavailable",
    "DebootstrapMissing",
    "DiskSpaceShort",
    "DockerDaemonError",
    "DockerUnavailable",
    "EmulationUnavailable",
    "EngineFetchFailed",
    "EngineMismatch",
    "EngineOutdated",
    "ErrorBody",
    "ErrorDocument",
    "FetchFailed",
    "HfSnapshotMissing",
    "ImageNotBuilt",
    "ImageNotPublished",
    "KilnError",
    "LaunchArgInvalid",
    "LockInvalid",
    "LockMissing",
    "ManifestMismatch",
    "ManyProblems",
    "ModelPathMissing",
    "ModelShapeUnknown",
    "NoGPU",
    "NodeLost",
    "NotACheckout",
    "NotSmokeTested",
    "OverrideDrift",
    "PackageIndexInvalid",
    "PackageIndexUnreachable",
    "PatchFailed",
    "PatchInvalid",
    "PlanDoesNotFit",
    "PlatformNotDeclared",
    "PlatformUnsupported",
    "PortInUse",
    "PushFailed",
    "RebaseConflict",
    "RebuildDiffers",
    "RebuildSourceMissing",
    "RecipeInvalid",
    "RecordInvalid",
    "RegistryAuthFailed",
    "RegistryInvalid",
    "RegistryRateLimited",
    "RegistryServerError",
    "RegistryUnreachable",
    "SbomReadFailed",
    "SbomWriteFailed",
    "ServerExited",
    "SignatureInvalid",
    "SignatureMalformed",
    "SignatureMissing",
    "SignedByOtherKey",
    "SignedDigestMismatch",
    "SignedIdentityMismatch",
    "SigningKeyInvalid",
    "SigningPasswordInvalid",
    "SigningRequired",
    "SmokeFailed",
    "TagWriteFailed",
    "UsageError",
    "WheelHashMismatch",
    "one_line",
]
