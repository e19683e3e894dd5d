"""Is this text a storage URI a job can use? Checked when the spec is read, so a URI without a bucket or a relative
file path is refused at plan time with the fix, not on a node after five retries."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

SCHEMES = ("file", "s3", "gs", "az", "abfs", "abfss")
# The characters each platform allows in a bucket (container) name, and the length range: S3 (3-63; older buckets
# in us-east-1 up to 255 with capitals and '_'), Cloud Storage (3-63, or up to 222 with dots), Azure containers
# (3-63; '$root', '$web' and '$logs' are special).
_BUCKETS = {
    "s3": (re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]"), "S3 bucket names are 3-63 lowercase letters, "
           "digits, '.' and '-'"),
    "gs": (re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"), "Cloud Storage bucket names are 3-63 lowercase "
           "letters, digits, '.', '_' and '-'"),
    "az": (re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]|\$root|\$web|\$logs"), "Azure container names are 3-63 "
           "lowercase letters, digits and '-'"),
}
_ABFS_HOST = re.compile(r"([a-z0-9][a-z0-9-]{1,61}[a-z0-9]|\$root)@[a-z0-9]{3,24}\.dfs\.core\.windows\.net")
_EXAMPLES = {"s3": "s3://my-bucket/runs/job", "gs": "gs://my-bucket/runs/job", "az": "az://my-container/runs/job",
             "abfs": "abfs://container@account.dfs.core.windows.net/runs/job", "file": "file:///absolute/folder"}


def check_uri(value: str) -> str:
    """``value`` if it is a usable storage URI, else ValueError saying what is wrong and what a good one looks like."""
    scheme = value.split("://", 1)[0] if "://" in value else ""
    if scheme not in SCHEMES:
        from cloudtrain.storage import schemes

        known = schemes() if scheme else list(SCHEMES)  # a store plugin's scheme: the plugin checks its own names
        if scheme not in known:
            raise ValueError(f"{value!r} is not a storage URI; use one of " + ", ".join(f"{s}://" for s in known)
                             + " (for a local folder: file:///absolute/path)")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value) or "\\" in value or not urlsplit(value).netloc:
            raise ValueError(f"{value!r} names no bucket, or holds control characters or backslashes")
        return value
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value) or "\\" in value:
        raise ValueError(f"{value!r} holds control characters or backslashes, which no store accepts in a URI")
    parts = urlsplit(value)
    example = _EXAMPLES["abfs" if scheme == "abfss" else scheme]
    if scheme == "file":
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{value!r} names a host ({parts.netloc!r}): for a local folder write e.g. {example} "
                             "(three slashes, an absolute path)")
        if "\0" in path or not path.startswith("/") or not path.strip("/"):
            raise ValueError(f"{value!r} is not an absolute folder below '/'; write e.g. {example}")
        if ".." in path.split("/"):
            raise ValueError(f"{value!r} contains '..'; write the folder's absolute path, e.g. {example}")
        return value
    if parts.query or parts.fragment:
        raise ValueError(f"{value!r} has a '?' or '#' part, which storage URIs do not take; write e.g. {example}")
    if scheme in ("abfs", "abfss"):
        if not _ABFS_HOST.fullmatch(parts.netloc):
            raise ValueError(f"{value!r} does not name container@account.dfs.core.windows.net; write e.g. {example}")
        return value
    bucket_rule, rule_text = _BUCKETS[scheme]
    if not parts.netloc:
        raise ValueError(f"{value!r} names no {'container' if scheme == 'az' else 'bucket'}; write e.g. {example}")
    if not bucket_rule.fullmatch(parts.netloc):
        raise ValueError(f"{parts.netloc!r} in {value!r} is not a valid name: {rule_text}; write e.g. {example}")
    return value


def check_bucket(scheme: str, name: str | None) -> str | None:
    """A bucket name as the platform of ``scheme`` accepts it (None passes), else ValueError."""
    if name is not None and not _BUCKETS[scheme][0].fullmatch(name):
        raise ValueError(f"{name!r} is not a valid bucket name: {_BUCKETS[scheme][1]} (the name alone, without "
                         f"{scheme}://)")
    return name
