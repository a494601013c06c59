"""Issue 15's speed targets judged across machines, from recorded benchmark runs.

Reads the JSON-lines rows that ``benchmarks/train_speed.py --record FILE`` appends (one per
run) and prints, per target and jax version, every machine's runs and the target's status:

    .venv/bin/python benchmarks/target_status.py docs/benchmark_runs.jsonl
    .venv/bin/python benchmarks/target_status.py docs/benchmark_runs.jsonl --jax 0.12.0.1 \\
        --after 2026-12-01T05:30:00Z

The rule (issue 15, docs/benchmarks.md): a target counts as met only when runs on two
different machines meet it, and a target met on one machine and missed on another is missed.
Machines are told apart by their boot id (``machine.boot_id``, Linux's
``/proc/sys/kernel/random/boot_id``): a session that lands on an earlier session's VM adds
runs to that machine, not a machine. Not by the boot time (``machine.booted_utc``) alone: the
kernel derives it from the clock and the uptime, so it can move without a reboot (the third
machine's read 08:50:50 UTC, later 08:51:09, its uptime unbroken). Rows recorded before the
benchmark recorded boot ids have only a boot time; such a row joins the machine of any row
that recorded both the same boot time and a boot id, and otherwise its boot time is its
machine. A machine with several runs meets a target when the median of its runs' ratios
does; the table prints beside it how many of its runs met the target on their own and every
ratio, in the order the runs finished, so a reader can apply a stricter reading. Per target
and jax version the status is

* ``met``: runs on two machines or more, each machine meeting the target;
* ``missed``: some machine's median misses it;
* ``one machine only``: every run comes from one machine, which meets it;
* ``no machine``: no run's machine is known.

Rows whose boot id and boot time are both "unknown" are listed but count as no machine. A
row's ratio is PyTorch time / JAX time (> 1: JAX faster) and a run meets a target when
``ratio >= goal``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import machine  # no jax: only /proc

UNKNOWN = "unknown"


def ratio_text(ratio: float, goal: float) -> str:
    """``ratio`` as printed beside a verdict on ``ratio >= goal``: two decimals, or as many
    more as it takes for the printed figure to fall on the verdict's side of ``goal`` (a
    ratio of 0.9962 against 1.0 prints "0.996x", which "1.00x" beside "missed" would hide)."""
    for digits in range(2, 7):
        text = f"{ratio:.{digits}f}"
        if (float(text) >= goal) == (ratio >= goal):
            return text + "x"
    return f"{ratio!r}x"


class RowError(ValueError):
    """A recorded row that cannot be read; the message names the file, line and field."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One target's result in one recorded run."""

    target: str
    goal: float
    ratio: float
    jax: str
    machine: str
    booted: str
    finished: datetime.datetime
    commit: str


@dataclasses.dataclass(frozen=True)
class MachineRuns:
    """The runs of one target and jax version on one machine, in the order they finished:
    ``machine`` is its boot id (or, for rows recorded without one, its boot time), ``booted``
    the boot times its rows recorded, in order of first appearance."""

    machine: str
    booted: tuple[str, ...]
    ratios: tuple[float, ...]
    goal: float

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def met_count(self) -> int:
        return sum(r >= self.goal for r in self.ratios)

    @property
    def counts(self) -> bool:
        """Whether this is a machine at all (its boot id or boot time is known)."""
        return self.machine != UNKNOWN

    @property
    def name(self) -> str:
        """How the table names it: the boot time(s), and the boot id's first 8 characters."""
        if not self.counts:
            return f"{UNKNOWN} (counts as no machine)"
        booted = " / ".join(self.booted)
        if self.machine in self.booted:
            return f"{booted} (no boot id recorded)"
        return f"{booted} (boot id {self.machine[:8]})"

    @property
    def meets(self) -> bool:
        return self.median >= self.goal


@dataclasses.dataclass(frozen=True)
class Status:
    """One target with one jax version: its machines and the verdict."""

    target: str
    goal: float
    jax: str
    machines: tuple[MachineRuns, ...]

    @property
    def verdict(self) -> str:
        counted = [m for m in self.machines if m.counts]
        if not counted:
            return "no machine"
        if not all(m.meets for m in counted):
            return "missed"
        return "met" if len(counted) >= 2 else "one machine only"


def _field(row: dict, dotted: str, kind: type | tuple[type, ...], where: str):
    value = row
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            raise RowError(f"{where}: field {dotted!r} is missing")
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RowError(f"{where}: field {dotted!r} is {value!r}; expected {names}")
    return value


def _time(text: str, what: str) -> datetime.datetime:
    """``text`` as an aware datetime; ``what`` names it in the error."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise RowError(
            f"{what} is {text!r}; expected an ISO 8601 time with its zone, such as "
            "2026-12-01T17:03:01Z"
        )
    return when


def _optional_field(row: dict, dotted: str, kind: type, where: str):
    """``row``'s field ``dotted`` if it is there (`_field`'s checks), else None."""
    parent, _, key = dotted.rpartition(".")
    holder = _field(row, parent, dict, where) if parent else row
    return _field(row, dotted, kind, where) if key in holder else None


def read_runs(paths: Iterable[Path]) -> list[Run]:
    """Every target result of every ``train_speed`` row in ``paths`` (blank lines and rows of
    other benchmarks skipped), each with its machine (`machine_of`). Raises `RowError` naming
    the file, line and field of the first row it cannot read."""
    found = []  # (the run's fields, its row's boot id or None, "file:line")
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                where = f"{path}:{number}"
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise RowError(f"{where}: not a JSON object ({e.msg})") from None
                if not isinstance(row, dict):
                    raise RowError(f"{where}: not a JSON object")
                if row.get("benchmark") != "train_speed":
                    continue
                finished = _time(
                    _field(row, "finished_utc", str, where), f"{where}: field 'finished_utc'"
                )
                booted = _field(row, "machine.booted_utc", str, where)
                boot_id = _optional_field(row, "machine.boot_id", str, where)
                jax = _field(row, "software.jax", str, where)
                commit = _field(row, "commit", str, where)
                for i, t in enumerate(_field(row, "targets", list, where)):
                    if not isinstance(t, dict):
                        raise RowError(f"{where}: targets[{i}] is {t!r}; expected an object")
                    ratio = _field(t, "ratio", (int, float), f"{where}: targets[{i}]")
                    if not ratio > 0:
                        raise RowError(f"{where}: targets[{i}].ratio is {ratio!r}; expected > 0")
                    fields = dict(
                        target=_field(t, "name", str, f"{where}: targets[{i}]"),
                        goal=float(_field(t, "goal", (int, float), f"{where}: targets[{i}]")),
                        ratio=float(ratio),
                        jax=jax,
                        booted=booted,
                        finished=finished,
                        commit=commit,
                    )
                    found.append((fields, boot_id, where))
    ids = machine_ids((fields["booted"], boot_id) for fields, boot_id, _ in found)
    return [
        Run(machine=machine_of(fields["booted"], boot_id, ids, where), **fields)
        for fields, boot_id, where in found
    ]


def machine_ids(rows: Iterable[tuple[str, str | None]]) -> dict[str, set[str]]:
    """Boot time -> the boot ids recorded with it, from (boot time, boot id or None) pairs."""
    ids: dict[str, set[str]] = {}
    for booted, boot_id in rows:
        if boot_id not in (None, UNKNOWN) and booted != UNKNOWN:
            ids.setdefault(booted, set()).add(boot_id)
    return ids


def machine_of(booted: str, boot_id: str | None, ids: dict[str, set[str]], where: str) -> str:
    """A row's machine: its boot id when it recorded one; for a row without one, the boot id
    recorded with the same boot time in another row (``ids``, from `machine_ids`), else its
    boot time; "unknown" when neither is known. A boot time recorded with two boot ids
    leaves a row without one unplaceable: `RowError` naming it (``where``)."""
    if boot_id not in (None, UNKNOWN):
        return boot_id
    if booted == UNKNOWN:
        return UNKNOWN
    linked = ids.get(booted, set())
    if len(linked) > 1:
        raise RowError(
            f"{where}: no boot id, and its boot time {booted!r} was recorded with boot ids "
            f"{sorted(linked)}: the row's machine cannot be told"
        )
    return next(iter(linked), booted)


def statuses(runs: Iterable[Run]) -> list[Status]:
    """`Status` of every (target, jax version) in ``runs``: targets in the order they first
    appear, jax versions sorted, machines in the order of their first run, each machine's
    ratios in the order its runs finished."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.target, run.jax), []).append(run)
    order = list(dict.fromkeys(target for target, _ in groups))
    out = []
    for target, jax in sorted(groups, key=lambda k: (order.index(k[0]), k[1])):
        group = sorted(groups[(target, jax)], key=lambda r: r.finished)
        goals = {r.goal for r in group}
        if len(goals) > 1:
            raise RowError(f"target {target!r} has different goals in the rows: {sorted(goals)}")
        by_machine: dict[str, list[Run]] = {}
        for run in group:
            by_machine.setdefault(run.machine, []).append(run)
        goal = goals.pop()
        machines = tuple(
            MachineRuns(
                key,
                tuple(dict.fromkeys(r.booted for r in rs)),
                tuple(r.ratio for r in rs),
                goal,
            )
            for key, rs in by_machine.items()
        )
        out.append(Status(target, goal, jax, machines))
    return out


def here(runs: Iterable[Run], booted: str, boot_id: str) -> str:
    """One line on whether the machine with ``booted`` / ``boot_id`` (this one, from
    benchmarks/machine.py) already has runs among ``runs`` (`main` passes every row of the
    files, whatever ``--after`` and ``--jax`` select): a session decides from it whether its
    runs can add a machine."""
    runs = list(runs)
    ids = machine_ids((r.booted, r.machine) for r in runs if r.machine not in (r.booted, UNKNOWN))
    name = f"booted {booted}, boot id {boot_id}"
    try:
        mine = machine_of(booted, boot_id, ids, f"this machine ({name})")
    except RowError as e:
        return f"{e}."
    if mine == UNKNOWN:
        return f"This machine ({name}) cannot be told apart: its runs count as no machine."
    own = sorted({(r.finished, r.jax) for r in runs if r.machine == mine})
    if not own:
        return f"This machine ({name}) has no recorded run: its runs count as another machine."
    versions = ", ".join(sorted({jax for _, jax in own}))
    return (
        f"This machine ({name}) already has {len(own)} recorded runs (jax {versions}; the last "
        f"finished {own[-1][0].isoformat()}): its runs add to that machine, not a new one."
    )


def render(found: list[Status]) -> str:
    """Two Markdown tables: every machine's runs, then the verdict per target and jax."""
    lines = [
        "| target | jax | machine (booted, boot id) | runs | met in | median ratio "
        "| ratios, in order |",
        "|---|---|---|--:|--:|--:|---|",
    ]
    for s in found:
        for m in s.machines:
            ratios = ", ".join(ratio_text(r, s.goal) for r in m.ratios)
            lines.append(
                f"| {s.target} | {s.jax} | {m.name} | {len(m.ratios)} | {m.met_count} | "
                f"{ratio_text(m.median, s.goal)} | {ratios} |"
            )
    lines += ["", "| target | jax | machines | status |", "|---|---|--:|---|"]
    for s in found:
        machines = sum(m.counts for m in s.machines)
        lines.append(f"| {s.target} | {s.jax} | {machines} | {s.verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path, help="JSON-lines files of recorded runs")
    p.add_argument(
        "--jax", action="append", help="only runs with this jax version (may be repeated)"
    )
    p.add_argument(
        "--after", help="only runs that finished at or after this time (ISO 8601 with zone)"
    )
    p.add_argument(
        "--here",
        action="store_true",
        help="also say whether this machine (its boot id) already has recorded runs",
    )
    args = p.parse_args(argv)
    try:
        runs = read_runs(args.files)
        mine = here(runs, machine.booted(), machine.boot_id()) if args.here else None
        if args.after:
            after = _time(args.after, "--after")
            runs = [r for r in runs if r.finished >= after]
        if args.jax:
            runs = [r for r in runs if r.jax in args.jax]
        found = statuses(runs)
    except (OSError, RowError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not found:
        print("error: no train_speed runs match", file=sys.stderr)
        return 2
    print(render(found))
    if mine is not None:
        print("\n" + mine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
