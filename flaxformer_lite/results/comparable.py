"""Which results rows may share a table: what changes the numbers must agree (DESIGN.md §7).

Rows of one table group -- ``(study, task, train length, model size)``, the rows whose
tables, paired differences and plots are computed together -- are compared, every row of
every cell, on:

* ``setting``: the run's identity config (`RunConfig.identity`, flattened: every config
  field that changes numbers, named as a resume refusal names it, ``train.num_steps``),
  except what the table is meant to compare -- the seed, the encoding
  (``model.positional``, its options ``model.positional_options.*``,
  ``model.randomized_positions`` and the per-layer ``model.layer_pattern``) -- and the
  fields any of the group's cells had set by its study's sweep (``swept``: a rate sweep's
  ``optim.learning_rate``, a size sweep's ``model.*``, the tasks' ``data.task``), which the
  report tabulates separately; in a study of pretrained models (``pretrained.source``
  swept) the architecture ``model.*`` too, except ``model.dtype`` and ``model.param_dtype``;
* ``corpus_sha256``: the corpus content hash (``data.sha256`` of the rows);
* ``versions.python`` and ``versions.<package>`` for the packages a resume refuses
  (`train.identity.VERSION_PACKAGES`: flaxformer-lite, jax, jaxlib, flax, optax, numpy).

A row that does not record a field (a task's rows have no corpus hash) is not compared on
it. The backend, device, git commit and command
are not compared: a CPU and a TPU run of one study merge (DESIGN.md §7), and the commit is
only a warning on resume too (`train.identity`).

Rule for versions: a difference after the first two release components -- a patch release,
``numpy 1.26.3`` vs ``1.26.4``, ``jax 0.4.30`` vs ``0.4.31``, ``python 3.11.4`` vs
``3.11.9`` -- is a warning (on stderr, in REPORT.md and in the caption of each table it
touches): patch releases fix bugs without meaning to change results, and shards of one study
installed days apart often get one. A difference in the major or minor release (or a version
that does not parse as one) refuses like a config field. The resume check is stricter (any
version difference refuses: a checkpoint is never continued under other code), because it
guards one run's state, while this check guards a comparison between runs.

Refused differences are one line per field, naming a run and file for each value::

    train.num_steps: 20 (rope-seed0, s0/results.jsonl) vs 60 (alibi-seed0, s1/results.jsonl)

and ``allow`` (``--allow-mixed=FIELD,...``; a name also allows the fields under it,
``versions`` every version) merges them on purpose: the caption of each table they touch,
and REPORT.md, then say what was mixed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from flaxformer_lite.train.identity import VERSION_PACKAGES

# The fields a table is meant to compare, never compared here (and their sub-fields).
ENCODING_FIELDS = (
    "seed",
    "model.positional",
    "model.positional_options",
    "model.randomized_positions",
    "model.layer_pattern",
)
# A pretrained-model study compares models: their architecture (everything config.json sets,
# ``model.*``) is its subject, as the encoding is a trained study's; how they compute is not.
PRETRAINED_SUBJECT = "model"
PRETRAINED_COMPARED = ("model.dtype", "model.param_dtype")
CORPUS_FIELD = "corpus_sha256"
VERSION_PREFIX = "versions."


class MixedRowsError(ValueError):
    """Rows that must not share a table differ; the message has one line per field."""

    def __init__(self, differences: Sequence[Difference]):
        self.differences = list(differences)
        super().__init__("\n".join(d.line() for d in self.differences))


@dataclasses.dataclass(frozen=True)
class Difference:
    """One field with several values in one table group: each value with the first run and
    file that has it."""

    field: str
    group: tuple[Any, ...]
    values: tuple[tuple[str, str, str], ...]  # (value as text, run, file)
    patch_only: bool = False  # versions that differ only after their minor release

    def line(self, *, files: bool = True) -> str:
        """``field: a (run, file) vs b (run, file)`` (``files=False``: ``a (run)``, the form
        that does not depend on where the rows were read from)."""
        shown = " vs ".join(
            f"{v} ({run}, {file})" if files else f"{v} ({run})" for v, run, file in self.values
        )
        return f"{self.field}: {shown}"

    def note(self) -> str:
        """The short form for a caption: ``field a (run) vs b (run)``."""
        return f"{self.field} " + " vs ".join(f"{v} ({run})" for v, run, _ in self.values)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What `check` found: ``refused`` differences stop the report; ``mixed`` were allowed
    on purpose; ``patch`` are version differences in a patch release only (a warning);
    ``unused``: names in ``allow`` that no difference needed."""

    refused: tuple[Difference, ...] = ()
    mixed: tuple[Difference, ...] = ()
    patch: tuple[Difference, ...] = ()
    unused: tuple[str, ...] = ()

    def notes(self, group: tuple[Any, ...]) -> str:
        """The sentence a table of ``group`` ends its caption with ("" when none)."""
        parts = []
        mixed = [d.note() for d in self.mixed if d.group == group]
        if mixed:
            parts.append(f"Mixed on purpose (--allow-mixed): {'; '.join(mixed)}.")
        patch = [d.note() for d in self.patch if d.group == group]
        if patch:
            parts.append(f"Versions differ in a patch release: {'; '.join(patch)}.")
        return " ".join(parts)

    def report_lines(self) -> list[str]:
        """Plain lines for REPORT.md: what was mixed and which versions differ, naming runs
        but not the files they were read from (the report is the same wherever its rows lie;
        the command's stderr names the files)."""
        lines = [f"mixed on purpose (--allow-mixed): {d.line(files=False)}" for d in self.mixed]
        lines += [
            f"versions differ in a patch release only: {d.line(files=False)}" for d in self.patch
        ]
        return list(dict.fromkeys(lines))


def table_group(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """``(study, task, train_length, model_size)``: the rows compared with each other."""
    return (row.get("study"), row.get("task"), row.get("train_length"), row.get("model_size"))


def compared_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """Every field ``row`` records that is compared (before the group's exclusions)."""
    out: dict[str, Any] = {}
    setting = row.get("setting")
    if isinstance(setting, Mapping):
        out |= {str(k): v for k, v in setting.items()}
    data = row.get("data")
    if isinstance(data, Mapping) and data.get("sha256") is not None:
        out[CORPUS_FIELD] = data["sha256"]
    packages = row.get("packages")
    if isinstance(packages, Mapping):
        for name in VERSION_PACKAGES:
            if packages.get(name) is not None:
                out[VERSION_PREFIX + name] = packages[name]
    if row.get("python") is not None:
        out[VERSION_PREFIX + "python"] = row["python"]
    return out


def _under(field: str, names: Sequence[str]) -> bool:
    """Whether ``field`` is one of ``names`` or a sub-field of one."""
    return any(field == n or field.startswith(n + ".") for n in names)


def _text(field: str, value: Any) -> str:
    if field == CORPUS_FIELD and isinstance(value, str) and len(value) > 16:
        return value[:12] + "..."
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _canonical(value: Any) -> Any:
    """A key equal for equal recorded values: the value itself for a string, an integer, a
    bool or None (typed, so 1, 1.0 and True stay apart as in JSON), else its sorted JSON."""
    if value is None or isinstance(value, str | int):
        return (type(value).__name__, value)
    return json.dumps(value, sort_keys=True, default=str)


def _release(version: Any) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string, None if it does not parse as one."""
    match = re.match(r"(\d+)\.(\d+)(?:\.\d+)?", version) if isinstance(version, str) else None
    return (int(match[1]), int(match[2])) if match else None


def _patch_only(field: str, values: Sequence[Any]) -> bool:
    if not field.startswith(VERSION_PREFIX):
        return False
    releases = {_release(v) for v in values}
    return len(releases) == 1 and None not in releases


def check(
    rows: Sequence[Mapping[str, Any]],
    origins: Sequence[str] | None = None,
    allow: Sequence[str] = (),
) -> Verdict:
    """Compare the rows of each table group (see the module docstring).

    Args:
      rows: results rows.
      origins: each row's file (named in the lines); default ``row N``.
      allow: field names (or prefixes: ``versions``) merged on purpose.
    """
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(table_group(row), []).append(i)
    refused, mixed, patch, used = [], [], [], set()
    for group, members in groups.items():
        swept = {str(f) for i in members for f in (rows[i].get("swept") or ())}
        excluded, kept = (*ENCODING_FIELDS, *sorted(swept)), ()
        if "pretrained.source" in swept:
            excluded, kept = (*excluded, PRETRAINED_SUBJECT), PRETRAINED_COMPARED
        seen: dict[str, dict[Any, tuple[Any, int]]] = {}  # field -> canonical value -> first
        skipped: dict[str, bool] = {}  # a study's rows repeat the same few hundred fields
        for i in members:
            for field, value in compared_fields(rows[i]).items():
                skip = skipped.get(field)
                if skip is None:
                    skip = skipped[field] = _under(field, excluded) and field not in kept
                if not skip:
                    seen.setdefault(field, {}).setdefault(_canonical(value), (value, i))
        for field in sorted(seen):
            found = seen[field]
            if len(found) < 2:
                continue
            values = tuple(
                (
                    _text(field, value),
                    str(rows[i].get("run")),
                    origins[i] if origins is not None else f"row {i + 1}",
                )
                for value, i in found.values()
            )
            only_patch = _patch_only(field, [v for v, _ in found.values()])
            difference = Difference(field, group, values, only_patch)
            names = [n for n in allow if _under(field, [n])]
            if names:
                used.update(names)
                mixed.append(difference)
            elif only_patch:
                patch.append(difference)
            else:
                refused.append(difference)
    unused = tuple(n for n in dict.fromkeys(allow) if n not in used)
    return Verdict(tuple(_unique(refused)), tuple(mixed), tuple(patch), unused)


def _unique(differences: list[Difference]) -> list[Difference]:
    """One difference per line of text (the same mix in two groups is said once)."""
    out: dict[str, Difference] = {}
    for d in differences:
        out.setdefault(d.line(), d)
    return list(out.values())


def refusal_lines(verdict: Verdict) -> list[str]:
    """The lines of a refusal: one per differing field, then what to do."""
    fields = ",".join(dict.fromkeys(d.field for d in verdict.refused))
    return [d.line() for d in verdict.refused] + [
        "these rows must not share a table (their numbers do not compare); report them "
        f"separately, or merge them on purpose with --allow-mixed={fields}"
    ]
