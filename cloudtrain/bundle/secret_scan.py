"""Credentials inside the files of a source bundle, found while the files are read for the bundle (no second read).

The rules are the well-known formats of ``cloudtrain.node.secret_values.VALUE_RULES`` that are unambiguous in source
files, plus formats that only files hold (a private-key block, a GCP service-account key, an AWS secret key assignment).
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

from cloudtrain.node.secret_values import VALUE_RULES, Rule
from cloudtrain.regular_files import read_bytes

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
    # The credential files ML people keep, under any name: gcloud's user credentials (application_default_credentials
    # .json, legacy_credentials/*/adc.json), OAuth caches (az's accessTokens.json, MSAL's token cache, AWS SSO's),
    # kaggle.json, netrc files (W&B's login), .pypirc and other INI files with a username and password, .npmrc,
    # Docker's config.json, kubeconfig keys, W&B keys, secret-named variables given a long literal, OAuth client
    # secrets, git-credentials stores, and token formats of PyPI, npm, GitLab, Databricks and Google API keys. A value
    # that is a placeholder or a variable ($X, ${X}, <X>, %X%) is not a credential.
    Rule("gcloud-user-credentials", "authorized_user", r"(\"type\"\s*:\s*\"(?:external_account_)?authorized_user\")"),
    Rule("oauth-refresh-token", "refresh_?[tT]oken|RefreshToken",
         r"\"refresh_?[tT]oken\"\s*:\s*\"([^\"\s]{20,})\"|\"credential_type\"\s*:\s*\"(RefreshToken)\""
         r"|gs_oauth2_refresh_token\s*=\s*(\S{20,})"),
    Rule("kaggle-api-key", "\"username\"",
         r"\"username\"\s*:\s*\"[^\"]*\"\s*,\s*\"key\"\s*:\s*\"([0-9a-f]{32})\""
         r"|\"key\"\s*:\s*\"([0-9a-f]{32})\"\s*,\s*\"username\""),
    Rule("netrc-password", "password\\s",
         r"(?:machine\s+(?:localhost|(?:[\w-]+\.)+[\w-]+)|default)(?:\s+(?:login|account)\s+\S+)*"
         r"\s+password\s+([^\s<$%{]\S*)"),
    Rule("ini-password", "password\\s*[=:]",
         r"(?ms)^\[[^\]\n]+\][ \t]*\n(?:(?!^\[).)*?^[ \t]*username[ \t]*[=:][^\n]*\n(?:(?!^\[).)*?"
         r"^[ \t]*password[ \t]*[=:][ \t]*([^\s<$%{\"'][^\s]*)"),
    Rule("npm-token", "_auth|_password",
         r"_(?<![^\n:]_)(?:authToken|auth|password)[ \t]*=[ \t]*([^\s$\"'{<][^\s\"']*)"),
    Rule("docker-auth", "\"auth\"", r"\"auth\"\s*:\s*\"([A-Za-z0-9+/]{12,}={0,2})\""),
    Rule("kubeconfig-key", "client-key-data", r"client-key-data:\s*([A-Za-z0-9+/]{40,}={0,2})"),
    Rule("wandb-api-key", "wandb\\.login", r"wandb\.login\([^)]*?key\s*=\s*[\"']([A-Za-z0-9_-]{40,})"),
    # WANDB_API_KEY = "...", OPENAI_API_KEY=... in a renamed .env, "HF_TOKEN": "..." in a JSON: a secret name given
    # a literal of 20+ token characters (quoted, or alone up to the end of an env-file line)
    Rule("secret-assignment", "API_?KEY|TOKEN|SECRET|PASSWORD|ACCESS_KEY",
         r"(?m)(?:API_?KEY|TOKEN|SECRET|PASSWORD|ACCESS_KEY)[\"'\]]*[ \t]*[=:][ \t]*"
         r"(?:[\"']([A-Za-z0-9_+/=.-]{20,})[\"']|([A-Za-z0-9_+/=-]{20,})[ \t]*$)"),
    # a client secret in an OAuth client file (client_secret_*.json) or an Azure service principal's JSON
    Rule("oauth-client-secret", "client_?[sS]ecret", r"\"client_?[sS]ecret\"\s*:\s*\"([^\"\s<$%{]{16,})\""),
    # a git-credentials store under any name: each line a URL with its password
    Rule("git-credentials", "://", r"(?m)^[ \t]*https?://[^/\s:@\"']+:([^/\s@\"'<$%{]{6,})@[^\s/\"']+/?[ \t]*$"),
    Rule("token-formats", "pypi-|glpat-|dapi|npm_|AIza",
         r"((?:pypi(?<![\w+/-]pypi)-AgE[\w-]{50}|glpat(?<![\w+/-]glpat)-[\w-]{20}|dapi(?<![\w+/-]dapi)[0-9a-f]{32}"
         r"|npm_(?<![\w+/-]npm_)[A-Za-z0-9]{36}|AIza(?<![\w+/-]AIza)[\w-]{35})"
         r"[\w-]*)"),
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
    (r"_ACCESS_KEY", ("aws-secret-access-key", "secret-assignment")),
    # each probe starts with a literal (searched ~10x faster than a pattern that starts with a choice), and is what
    # its rules need, so that they run only on a block that may hold a match
    (r"authorized_user", ("gcloud-user-credentials",)),
    (r"efresh_?[tT]oken", ("oauth-refresh-token",)),
    (r"username", ("kaggle-api-key", "ini-password")),
    (r"machine", ("netrc-password",)),
    (r"_auth", ("npm-token",)),
    (r"_password", ("npm-token",)),
    (r"\"auth\"", ("docker-auth",)),
    (r"client-key-data", ("kubeconfig-key",)),
    (r"wandb\.login", ("wandb-api-key",)),
    *((probe, ("secret-assignment",)) for probe in (r"API_?KEY", "TOKEN", "SECRET", "PASSWORD")),
    (r"client_?[sS]ecret", ("oauth-client-secret",)),
    (r"://[^/\s:@\"']+:[^/\s@\"']+@", ("git-credentials",)),
    *((literal, ("token-formats",)) for literal in ("pypi-", "glpat-", "dapi", "npm_", "AIza")),
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
        found = dict.fromkeys(name for probe, names in _PROBES if probe.search(block) for name in names)
        for name in found:  # each rule once, however many of its probes occur
            for match in _RULES[name].finditer(block):
                group = next(i for i, g in enumerate(match.groups(), 1) if g is not None)
                # at the secret itself: the line named is the one that holds it (a netrc's password line)
                self.candidates.setdefault(base + match.start(group), (name, match.group(group)))
        self._offset += len(data)
        self._tail = block[-_OVERLAP:]
        self._done = self._offset >= MAX_SCANNED_BYTES

    def findings(self) -> list[Finding]:
        """The candidates confirmed: not on an allowed line, not a published example. Reads the file again, which
        only happens for a file that holds something credential-like."""
        if not self.candidates:
            return []
        data = read_bytes(self.path, MAX_SCANNED_BYTES + _OVERLAP)
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
