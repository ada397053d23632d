"""One rule for every claim that one trained arm beats another.

Train both arms with the same seeds, so that seed s of arm A and seed s of arm B share initial
weights, data order and augmentation draws and differ only in the thing under study. Then the
paired differences d_s = a_s - b_s carry the effect without most of the seed-to-seed noise, and

    mean  d = (1/n) sum_s d_s          standard error  se = std(d_s, ddof=1) / sqrt(n)

decide the verdict by the interval d ± z·se (z = 2, as lesson 12 uses):

    "A > B"                       if d - z·se > 0
    "B > A"                       if d + z·se < 0
    "not resolved at this scale"  otherwise, or with fewer than MIN_SEEDS pairs.

A tie is not evidence of no effect: "not resolved" is printed with its interval and asserted as
nothing more than itself. With 3 seeds, ±2 SE is narrower than Student's 95% interval
(t = 4.3 at 2 degrees of freedom), so a direction claimed at 3 seeds is a modest one; the
interval is always printed beside it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MIN_SEEDS = 3
NOT_RESOLVED = "not resolved at this scale"


@dataclass(frozen=True)
class Comparison:
    """The paired comparison of arm ``names[0]`` against arm ``names[1]``."""

    names: tuple[str, str]
    differences: tuple[float, ...]   # a_s - b_s, seed by seed
    z: float = 2.0

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
    def interval(self) -> tuple[float, float]:
        half = self.z * self.standard_error
        return self.mean - half, self.mean + half

    @property
    def verdict(self) -> str:
        low, high = self.interval
        if len(self.differences) < MIN_SEEDS:
            return NOT_RESOLVED
        if low > 0:
            return f"{self.names[0]} > {self.names[1]}"
        if high < 0:
            return f"{self.names[1]} > {self.names[0]}"
        return NOT_RESOLVED

    def describe(self, scale: float = 1.0, unit: str = "") -> str:
        """One line: the mean difference, its interval, the seeds, the verdict (values × scale)."""
        low, high = self.interval
        each = ", ".join(f"{scale * d:+.1f}" for d in self.differences)
        return (f"{self.names[0]} − {self.names[1]}: {scale * self.mean:+.1f}{unit} "
                f"± {self.z:g} SE = [{scale * low:+.1f}, {scale * high:+.1f}]{unit} over "
                f"{len(self.differences)} paired seeds ({each}): {self.verdict}")


def compare_paired(a, b, names: tuple[str, str] = ("A", "B"), z: float = 2.0) -> Comparison:
    """Compare arm ``a`` with arm ``b``: equal-length sequences of one number per seed, seed s of
    each arm trained from the same seed (see the module docstring)."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) != len(b) or not a:
        raise ValueError(f"compare_paired needs one value per seed for both arms, paired by seed; "
                         f"got {len(a)} and {len(b)}")
    if not (isinstance(z, (int, float)) and z > 0):
        raise ValueError(f"z must be a positive number of standard errors, got {z!r}")
    if len(names) != 2 or names[0] == names[1]:
        raise ValueError(f"names must be two different labels, got {names!r}")
    return Comparison(tuple(names), tuple(x - y for x, y in zip(a, b)), float(z))
