"""Command-line helpers for ``scripts/``: a bad flag is one line on stderr, not a traceback.

    app.run(main, flags_parser=cli.parse_flags)

A malformed ``--config.`` override (a field the config does not have, a value of the wrong
type, a missing value) or an unknown preset becomes ``error: <flag>=<value>: <what is wrong
and what is allowed>`` and exit status 2, before anything is written.

``--import MODULE`` (repeatable, every command) imports a user's module before the config is
resolved (`import_modules`), so the encodings it registers are known by name to the config
and its overrides (docs/experiments.md).

`one_line_failures` does the same for what goes wrong once a run has started: a refused
config or a busy workdir (status 2), a failed write of the run's state (status 1), SIGINT or
SIGTERM (the `interrupt.describe` line, status 130 or 143).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import operator
import os
import re
import shlex
import signal
import sys
import typing
from pathlib import Path
from typing import Any

from absl import app, flags
from absl import logging as absl_logging

from flaxformer_lite.base import faults, interrupt
from flaxformer_lite.base.checks import ConfigError, one_line, shown
from flaxformer_lite.base.io import StateWriteError, write_error
from flaxformer_lite.study.sweeps import SWEEP_FIELD_DOCS
from flaxformer_lite.train import provenance
from flaxformer_lite.train.run_config import field_docs

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1

IMPORT_FLAG = "import"
flags.DEFINE_multi_string(
    IMPORT_FLAG,
    [],
    "MODULE or FILE.py to import before the config is read (repeatable), e.g. a module that "
    "registers a positional encoding with flaxformer_lite.register; a module name is looked up "
    "on sys.path and in the current directory",
)

LIST_FIELDS_FLAG = "list-fields"
flags.DEFINE_bool(
    LIST_FIELDS_FLAG,
    False,
    "print every --config.* field of the config (with the overrides given) as "
    "'config.section.field (type) = value  # meaning', and exit",
)
VERSION_FLAG = "version"
flags.DEFINE_bool(VERSION_FLAG, False, "print the package's version and exit")


def fail(message: str) -> typing.NoReturn:
    """Print ``error: message`` (one line, cut to 2,000 characters) to stderr and exit with
    status 2."""
    print(f"error: {one_line(str(message), 2000)}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def check_utf8_arguments(argv: list[str], *, raw: tuple[str, ...] = ()) -> None:
    """`fail` on a command-line argument holding bytes that are not UTF-8 (Python carries
    them as lone surrogates): a path or name that every row, config and REPORT.md must hold
    could never be written. ``raw``: flags whose value is bytes on purpose (``--prompt``)."""
    skip = False
    for arg in argv[1:]:
        if skip or any(arg.startswith(f"--{name}=") for name in raw):
            skip = False
            continue
        skip = arg in {f"--{name}" for name in raw}  # its value is the next argument
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            name, eq, _ = arg.partition("=")
            value = arg.encode("utf-8", "surrogateescape")
            if eq and name.startswith("--"):
                value = value.split(b"=", 1)[1]
                fail(f"{name}={shown(value)}: holds bytes that are not UTF-8; use UTF-8 names")
            fail(f"argument {shown(value)}: holds bytes that are not UTF-8; use UTF-8 names")


_running_a_command = False  # set by `run_command`: this process is a command line (it exits)


@contextlib.contextmanager
def one_line_failures() -> typing.Iterator[None]:
    """Run the body with SIGINT/SIGTERM handled (`interrupt.handling_signals`); end the
    process with one line on stderr and no traceback when it raises:

    - `ConfigError` (a bad value, a workdir another process holds): ``error: ...``, status 2;
    - an OS error (`io.StateWriteError` when writing state: disk full, quota, read-only):
      ``error: cannot write FILE: [Errno N] reason; free space and rerun ...``, status 1;
    - SIGINT / SIGTERM: ``interrupted ... ; rerun the same command to resume``, status 130/143;
      in a command (`run_command`) the process ends at most ``FLAXFORMER_LITE_EXIT_GRACE``
      seconds (default 60) after the signal even if its cleanup hangs
      (`interrupt.handling_signals`'s ``exit_after``); called from Python, e.g. a notebook,
      the watchdog is not armed.
    """
    grace = None
    if _running_a_command:  # a process that exits on an interruption anyway
        try:
            grace = interrupt.exit_grace()
            faults.check()  # a bad test-hook value: one line before any work
        except ValueError as e:
            fail(str(e))
    try:
        with interrupt.handling_signals(exit_after=grace):
            yield
    except ConfigError as e:
        fail(str(e))
    except KeyboardInterrupt as e:  # `interrupt.Interrupted`, or a SIGINT before the handler
        signum = getattr(e, "signum", signal.SIGINT)
        interrupt.report(signum)
        sys.exit(128 + signum)
    except OSError as e:
        error = e if isinstance(e, StateWriteError) else write_error(e, e.filename or "a file")
        print(f"error: {' '.join(str(error).split())}; {error.hint}", file=sys.stderr)
        sys.exit(EXIT_FAILED)


def run_command(
    main: typing.Callable[[list[str]], None],
    *,
    doc: str | None,
    module: str,
    argv: list[str] | None = None,
    prog: str | None = None,
    flags_parser: typing.Callable[[list[str]], list[str]] | None = None,
    raw_flags: tuple[str, ...] = (),
) -> None:
    """Run a command's ``main`` with absl (`absl.app.run`), as `commands` and the thin
    ``scripts/`` do: ``argv[0]`` becomes ``prog`` (what ``--help`` and the recorded command
    show, e.g. ``flaxformer-lite study``), ``doc`` is the usage text, and the flags that
    ``module`` defines are the ones ``--help`` lists (absl lists the main script's own).
    An argument holding bytes that are not UTF-8 is refused in one line
    (`check_utf8_arguments`), except the values of ``raw_flags``."""
    argv = list(sys.argv if argv is None else argv)
    argv[0] = prog or argv[0]
    check_utf8_arguments(argv, raw=raw_flags)
    sys.argv[:] = argv  # absl's --help names sys.argv[0]'s flags and usage
    for flag in flags.FLAGS.get_key_flags_for_module(module):
        flags.FLAGS.register_key_flag_for_module(argv[0], flag)
    for name in (IMPORT_FLAG, LIST_FIELDS_FLAG, VERSION_FLAG):
        flags.FLAGS.register_key_flag_for_module(argv[0], flags.FLAGS[name])
    main_module = sys.modules.get("__main__")
    if main_module is not None and doc:
        main_module.__doc__ = doc
    help_asked = any(a in HELP_FLAGS for a in argv[1:])
    verbosity = any(a.startswith(("--verbosity", "--v=", "-v")) for a in argv[1:])

    def quiet_main(args: list[str]) -> None:
        if not verbosity:  # absl logs at INFO (JAX's "Unable to initialize backend 'tpu'")
            absl_logging.set_verbosity(absl_logging.WARNING)
        main(args)

    global _running_a_command
    # absl's app.run ends the process when main returns; an interactive interpreter (IPython,
    # a notebook, `python -i`) survives its SystemExit, so the interrupt watchdog stays off there
    _running_a_command = not _interactive()
    try:
        app.run(quiet_main, argv=argv, flags_parser=flags_parser or parse_flags)
    except SystemExit as e:
        if help_asked and e.code == 1:  # absl ends --help with status 1; asked for, it is 0
            raise SystemExit(0) from None
        raise


def _interactive() -> bool:
    """Whether this is an interactive interpreter: ``python -i``, the REPL, or a running IPython
    shell or kernel (merely importing IPython, as ``tqdm.auto`` does, is not one)."""
    if sys.flags.interactive or hasattr(sys, "ps1"):
        return True
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    return get_ipython is not None and get_ipython() is not None


HELP_FLAGS = ("-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml")


def command_line(argv: list[str]) -> str:
    """The command as typed, for the rows' provenance: ``argv[0]`` (a program name that may
    hold spaces, e.g. ``flaxformer-lite study``) and the quoted arguments."""
    return " ".join([argv[0], shlex.join(argv[1:])]).strip()


# ------------------------------------------------------------------------ packaged configs

CONFIG_PACKAGE = "flaxformer_lite.configs"


def packaged_configs() -> dict[str, Path]:
    """The study configs shipped inside the package (``flaxformer_lite.configs``, whose source
    is the top-level ``configs/`` folder of a clone): name -> file."""
    try:
        spec = importlib.util.find_spec(CONFIG_PACKAGE)
    except ImportError:
        spec = None
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not folders:  # a clone on sys.path without an install: its configs/ folder
        folders = [Path(__file__).resolve().parents[2] / "configs"]
    found: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(Path(folder).glob("*.py")):
            if not path.name.startswith("_"):
                found.setdefault(path.stem, path)
    return found


def config_presets(path: Path | str) -> list[str]:
    """The ``PRESETS`` of the config file ``path`` ([] if it has none or cannot be loaded)."""
    try:
        module_spec = importlib.util.spec_from_file_location(f"_presets_{Path(path).stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    except Exception:
        return []
    return list(getattr(module, "PRESETS", None) or ())


def config_help() -> str:
    """The help of ``--config``: both spellings and every packaged config with its presets."""
    listed = "; ".join(
        f"{name}: {', '.join(config_presets(path)) or '(no presets)'}"
        for name, path in packaged_configs().items()
    )
    return (
        "NAME:PRESET (a packaged study config) or FILE.py:PRESET (a config file), e.g. "
        f"extrapolation_lm:quick or configs/extrapolation_lm.py:quick. Packaged: {listed}"
    )


def resolve_config(argv: list[str]) -> list[str]:
    """``argv`` with ``--config=NAME[:PRESET]`` (a packaged config's name, no ``.py``) replaced
    by its file; `fail` naming the packaged configs when NAME is none of them."""
    out = list(argv)
    for at, spec in _flag_values(out, "config"):
        name, colon, preset = spec.partition(":")
        if not name or name.endswith(".py") or "/" in name or os.sep in name:
            return out
        configs = packaged_configs()
        if name not in configs:
            if Path(name).exists():
                return out
            fail(
                f"--config={spec}: no packaged study config {name!r}; allowed: "
                f"{sorted(configs)} (or a config file FILE.py:PRESET)"
            )
        resolved = f"{configs[name]}{colon}{preset}"
        out[at] = resolved if out[at] == spec else f"--config={resolved}"
        return out
    return out


def parse_flags(argv: list[str]) -> list[str]:
    """A ``flags_parser`` for ``absl.app.run`` that reports bad flags as one line.

    ``--import`` modules are imported first (`import_modules`). ``--config=NAME:PRESET``
    names a packaged config (`resolve_config`). A config whose file defines ``PRESETS`` must
    name one (``FILE.py:PRESET``), so that no preset runs without being asked for.

    ``--version`` prints `version_line` and exits; ``--list-fields`` prints `config_fields`
    of the config (its overrides applied) and exits, without the flags a run requires."""
    if f"--{VERSION_FLAG}" in argv[1:]:
        print(version_line())
        sys.exit(0)
    listing = f"--{LIST_FIELDS_FLAG}" in argv[1:]
    if listing:
        if "config" not in flags.FLAGS or _flag_value(argv, "config") is None:
            fail(f"--{LIST_FIELDS_FLAG}: name a config, e.g. --config=extrapolation_lm:quick")
        if "workdir" in flags.FLAGS and _flag_value(argv, "workdir") is None:
            argv = [*argv, "--workdir="]  # required to run, not to list; never used
    import_modules(argv)
    typed = _flag_value(argv, "config")
    argv = resolve_config(argv)
    _check_preset(argv, typed)
    config_file = (_flag_value(argv, "config") or "").partition(":")[0]
    if config_file and os.path.isfile(config_file):
        provenance.note_config_file(config_file)
    try:
        args = flags.FLAGS(argv)
        if "config" in flags.FLAGS:
            # config_flags defers some load errors (a missing file) to the first use
            _ = flags.FLAGS["config"].value.keys
    except Exception as e:  # flags.Error, or KeyError/AttributeError from a config override
        message, resolved = explain_flag_error(argv, e), _flag_value(argv, "config")
        if typed and resolved and typed != resolved:  # name the config as it was given
            message = message.replace(resolved, typed)
        fail(message)
    if listing:
        print("\n".join(config_fields(flags.FLAGS["config"].value)))
        sys.exit(0)
    return args


def version_line() -> str:
    """``flaxformer-lite 0.1.0 (python 3.12.3, jax 0.6.0, flax 0.11.0)``: the installed
    versions (`provenance.package_versions`), as every results row records them."""
    versions = provenance.package_versions()
    python = ".".join(map(str, sys.version_info[:3]))
    return (
        f"flaxformer-lite {versions['flaxformer-lite']} "
        f"(python {python}, jax {versions['jax']}, flax {versions['flax']})"
    )


def config_fields(config: Any) -> list[str]:
    """One line per field of ``config`` (a ConfigDict), nested fields by their full path::

        config.model.positional_options.rope.base (float) = 10000.0  # frequency base; ...

    The type is the one its dataclass annotates (else the value's), the value the current
    one (overrides applied, cut to 80 characters), the meaning the comment beside the field
    in its dataclass (`run_config.field_docs`; ``config.sweep``: `sweeps.SWEEP_FIELD_DOCS`).
    Every line is a field a ``--config.`` flag sets."""
    docs = field_docs()
    docs.update({f"sweep.{k}": ("tuple", v) for k, v in SWEEP_FIELD_DOCS.items()})
    lines: list[str] = []

    def walk(node: Any, path: str) -> None:
        for key in node.keys():
            value, name = node[key], f"{path}.{key}" if path else key
            if hasattr(value, "keys") and not isinstance(value, dict):  # a ConfigDict section
                walk(value, name)
                continue
            kind, meaning = docs.get(name, (type(value).__name__, ""))
            line = f"config.{name} ({kind}) = {shown(value, 80)}"
            lines.append(f"{line}  # {meaning}" if meaning else line)

    walk(config, "")
    return lines


def import_modules(argv: list[str]) -> list[str]:
    """Import every ``--import MODULE`` / ``--import=FILE.py`` of ``argv``, in order, before
    the config is read; return the modules' names. A module name is found on ``sys.path``
    with the current directory first (as ``python -m`` does); a path ending in ``.py`` is
    loaded from that file. A module that cannot be found or raises is `fail`: one line."""
    return [_import_one(target) for _, target in _flag_values(argv, IMPORT_FLAG)]


def _import_one(target: str) -> str:
    flag = f"--{IMPORT_FLAG}={target}"
    if not target:
        fail(f"{flag}: name a module (my_encodings) or a file (my_encodings.py)")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                fail(f"{flag}: no such file")
            name = path.stem
            loaded = getattr(sys.modules.get(name), "__file__", None)
            if loaded and Path(loaded).resolve() == path.resolve():
                return name  # already imported (by an earlier command in this process)
            shadowed = _shadowed_module(name, path)
            if shadowed:
                fail(
                    f"{flag}: {shadowed}; importing this file under the name {name!r} would "
                    f"replace it for the whole program: rename the file (e.g. my_{name}.py)"
                )
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses and pickling look a class's module up
            spec.loader.exec_module(module)
            return name
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        importlib.import_module(target)
        return target
    except SystemExit:
        raise
    except ModuleNotFoundError as e:
        fail(f"{flag}: {e} (a module on sys.path or in the current directory, or FILE.py)")
    except Exception as e:
        fail(f"{flag}: importing it raised {type(e).__name__}: {e}")


def _shadowed_module(name: str, path: Path) -> str | None:
    """What a file imported as module ``name`` would replace (a standard-library module, or
    another module on ``sys.path`` or already imported), or None."""
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        return f"{name!r} is a module of Python's standard library"
    loaded = sys.modules.get(name)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None) or "built in"
        return f"{name!r} is the name of a module already imported ({origin})"
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None)
    if spec is not None and (origin is None or Path(origin).resolve() != path.resolve()):
        return f"{name!r} is the name of an installed module ({origin or 'a namespace package'})"
    return None


def explain_flag_error(argv: list[str], error: Exception) -> str:
    """The one-line explanation of ``error`` raised while parsing ``argv``."""
    missing = re.findall(r"Flag --(\w+) must have a value other than None", str(error))
    if missing or (_flag_value(argv, "config") is None and "--config=None" in str(error)):
        names = list(dict.fromkeys(["config"] * ("--config=None" in str(error)) + missing))
        return (
            f"missing {' and '.join('--' + n for n in names)}; e.g. "
            "--config=configs/extrapolation_lm.py:quick --workdir=runs/quick (--help lists "
            "every flag)"
        )
    config = _load_config(argv)
    overrides = config_overrides(argv)
    if config is not None:
        for name, value in overrides:
            problem = _check_path(config, name)
            if problem:
                return f"--{name}={value}: {problem}"
    lines = [x.strip() for x in str(error).splitlines() if x.strip()] or [type(error).__name__]
    if len(lines) > 1 and ("--config=" in lines[0] or "config file" in lines[0]):
        # The config file failed to load: its last line is the exception, e.g. an unknown preset.
        reason = re.sub(r"^[\w.]*(Error|Exception): ", "", lines[-1])
        return f"--config={_flag_value(argv, 'config')}: {reason}"
    for name, value in overrides:
        if f"--{name}" in lines[0] and config is not None:  # a field: `_check_path` passed
            leaf = functools.reduce(operator.getitem, name.split(".")[1:], config)
            expected = _article(type(leaf).__name__) if leaf is not None else "a valid value"
            if value is None:
                return f"--{name}: missing value; config.{name[7:]} takes {expected}"
            return f"--{name}={value!r}: must be {expected}"
    return lines[0]


def _article(type_name: str) -> str:
    if type_name == "tuple":
        return "a tuple, e.g. '(1, 2)'"
    return ("an " if type_name[:1] in "aeiou" else "a ") + type_name


def _flag_values(argv: list[str], name: str) -> typing.Iterator[tuple[int, str]]:
    """``(i, value)`` of every ``--name=VALUE`` and ``--name VALUE`` in ``argv``, in order:
    ``argv[i]`` is the argument that holds the value."""
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            yield i, arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(argv):
            yield i + 1, argv[i + 1]


def _flag_value(argv: list[str], name: str) -> str | None:
    return next((value for _, value in _flag_values(argv, name)), None)


def config_overrides(argv: list[str]) -> list[tuple[str, str | None]]:
    """``[("config.a.b", value or None)]`` for every ``--config.a.b[=value]`` argument."""
    out = []
    for i, arg in enumerate(argv):
        if arg.startswith("--config."):
            name, eq, value = arg[2:].partition("=")
            if not eq:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                value = None if nxt is None or nxt.startswith("--") else nxt
            out.append((name, value))
    return out


def _check_preset(argv: list[str], typed: str | None = None) -> None:
    """`fail` when ``--config`` names a file with ``PRESETS`` but no ``:PRESET`` (``typed``:
    the value as given, e.g. a packaged config's name, for the message)."""
    spec = _flag_value(argv, "config")
    if not spec or ":" in spec:
        return
    presets = config_presets(spec)  # [] also for a file that cannot be loaded: the flag says
    if presets:
        typed = typed or spec
        fail(f"--config={typed}: name a preset, {typed}:PRESET with PRESET one of {presets}")


def _load_config(argv: list[str]) -> Any:
    """The config that ``--config=FILE.py:PRESET`` names (None if it cannot be loaded)."""
    spec = _flag_value(argv, "config")
    if not spec:
        return None
    path, _, preset = spec.partition(":")
    try:
        module_spec = importlib.util.spec_from_file_location("_config_for_errors", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module.get_config(preset) if preset else module.get_config()
    except Exception:
        return None


def _check_path(config: Any, name: str) -> str | None:
    """Why ``config.a.b`` is not a field of ``config`` (None if it is)."""
    node, path = config, "config"
    for part in name.split(".")[1:]:
        if not hasattr(node, "keys"):
            return f"{path} is a {type(node).__name__}, not a section with field {part!r}"
        if part not in node:
            return f"{path} has no field {part!r}; allowed: {sorted(node.keys())}"
        node, path = node[part], f"{path}.{part}"
    return None
