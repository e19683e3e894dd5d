"""Reading job specs as YAML text: the spec file (``cloudtrain.yaml``) and ``--set`` values.

Strict where plain ``yaml.safe_load`` is lenient, so hostile or mistaken input fails here, with the line to fix,
rather than later with a traceback or a silently different job: a key given twice is an error (YAML lets the last
one win), and nesting, alias expansion and file size are bounded (20,000 nested ``[`` overflow the parser's
recursion; a "billion laughs" document of aliases would take pydantic hours to walk). Imports nothing heavy (yaml only
once there is YAML to read), so ``cloudtrain doctor`` can read the project's spec without the cost of the spec models,
and a command with no spec file never loads yaml.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import SpecError
from cloudtrain.regular_files import read_bytes, special

if TYPE_CHECKING:
    import yaml

SPEC_FILENAME = "cloudtrain.yaml"
MAX_SPEC_BYTES = 1024 * 1024  # a spec is a few KB; a megabyte is a mistake (or an attack)
MAX_DEPTH = 32  # the deepest real spec is 4 levels (providers.aws.subnets[0])
MAX_NODES = 100_000  # values in the document with every alias expanded
_SKIPPED: set[str] = set()  # special files named like the project's spec, already said


@functools.cache
def _strict_loader() -> type[yaml.SafeLoader]:
    """SafeLoader that refuses a mapping key given twice (built on first use: yaml is imported only to read YAML)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key ([a, b]: x): the base class explains it
                    break
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (first at line {first.line + 1}); "
                        "YAML would keep only the last one", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def check_shape(data: Any, where: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Bound nesting depth and the number of values (aliases expanded) before anything walks the data."""
    count = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if depth > max_depth:
            raise SpecError(f"{where} nests values more than {max_depth} levels deep",
                            remedy="a spec needs a few levels at most: see `cloudtrain schema`")
        if count > max_nodes:
            raise SpecError(f"{where} holds more than {max_nodes} values (counting each use of a YAML alias)",
                            remedy="a spec holds a few dozen values: see `cloudtrain schema`")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for kv in value.items() for v in kv)
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def parse_yaml(text: str, where: str, text_if_not_yaml: bool = False) -> Any:
    """``text`` as YAML, strictly (see the module's docstring); a SpecError naming ``where`` and the line.
    ``text_if_not_yaml``: text that is not YAML syntax at all (``%s``, ``@home``) is returned as the string itself,
    as a ``--set`` value is meant; a key given twice or nesting too deep are still errors."""
    import yaml

    try:
        data = yaml.load(text, Loader=_strict_loader())  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        if text_if_not_yaml and isinstance(exc, (yaml.scanner.ScannerError, yaml.parser.ParserError,
                                                 yaml.reader.ReaderError)):  # not YAML syntax at all
            return text
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{where} is not valid YAML{at}: {problem}",
                        remedy="fix the YAML syntax (indentation, quotes, ':' after each key, no key twice)") from None
    except RecursionError:
        raise SpecError(f"{where} nests values too deeply to read",
                        remedy=f"a spec needs a few levels at most (cloudtrain reads up to {MAX_DEPTH})") from None
    check_shape(data, where)
    return data


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML spec into a plain dict, resolving source_dir relative to the file."""
    file = Path(path)
    try:
        kind = special(file)
        if kind:  # a FIFO named like a spec: opening it would wait for a writer
            raise SpecError(f"spec file {str(path)!r} is {kind}, not a regular file: not read", field="-f/--file",
                            remedy="pass a regular file (a FIFO or device is never read as a spec)")
        if not file.is_file():
            raise SpecError(f"spec file {str(path)!r} does not exist", field="-f/--file",
                            remedy="pass an existing file, or run `cloudtrain init` to write one")
        if file.stat().st_size > MAX_SPEC_BYTES:
            raise SpecError(f"{file} is {file.stat().st_size} bytes; a job spec is a few KB", field="-f/--file",
                            remedy=f"pass the job spec (at most {MAX_SPEC_BYTES // 1024} KB)")
        text = read_bytes(file, MAX_SPEC_BYTES + 1).decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{file} is not UTF-8 text", remedy="save the spec as UTF-8 YAML") from None
    except (OSError, ValueError) as exc:  # unreadable, a path with a NUL byte ...
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecError(f"cannot read spec file {str(file)!r}: {reason}", field="-f/--file",
                        remedy="pass a readable file (check its permissions)") from None
    data = parse_yaml(text, str(file))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{file} must hold a mapping of keys (name:, script:, nodes: ...), not a {type(data).__name__}",
                        remedy="start from `cloudtrain init`")
    base = file.resolve().parent
    source_dir = data.get("source_dir", ".")
    if isinstance(source_dir, str) and "\0" not in source_dir:  # a NUL is refused with the other fields
        data["source_dir"] = str((base / source_dir).resolve())
    return data


def project_spec() -> Path | None:
    """The project's spec file: ./cloudtrain.yaml in the current folder, if there is one. One that is not a regular
    file (a FIFO) is skipped, and said so once: reading it would wait for a writer."""
    path = Path(SPEC_FILENAME)
    kind = special(path)
    if kind and SPEC_FILENAME not in _SKIPPED:
        _SKIPPED.add(SPEC_FILENAME)
        print(f"note: ./{SPEC_FILENAME} is {kind}, not a regular file: skipped (not read)", file=sys.stderr)
    return path if path.is_file() and not kind else None


def project_options(provider: str) -> dict[str, Any]:
    """The ``providers.<provider>`` block of the project here (./cloudtrain.yaml), or {}: where commands that take
    no spec (``list``, ``doctor``) look for a region, project or workspace before the profile and the platform's
    tools. A spec that cannot be read is a SpecError, as in every command that reads it."""
    path = project_spec()
    if path is None:
        return {}
    raw = read_spec_file(path)
    providers = raw.get("providers")
    block = providers.get(provider) if isinstance(providers, dict) else None
    return dict(block) if isinstance(block, dict) else {}
