"""The checkpoint layout every component agrees on (docs/contracts.md sections 3 and 5).

Torch-free on purpose: the trainer (trainer/storage.py, trainer/checkpoint.py) and the
region agents (region_agents/transfer.py, region_agents/staging.py, agent.py) both
import it, and an agent must not pay for importing torch. It holds:

* names: step directory names (`step-%09d`), checkpoint URI parsing;
* manifest: build / serialize / parse / validate `manifest.json` (versions 1-3);
* digests: xxh3_128 (v3) and sha256 (v2) file digests;
* discovery: list a root's step directories, "latest complete", the resume fallback;
* retry: the one `RetryPolicy` and the one transient-error check;
* s3: S3 client setup (endpoint from env, path style, timeouts, retries).

Heavy imports (boto3, botocore, tenacity, xxhash) happen inside the functions that need them.
"""

from checkpoint_layout.digests import (
    HASH_ALGO,
    LEGACY_HASH_ALGOS,
    expected_digest,
    hash_bytes,
    hash_file,
    new_hasher,
)
from checkpoint_layout.discovery import (
    CheckpointMissing,
    ResumePoint,
    latest_complete,
    latest_complete_checkpoint,
    list_local_steps,
    list_s3_steps,
    list_steps,
    resolve_resume,
)
from checkpoint_layout.manifest import (
    MANIFEST,
    MANIFEST_VERSION,
    SUPPORTED_VERSIONS,
    ManifestError,
)
from checkpoint_layout.names import (
    STEP_PREFIX,
    LayoutError,
    check_scheme,
    normalize,
    parse_step,
    split_s3_uri,
    split_step_uri,
    step_name,
)
from checkpoint_layout.retry import MOVER_RETRY, RetryPolicy, TransientError, is_transient
from checkpoint_layout.s3 import endpoint_from_env, make_probe_client, make_s3_client

__all__ = [
    "HASH_ALGO",
    "LEGACY_HASH_ALGOS",
    "MANIFEST",
    "MANIFEST_VERSION",
    "MOVER_RETRY",
    "STEP_PREFIX",
    "SUPPORTED_VERSIONS",
    "CheckpointMissing",
    "LayoutError",
    "ManifestError",
    "ResumePoint",
    "RetryPolicy",
    "TransientError",
    "check_scheme",
    "endpoint_from_env",
    "expected_digest",
    "hash_bytes",
    "hash_file",
    "is_transient",
    "latest_complete",
    "latest_complete_checkpoint",
    "list_local_steps",
    "list_s3_steps",
    "list_steps",
    "make_probe_client",
    "make_s3_client",
    "new_hasher",
    "normalize",
    "parse_step",
    "resolve_resume",
    "split_s3_uri",
    "split_step_uri",
    "step_name",
]
