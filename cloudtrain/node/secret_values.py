"""Secret-looking values never reach a plan printout, a log line, a command line or a job record on disk.

A value is known to be secret in three ways:

- by **name**: the environment variable, mapping key or command-line flag that holds it says so (``HF_TOKEN``,
  ``MYPASSWORD``, ``GITHUB_PAT``, ``--api-key``, ``--password=...``);
- by **shape**: it is in a well-known credential format, wherever it appears (an AWS access key id, a Hugging Face,
  GitHub, OpenAI or Slack token, an Azure account key or SAS signature, the password in ``scheme://user:pw@host``);
- by **registration**: a value found either way is masked wherever it shows up again (a log line, a command string),
  the way CI systems mask registered secrets.

Every node masks its output with these rules (cloudtrain/node/log_masking.py, run by the node entry from the bundle
as soon as it is unpacked): standard library only, Python 3.8, as nothing is installed on a node at that point.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cloudtrain import contract

MASK = "****"
# Shorter registered values would mask ordinary text everywhere ("1", "on") and hide nothing worth hiding; nor are
# these words secrets, whatever variable holds them (HF_HUB_DISABLE_IMPLICIT_TOKEN=true).
MIN_MASKED_LENGTH = 4
NOT_SECRETS = frozenset({"true", "false", "none", "null", "yes", "no", "on", "off"})

# A name says "secret": a word anywhere (MYPASSWORD, SECRETKEY), or a short word standing alone between underscores
# (GITHUB_PAT, API_KEY, but not PATH, KEYBOARD_LAYOUT). TOKEN, but not TOKENIZERS_PARALLELISM or MAX_NEW_TOKENS;
# DB_PWD, but not the shell's PWD/OLDPWD (the working directory).
SECRET_NAME_PATTERN = (
    r"PASSWORD|PASSWD|PASSPHRASE|SECRET|CREDENTIAL|PRIVATE_?KEY|API_?KEY|ACCESS_?KEY|CONNECTION_?STRING"
    r"|TOKEN(?!IZ|S(?:_|$))"
    r"|(?:^|_)(?:KEY|PASS|PAT|AUTH|PRIVATE|SAS|SIGNATURE|COOKIE|DSN)(?:_|$)|_PWD(?:_|$)"
)
# ... unless the name says its value only points at one (DB_PASSWORD_FILE, SSH_AUTH_SOCK, KEY_DIR): masking a path or
# a word everywhere would hide nothing and garble every log line holding it. SESSION alone is no secret word either
# (NOX_CURRENT_SESSION=demo, XDG_SESSION_TYPE=wayland); SESSION_TOKEN, SESSION_KEY and SESSION_SECRET still are.
LOCATOR_NAME_PATTERN = r"_(?:FILE|PATH|DIR|SOCK|SOCKET|TYPE)$"

@dataclass(frozen=True)
class Rule:
    """A well-known credential format: ``pattern``'s first matching group is the secret (what is masked, the rest of
    the match stays readable). ``probe`` is a pattern starting with a literal that every match contains: text is
    searched for it first, which the regex engine does about as fast as a substring test, ~100x faster than the
    full pattern (logs and source trees are mostly free of all of them)."""

    name: str
    probe: str
    pattern: str


_QUERY_SECRET = (r"(?i:(?:[A-Za-z0-9.-]*[_.-])?(?:access_?token|token|api_?key|password|passwd|pwd|secret|signature"
                 r"|auth))=([^&\s\"'#]{8,})")
# What follows a URL's credentials: a host (a name, an IPv4 or [IPv6] address; none for a socket: postgres://u:p@/db),
# a port, then the path, the query, another host (mongodb://u:p@h1,h2), or the URL's end
_URL_HOST = r"(?=(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]*)(?::\d*)?(?:[/?#,;)\]>\s\"']|$))"
# Formats searched inside any text: plan strings, log lines, command lines, source files.
VALUE_RULES = (
    Rule("aws-access-key-id", r"A[KS]IA", r"\b((?:AKIA|ASIA)[A-Z2-7]{16})\b"),
    Rule("huggingface-token", r"hf_", r"\b(hf_[A-Za-z0-9]{30,})"),
    Rule("github-token", r"gh(?:[pousr]_|ithub_pat_)", r"\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
    Rule("openai-anthropic-key", r"sk-", r"\b(sk-(?:proj-|svcacct-|ant-)?[A-Za-z0-9_-]{32,})"),
    Rule("slack-token", r"xox", r"\b(xox[abprs]-[A-Za-z0-9-]{10,})"),
    Rule("azure-account-key", r"Key=", r"(?:AccountKey|SharedAccessKey)=([^;\s\"']+)"),
    Rule("azure-sas-signature", r"ig(?:=|nature=)",
         r"SharedAccessSignature=([^;\s\"']+)|[?&]sig=([A-Za-z0-9%+/=]{20,})"),
    # only the password is masked, so postgres://user:****@host stays readable; whatever it holds (`/`, `+` of an
    # AWS-style secret key, `@`, `:` or %-escapes): it runs to the first `@` followed by a host (a name or [v6], a
    # port, then the path or the URL's end), and it is not a port (https://host:8443/a@b is no password)
    Rule("url-password", r"://", r"://[^/\s:\"']*?:(?!\d{1,5}(?:[/?#]|$))([^\s\"']+?)@" + _URL_HOST),
    # a token standing for the whole user part (https://<token>@github.com/...): long, with a digit, unlike a name
    Rule("url-token-user", r"://", r"://((?=[^/\s:@\"']*\d)[^/\s:@\"']{20,})@"),
    # a credential in a query string: ?token=..., &api_key=..., X-Amz-Signature=... (presigned URLs); not a page
    # token or a sort key, whose values would then be masked in every log line. Two rules: a probe that starts with
    # a literal is searched ~10x faster than one starting with [?&]
    Rule("url-query-secret", r"\?[A-Za-z0-9_.-]*=", r"\?" + _QUERY_SECRET),
    Rule("url-query-secret-next", r"&[A-Za-z0-9_.-]*=", r"&" + _QUERY_SECRET),
)
_SECRET_NAME = re.compile(SECRET_NAME_PATTERN, re.IGNORECASE)
_LOCATOR_NAME = re.compile(LOCATOR_NAME_PATTERN, re.IGNORECASE)
_COMPILED = tuple((re.compile(rule.probe), re.compile(rule.pattern)) for rule in VALUE_RULES)

# Secret command-line values travel to the node in these variables; the command line holds a placeholder that the
# bundle's lib/sitecustomize.py turns back into the value inside each worker (sys.argv), so `ps` never shows it.
ARG_ENV_PREFIX = contract.SECRET_ARG_PREFIX
PLACEHOLDER = re.compile(r"@@(" + ARG_ENV_PREFIX + r"\d+)@@")


def secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name)) and not _LOCATOR_NAME.search(name)


def _matches(text: str) -> Iterable[re.Match[str]]:
    for probe, regex in _COMPILED:
        if probe.search(text):
            yield from regex.finditer(text)


def _secret_group(match: re.Match[str]) -> int:
    return next(i for i in range(1, (match.re.groups or 0) + 1) if match.group(i) is not None)


def secret_shape(value: str) -> bool:
    """True if ``value`` holds a credential in a well-known format (``VALUE_RULES``)."""
    return any(True for _ in _matches(value))


def looks_secret(name: str, value: object = "") -> bool:
    return secret_name(name) or (isinstance(value, str) and secret_shape(value))


def mask_text(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every registered value (``known``, longest first) and every well-known format masked."""
    for value in known:
        if value in text:
            text = text.replace(value, MASK)
    for probe, regex in _COMPILED:
        if probe.search(text):
            text = regex.sub(lambda m: m.group(0)[:m.start(g := _secret_group(m)) - m.start()] + MASK
                             + m.group(0)[m.end(g) - m.start():], text)
    return text


def registered(value: str) -> list[str]:
    """What a value held under a secret name registers for masking elsewhere: the value, each line of a multi-line
    one (a PEM key printed line by line) and the password of a URL; long enough to be worth masking."""
    return _worth_masking({value, *(line.strip() for line in value.splitlines()), *shaped(value)})


def shaped(value: str) -> list[str]:
    """What a value under an ordinary name registers: only its parts in a known format (a token, a URL's
    password), so ``DATABASE_URL`` still reads ``postgres://u:****@host``."""
    return _worth_masking(m.group(_secret_group(m)) for m in _matches(value))


def _worth_masking(parts: Iterable[str]) -> list[str]:
    return _longest_first(p for p in parts if len(p) >= MIN_MASKED_LENGTH and p.lower() not in NOT_SECRETS)


def env_secrets(env: Mapping[str, str]) -> list[str]:
    """The registered values of an environment: those of variables with secret names, and every value's parts in a
    known format."""
    return _longest_first(part for name, value in env.items()
                          for part in (registered(value) if secret_name(name) else shaped(value)))


def _longest_first(values: Iterable[str]) -> list[str]:
    return sorted(set(values), key=lambda v: (-len(v), v))


def _flag_is_secret(flag: str) -> bool:
    """``--hf-token``, ``--db_password``, ``-api-key``: a flag whose name says it takes a secret."""
    name = flag.lstrip("-").replace("-", "_")
    return flag.startswith("-") and bool(name) and secret_name(name)


def secret_arg_parts(args: Sequence[str], known: Sequence[str] = ()) -> dict[int, tuple[int, bool]]:
    """Which arguments carry a secret: ``{index: (offset, by_flag)}`` where ``args[index][offset:]`` holds it. By
    flag: the value after a secret flag (``--token X``, ``--password=X``), all of it secret. Otherwise: an argument
    holding a registered value (``known``) or a known format (an ``hf_`` token, a URL with a password)."""
    found: dict[int, tuple[int, bool]] = {}
    value_of_flag = False
    for index, arg in enumerate(args):
        if value_of_flag and not arg.startswith("--"):
            found[index] = (0, True)
            value_of_flag = False
            continue
        value_of_flag = False
        flag, eq, _ = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        if flag and _flag_is_secret(flag):
            if eq:
                found[index] = (len(flag) + 1, True)
            else:
                value_of_flag = True
        elif secret_shape(arg) or any(value in arg for value in known):
            found[index] = (len(flag) + 1 if eq else 0, False)
    # a placeholder (split_args) stands for a secret on a command line; it is not one
    return {index: part for index, part in found.items() if not PLACEHOLDER.fullmatch(args[index][part[0]:])}


def mask_args(args: Sequence[str], known: Sequence[str] = ()) -> list[str]:
    """Arguments as shown to people: ``--token ****``, ``--password=****``, ``postgres://u:****@host``."""
    parts = secret_arg_parts(args, known)
    shown = []
    for index, arg in enumerate(args):
        offset, by_flag = parts.get(index, (0, False))
        shown.append(arg[:offset] + MASK if by_flag else mask_text(arg, known))
    return shown


def split_args(args: Sequence[str], env: Mapping[str, str] = {}) -> tuple[list[str], dict[str, str]]:
    """Arguments for a command line with each secret replaced by a placeholder ``@@CLOUDTRAIN_SECRET_ARG_<n>@@``,
    and the variables that carry the values to the node. Each worker gets the real values back in ``sys.argv``
    (the bundle's lib/sitecustomize.py); the bootstrap's and torchrun's command lines (``ps``) hold placeholders."""
    parts = secret_arg_parts(args, env_secrets(env))
    shown, moved = list(args), dict[str, str]()
    for index, (offset, _) in sorted(parts.items()):
        name = f"{ARG_ENV_PREFIX}{len(moved)}"
        moved[name] = args[index][offset:]
        shown[index] = f"{args[index][:offset]}@@{name}@@"
    return shown, moved


def split_args_note(args: Sequence[str], env: Mapping[str, str] = {}) -> str | None:
    """What a plan says when some of the script's arguments are secret, so the placeholders read as meant."""
    moved = split_args(args, env)[1]
    if not moved:
        return None
    return (f"{len(moved)} secret argument(s) of the script travel in the node environment ({ARG_ENV_PREFIX}<n>, "
            "masked here): command lines show @@...@@ placeholders, and each worker gets the values in sys.argv")


def restore_args(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The inverse of :func:`split_args` inside a worker (a placeholder without its variable is left as is)."""
    return [PLACEHOLDER.sub(lambda m: env.get(m.group(1), m.group(0)), arg) for arg in args]


def _name_value(data: dict[Any, Any]) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """AWS tags/env entries ({"Key", "Value"}), Vertex env ({"name", "value"}) ..."""
    if len(data) != 2:
        return None
    for name_key, value_key in (("Key", "Value"), ("Name", "Value"), ("key", "value"), ("name", "value")):
        name, value = data.get(name_key), data.get(value_key)
        if isinstance(name, str) and isinstance(value, str):
            return (name_key, name), (value_key, value)
    return None


def known_secrets(data: Any) -> list[str]:
    """Every value ``data`` holds that is secret by name or shape: mapping values under secret names, request
    entries ({"Name": n, "Value": v}), and argument lists' secret values."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            pair = _name_value(node)
            items = [(pair[0][1], pair[1][1])] if pair else list(node.items())
            for key, value in items:
                if isinstance(key, str) and isinstance(value, str) and secret_name(key):
                    found.update(registered(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            if node and all(isinstance(item, str) for item in node):
                found.update(part for index, (offset, by_flag) in secret_arg_parts(node).items()
                             for part in (registered if by_flag else shaped)(node[index][offset:]))
            for item in node:
                walk(item)
        elif isinstance(node, str):
            found.update(shaped(node))

    walk(data)
    return _longest_first(found)


def redact(data: Any, known: Iterable[str] = ()) -> Any:
    """A deep copy of ``data`` as people may see it: values under secret names replaced by ****, secret command-line
    values masked, and every secret value found anywhere in ``data`` (or given in ``known``) masked wherever it
    appears again, inside longer strings too (an Azure ML command line, a URL)."""
    values = _longest_first([*known_secrets(data), *(part for value in known for part in registered(value))])

    def copy(node: Any) -> Any:
        if isinstance(node, dict):
            pair = _name_value(node)
            if pair is not None:  # a request's {"Key"|"Name": n, "Value": v} entry: judge v by n, keep n readable
                (name_key, name), (value_key, value) = pair
                return {name_key: name, value_key: MASK if secret_name(name) else mask_text(value, values)}
            return {k: MASK if isinstance(k, str) and isinstance(v, str) and secret_name(k) else copy(v)
                    for k, v in node.items()}
        if isinstance(node, list):
            if node and all(isinstance(item, str) for item in node):
                return mask_args(node, values)
            return [copy(item) for item in node]
        if isinstance(node, str):
            return mask_text(node, values)
        return node

    return copy(data)
