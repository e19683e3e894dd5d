"""Credentials inside the files of a source bundle, found while the files are read for the bundle (no second read).

The rules are the well-known formats of ``cloudtrain.secrets.VALUE_RULES`` that are unambiguous in source files,
plus formats that only files hold (a private-key block, a GCP service-account key, an AWS secret key assignment).
A block of a file is searched by a rule's regex only where one of a few literal probes (``PROBES``) occurs, so clean
text costs a handful of fast passes (benchmarks/bundle.py measures bundling with the scan against tar).

Not scanned: binary files (a NUL byte in the first 8 KiB, as git decides), the part of a text file past 32 MiB (data,
not code), and files allowed by name (``package.allow_secrets`` / ``--allow-secret``). A line holding
``cloudtrain: allow-secret`` (or detect-secrets' ``pragma: allowlist secret``) is not reported, and neither are the
published example credentials (AWS's ``...EXAMPLE`` keys, Azurite's well-known development key).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cloudtrain.secrets import VALUE_RULES, Rule

# URL passwords (postgres://user:{password}@host in code and docs), bare SAS signatures and Slack tokens are left to
# masking: in source files they are mostly templates and examples, or rare.
_SHARED = ("aws-access-key-id", "huggingface-token", "github-token", "openai-anthropic-key")
FILE_RULES = (
    Rule("private-key", "PRIVATE KEY",
         r"(-----BEGIN (?:RSA |DSA |EC |OPENSSH |ENCRYPTED |PGP )?PRIVATE KEY(?: BLOCK)?-----)"
         r"(?:\\n|\s)+(?:Proc-Type:|[A-Za-z0-9+/=]{20,})"),
    Rule("gcp-service-account-key", "service_account", r"(\"type\"\s*:\s*\"service_account\")"),
    Rule("aws-secret-access-key", "_access_key|_ACCESS_KEY|AccessKey",
         r"(?:aws_secret_access_key|AWS_SECRET_ACCESS_KEY|SecretAccessKey)[\"']?\s*[=:]\s*[\"']?"
         r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"),
    Rule("azure-connection-string", "Key=",
         r"(?:AccountKey|SharedAccessKey)=([A-Za-z0-9+/]{40,}={0,2})"),
    *(rule for rule in VALUE_RULES if rule.name in _SHARED),
)
# What a block of a file is searched for first, and the rules to run where found: fewer passes than one per rule's
# probe (a probe shared by rules whose formats begin alike; two plain probes where one would need alternatives).
PROBES = (
    (r"A(?:[KS]IA|cc(?:ountKey=|essKey))", ("aws-access-key-id", "azure-connection-string", "aws-secret-access-key")),
    (r"hf_", ("huggingface-token",)),
    (r"gh(?:[pousr]_|ithub_pat_)", ("github-token",)),
    (r"sk-", ("openai-anthropic-key",)),
    (r"PRIVATE KEY", ("private-key",)),
    (r"service_account", ("gcp-service-account-key",)),
    (r"_access_key", ("aws-secret-access-key",)),
    (r"_ACCESS_KEY", ("aws-secret-access-key",)),
)
ALLOW_MARKERS = (b"cloudtrain: allow-secret", b"pragma: allowlist secret")
# Published on purpose: AWS's documentation keys (AKIAIOSFODNN7EXAMPLE, wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY)
# and the Azure Storage emulator's fixed development account key.
_PUBLIC_EXAMPLES = re.compile(
    rb"EXAMPLE|^Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==$")
MAX_SCANNED_BYTES = 32 * 1024 * 1024
_BINARY_PROBE = 8192
_OVERLAP = 1024  # a match cut by a read boundary is found in the next block, which starts this far back

_RULES = {rule.name: re.compile(rule.pattern.encode()) for rule in FILE_RULES}
_PROBES = tuple((re.compile(probe.encode()), names) for probe, names in PROBES)


@dataclass(frozen=True)
class Finding:
    path: str  # relative to the source folder
    line: int
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.rule})"


class ScanningReader:
    """Wraps a file being read into the bundle; remembers where a credential might be, to confirm later."""

    def __init__(self, rel: str, file: BinaryIO, path: Path) -> None:
        self.rel, self.path, self._file = rel, path, file
        self._offset = 0  # bytes of the file read so far
        self._tail = b""
        self._done = False  # binary, or past MAX_SCANNED_BYTES
        self.candidates: dict[int, tuple[str, bytes]] = {}  # file offset -> (rule, what it matched)

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        if data and not self._done:
            self._scan(data)
        return data

    def _scan(self, data: bytes) -> None:
        if self._offset == 0 and b"\0" in data[:_BINARY_PROBE]:
            self._done = True
            return
        block, base = self._tail + data, self._offset - len(self._tail)
        for probe, names in _PROBES:
            if probe.search(block) is None:
                continue
            for name in names:
                for match in _RULES[name].finditer(block):
                    secret = next(g for g in match.groups() if g is not None)
                    self.candidates.setdefault(base + match.start(), (name, secret))
        self._offset += len(data)
        self._tail = block[-_OVERLAP:]
        self._done = self._offset >= MAX_SCANNED_BYTES

    def findings(self) -> list[Finding]:
        """The candidates confirmed: not on an allowed line, not a published example. Reads the file again, which
        only happens for a file that holds something credential-like."""
        if not self.candidates:
            return []
        data = self.path.read_bytes()[:MAX_SCANNED_BYTES + _OVERLAP]
        found: dict[int, Finding] = {}
        for offset, (rule, secret) in sorted(self.candidates.items()):
            start = data.rfind(b"\n", 0, offset) + 1
            end = data.find(b"\n", offset)
            line = data[start:end if end >= 0 else len(data)]
            if any(marker in line for marker in ALLOW_MARKERS) or _PUBLIC_EXAMPLES.search(secret):
                continue
            number = data.count(b"\n", 0, offset) + 1
            found.setdefault(number, Finding(self.rel, number, rule))
        return list(found.values())


def describe(findings: Iterable[Finding], limit: int = 10) -> str:
    shown = list(findings)
    return ", ".join(str(f) for f in shown[:limit]) + (f" and {len(shown) - limit} more" if len(shown) > limit else "")
