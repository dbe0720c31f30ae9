"""The regression guard: compare a benchmark's figures with a recorded baseline, and fail when one drifts.

A benchmark that can be guarded returns a :class:`Report`: the machine and the
versions that decide its figures, and the figures, each a value where larger
is worse (a latency, a byte count, an instruction count), with the relative
spread its repeats showed where it was timed. :func:`check` compares it with
a baseline file written earlier by the same benchmark (``--write-baseline``):
it refuses a baseline of another device or other versions, prints figure,
baseline, now and drift, and fails when any figure grew by more than the
tolerance (its own, where the baseline gives one, else ``--tolerance``).
Figures that shrank pass and say the baseline can be refreshed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trit.errors import TritError

DEFAULT_TOLERANCE = 0.05


class BaselineError(TritError, ValueError):
    """A baseline that cannot be compared with this run (missing, unreadable, another device or versions)."""


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    spread: float | None = None  # (max - min) / median of the repeats, where timed
    tolerance: float | None = None  # this figure's own allowance, where the default would be noise


@dataclass
class Report:
    what: str  # the benchmark
    device: str
    versions: dict[str, str]  # those that decide the figures: a baseline of others is refused
    figures: dict[str, Figure] = field(default_factory=dict)
    command: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Report:
        d = json.loads(text)
        return cls(d["what"], d["device"], d["versions"], {k: Figure(**v) for k, v in d["figures"].items()},
                   d.get("command", ""))


@dataclass(frozen=True)
class Row:
    name: str
    baseline: float | None
    now: float | None
    tolerance: float
    unit: str

    @property
    def drift(self) -> float | None:
        if self.baseline is None or self.now is None or self.baseline == 0:
            return None
        return self.now / self.baseline - 1

    @property
    def verdict(self) -> str:
        if self.baseline is None:
            return "new"
        if self.now is None:
            return "MISSING"
        drift = self.drift if self.drift is not None else (0.0 if self.now == self.baseline else float("inf"))
        if drift > self.tolerance:
            return "REGRESSED"
        return "better" if drift < -self.tolerance else "ok"


def load(path: Path) -> Report:
    if not path.is_file():
        raise BaselineError(f"{path}: no such baseline; write one with --write-baseline {path}")
    try:
        return Report.from_json(path.read_text())
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise BaselineError(f"{path}: not a baseline file ({e})") from None


def compare(now: Report, base: Report, tolerance: float = DEFAULT_TOLERANCE, where: str = "baseline") -> list[Row]:
    """Each figure of either report with its verdict; refuses reports of other benchmarks, devices or versions."""
    if (now.what, now.device) != (base.what, base.device):
        raise BaselineError(f"{where}: recorded for {base.what} on {base.device}; this run is {now.what} on "
                            f"{now.device}: compare like with like, or write a baseline here")
    if now.versions != base.versions:
        diff = {k: (base.versions.get(k), now.versions.get(k)) for k in {*now.versions, *base.versions}
                if base.versions.get(k) != now.versions.get(k)}
        raise BaselineError(f"{where}: recorded with other versions ({', '.join(f'{k} {b} -> {n}' for k, (b, n) in sorted(diff.items()))}); "
                            "figures of other versions are not comparable: write a new baseline")
    rows = []
    for name in sorted({*base.figures, *now.figures}):
        b, n = base.figures.get(name), now.figures.get(name)
        tol = (b.tolerance if b is not None and b.tolerance is not None else tolerance)
        rows.append(Row(name, b.value if b else None, n.value if n else None, tol, (b or n).unit))
    return rows


def table(rows: list[Row]) -> str:
    width = max([len(r.name) for r in rows] + [6])
    lines = [f"{'figure':<{width}}  {'baseline':>12}  {'now':>12}  {'drift':>8}  {'allowed':>7}  verdict"]
    for r in rows:
        fmt_ = (lambda v: "-" if v is None else f"{v:.6g}")  # noqa: E731
        drift = "-" if r.drift is None else f"{r.drift:+.1%}"
        lines.append(f"{r.name:<{width}}  {fmt_(r.baseline):>12}  {fmt_(r.now):>12}  {drift:>8}  "
                     f"{r.tolerance:>6.0%}  {r.verdict} {r.unit}")
    return "\n".join(lines)


def check(now: Report, baseline: Path | None = None, write: Path | None = None,
          tolerance: float = DEFAULT_TOLERANCE) -> int:
    """Print the comparison with ``baseline`` (exit status 1 on a regression or a missing figure); ``write``
    records ``now`` as a baseline. Returns the exit status."""
    status = 0
    if baseline is not None:
        rows = compare(now, load(baseline), tolerance, str(baseline))
        print(table(rows))
        bad = [r for r in rows if r.verdict in ("REGRESSED", "MISSING")]
        if bad:
            print(f"regression guard: FAIL: {', '.join(r.name for r in bad)} (against {baseline})")
            status = 1
        else:
            print(f"regression guard: pass ({len(rows)} figures within their allowance of {baseline})")
        if any(r.verdict in ("better", "new") for r in rows):
            print(f"some figures improved or are new: refresh the baseline with --write-baseline {baseline}")
    if write is not None:
        write.parent.mkdir(parents=True, exist_ok=True)
        write.write_text(now.to_json() + "\n")
        print(f"wrote baseline {write}")
    return status
