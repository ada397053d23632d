"""One rule for every claim that one trained arm beats another.

Train both arms with the same seeds, so that seed s of arm A and seed s of arm B share initial
weights, data order and augmentation draws and differ only in the thing under study. Then the
paired differences d_s = a_s - b_s carry the effect without most of the seed-to-seed noise, and

    mean  d = (1/n) sum_s d_s          standard error  se = std(d_s, ddof=1) / sqrt(n)

decide the verdict by the 95% interval d ± t·se, with Student's t at n - 1 degrees of freedom
(4.30 at 3 seeds, 2.78 at 5; a normal's 2 would give only about 82% coverage at 3 seeds):

    "A > B"                       if d - t·se > 0
    "B > A"                       if d + t·se < 0
    "not resolved at this scale"  otherwise, or with fewer than MIN_SEEDS pairs.

``resolution`` is the smallest difference the measurement can show (e.g. one test image of a
probe's accuracy): the interval is never narrower than it, so identical differences (se = 0) do
not claim a direction on a zero-width interval. A tie is not evidence of no effect: "not
resolved" is printed with its interval, and claims nothing.

What a lesson may claim from one run's verdict. A verdict is one draw of seeds; another draw
gives another interval, and where the first interval's edge sits near zero the second may not
resolve at all (lesson 02's colour probe did exactly that between two machines). ``room`` says
how far the nearer edge stands from zero, in half-widths. In a simulation of two independent
draws (``tests/test_compare.py``: unknown true difference, standard errors estimated from the
seeds), a direction with room >= 1 came back resolved the same way about 85% of the time at 3
seeds and over 90% at 5 or 10; one whose edge just cleared zero (room under 0.2) about 60-67%; a
direction came back reversed well under 1% of the time in each case. So a lesson asserts a
direction only where its default run measured room >= 1, and otherwise only ``not_reversed``
(the direction or "not resolved"), which the run's mean must lean towards (a "not resolved"
leaning that way included: its mean on the direction's side): another draw breaks that claim
only by resolving the opposite way. A "not resolved" itself is printed, never asserted as the
verdict: another draw may resolve it. The preset records each claim's measured room.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

MIN_SEEDS = 3
NOT_RESOLVED = "not resolved at this scale"
# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(degrees_of_freedom: int) -> float:
    """Student's t 0.975 quantile (table to 30 degrees of freedom, then 1.96 + 2.5/df, within
    0.1% of the exact value)."""
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {degrees_of_freedom}")
    if degrees_of_freedom <= len(_T95):
        return _T95[degrees_of_freedom - 1]
    return 1.96 + 2.5 / degrees_of_freedom


@dataclass(frozen=True)
class Comparison:
    """The paired comparison of arm ``names[0]`` against arm ``names[1]``."""

    names: tuple[str, str]
    differences: tuple[float, ...]   # a_s - b_s, seed by seed
    resolution: float = 0.0

    @property
    def mean(self) -> float:
        return sum(self.differences) / len(self.differences)

    @property
    def standard_error(self) -> float:
        n = len(self.differences)
        if n < 2:
            return math.inf
        var = sum((d - self.mean) ** 2 for d in self.differences) / (n - 1)
        return math.sqrt(var / n)

    @property
    def half_width(self) -> float:
        n = len(self.differences)
        if n < 2:
            return math.inf
        return max(t95(n - 1) * self.standard_error, self.resolution)

    @property
    def interval(self) -> tuple[float, float]:
        return self.mean - self.half_width, self.mean + self.half_width

    @property
    def direction(self) -> str:
        """The verdict that says the first arm wins, "A > B" in the names' order: what a claim
        that A beats B asserts (or accepts with ``not_reversed``)."""
        return f"{self.names[0]} > {self.names[1]}"

    @property
    def _reverse(self) -> str:
        """The verdict that says the second arm wins."""
        return f"{self.names[1]} > {self.names[0]}"

    @property
    def room(self) -> float:
        """How far the interval's nearer edge stands from zero, in half-widths: 1 when the mean is
        two half-widths from zero, 0 when the edge touches zero, negative when it straddles it
        (infinite for a nonzero mean on a zero-width interval, which ``resolution`` prevents)."""
        if self.half_width == 0:
            return math.inf if self.mean else -1.0
        return abs(self.mean) / self.half_width - 1

    @property
    def verdict(self) -> str:
        low, high = self.interval
        if len(self.differences) < MIN_SEEDS:
            return NOT_RESOLVED
        if low > 0:
            return self.direction
        if high < 0:
            return self._reverse
        return NOT_RESOLVED

    def holds(self, accepted: tuple[str, ...]) -> bool:
        """Whether this comparison bears out a claim: ``accepted`` is the claim's verdicts,
        ``(c.direction,)`` or ``not_reversed(c.direction)`` (see the module docstring). A "not
        resolved" bears out ``not_reversed`` only with its mean on the claimed direction's side.
        Refused: a bare string (``in`` on a string would test for a substring), a direction this
        comparison's names cannot take, and a claim that accepts only "not resolved" (a tie is
        printed, never asserted)."""
        if isinstance(accepted, str) or not isinstance(accepted, (tuple, list, frozenset, set)):
            raise TypeError(f"accepted is a tuple of verdicts, e.g. ({accepted!r},) or "
                            f"not_reversed(...), got {accepted!r}")
        directions = set(accepted) - {NOT_RESOLVED}
        if not directions:
            raise ValueError(f"a claim accepts at least one direction, got {tuple(accepted)!r}: "
                             "a 'not resolved' is printed, never asserted")
        reverse = self._reverse
        if not directions <= {self.direction, reverse}:
            raise ValueError(f"{sorted(directions - {self.direction, reverse})} is not a direction of "
                             f"this comparison: {self.direction!r} or {reverse!r}")
        if self.verdict != NOT_RESOLVED:
            return self.verdict in accepted
        leans = self.direction if self.mean > 0 else reverse if self.mean < 0 else None
        return NOT_RESOLVED in accepted and leans in directions

    def describe(self, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
        """One line: the mean difference, its 95% interval, the seeds, the verdict and, for a
        direction, its ``room`` (× scale, ``digits`` after the decimal point)."""
        low, high = self.interval
        f = f"+.{digits}f"
        each = ", ".join(f"{scale * d:{f}}" for d in self.differences)
        return (f"{self.names[0]} − {self.names[1]}: {scale * self.mean:{f}}{unit}, 95% interval "
                f"[{scale * low:{f}}, {scale * high:{f}}]{unit} over {len(self.differences)} "
                f"paired seeds ({each}): {self.verdict}"
                + ("" if self.verdict == NOT_RESOLVED else
                   f" (nearer edge {self.room:.1f} half-widths from zero; see room"
                   + ("; the half-width is the measurement's resolution: the seeds agree within it"
                      if self.at_resolution else "") + ")"))

    @property
    def at_resolution(self) -> bool:
        """Whether the interval's half-width is the measurement's ``resolution`` rather than the
        seeds' spread (t·se below it): then ``room`` counts resolutions, and a large room says the
        seeds agreed to within one resolution step, not that their spread was measured small."""
        return 0 < self.resolution == self.half_width


def compare_paired(a, b, names: tuple[str, str] = ("A", "B"), *, resolution: float = 0.0) -> Comparison:
    """Compare arm ``a`` with arm ``b``: one number per seed each, seed s of both trained from the
    same seed (see the module docstring). Pass ``{seed: value}`` mappings to have the pairing
    checked, or equal-length sequences in the same seed order."""
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)) or set(a) != set(b):
            raise ValueError("compare_paired pairs runs by seed: both arms need the same seeds, got "
                             f"{sorted(a) if isinstance(a, Mapping) else 'a sequence'} and "
                             f"{sorted(b) if isinstance(b, Mapping) else 'a sequence'}")
        seeds = sorted(a)
        a, b = [a[s] for s in seeds], [b[s] for s in seeds]
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) != len(b) or not a:
        raise ValueError(f"compare_paired needs one value per seed for both arms, paired by seed; "
                         f"got {len(a)} and {len(b)}")
    if any(math.isnan(v) for v in a + b):
        raise ValueError("compare_paired got a NaN: a run diverged or was not measured; fix or "
                         "drop that seed in both arms")
    if len(names) != 2 or names[0] == names[1]:
        raise ValueError(f"names must be two different labels, got {names!r}")
    if not (isinstance(resolution, (int, float)) and resolution >= 0):
        raise ValueError(f"resolution must be a number >= 0, got {resolution!r}")
    return Comparison(tuple(names), tuple(x - y for x, y in zip(a, b)), float(resolution))


def not_reversed(direction: str) -> tuple[str, str]:
    """The verdicts a claim "B does not beat A" accepts, for ``direction`` "A > B": that direction or
    "not resolved at this scale". The claim for a direction whose measured ``room`` is under 1, or
    a "not resolved" whose mean leans towards A (see the module docstring)."""
    names = direction.split(" > ")
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise ValueError(f"a direction reads 'A > B', got {direction!r}")
    return direction, NOT_RESOLVED
