"""course_utils.compare: the kit's one rule for "arm A beats arm B" (paired seeds, ±2 SE)."""
import math

import pytest

from course_utils.compare import NOT_RESOLVED, compare_paired


def test_the_interval_decides_the_direction():
    up = compare_paired([0.50, 0.52, 0.55], [0.40, 0.43, 0.44], names=("T=0.2", "T=1"))
    assert up.mean == pytest.approx(0.1, abs=1e-9)
    assert up.verdict == "T=0.2 > T=1"
    down = compare_paired([0.40, 0.43, 0.44], [0.50, 0.52, 0.55], names=("T=0.2", "T=1"))
    assert down.verdict == "T=1 > T=0.2"


def test_a_tie_and_a_noisy_gap_are_not_resolved():
    # the case: same-seed gaps +3.4, +2.1, +0.0 points
    noisy = compare_paired([0.234, 0.221, 0.209], [0.200, 0.200, 0.209])
    assert noisy.verdict == NOT_RESOLVED and noisy.interval[0] < 0 < noisy.interval[1]
    tie = compare_paired([0.3, 0.3, 0.3], [0.3, 0.3, 0.3])
    assert tie.verdict == NOT_RESOLVED        # a tie is not evidence of "no effect" either way
    assert "not resolved" in tie.describe(100, " points")
    small = compare_paired([0.012, 0.011, 0.013], [0.0, 0.0, 0.0], ("A", "B"))
    assert small.describe().startswith("A − B: +0.0,") and small.describe(digits=3).startswith("A − B: +0.012,")


def test_the_standard_error_is_that_of_the_paired_differences():
    c = compare_paired([1.0, 2.0, 4.0], [0.0, 0.0, 0.0])
    sd = math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    assert c.standard_error == pytest.approx(sd / math.sqrt(3))


def test_fewer_than_three_seeds_claim_no_direction():
    assert compare_paired([0.9, 0.91], [0.1, 0.11]).verdict == NOT_RESOLVED


@pytest.mark.parametrize("a, b", [([0.1, 0.2], [0.1]), ([], [])])
def test_unpaired_input_is_refused_with_what_to_do(a, b):
    with pytest.raises(ValueError, match="one value per seed"):
        compare_paired(a, b)


def test_the_interval_is_students_95_percent():
    from course_utils.compare import t95
    c = compare_paired([0.3, 0.5, 0.4], [0.2, 0.2, 0.2])
    assert c.half_width == pytest.approx(4.303 * c.standard_error)
    assert t95(4) == 2.776 and abs(t95(60) - 2.000) < 0.005


def test_identical_differences_need_more_than_a_zero_width_interval():
    one_image = 1 / 1000
    c = compare_paired([0.201, 0.301, 0.401], [0.2, 0.3, 0.4], resolution=2 * one_image)
    assert c.standard_error == pytest.approx(0, abs=1e-12) and c.verdict == NOT_RESOLVED


def test_seeds_given_by_name_are_paired_and_checked():
    c = compare_paired({0: 0.5, 1: 0.6, 2: 0.7}, {2: 0.4, 0: 0.2, 1: 0.3})
    assert c.differences == pytest.approx((0.3, 0.3, 0.3))
    with pytest.raises(ValueError, match="same seeds"):
        compare_paired({0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.2, 1: 0.3, 3: 0.4})


def test_a_nan_is_refused():
    with pytest.raises(ValueError, match="NaN"):
        compare_paired([0.1, float("nan"), 0.3], [0.1, 0.2, 0.3])


def test_room_measures_the_near_edge_in_half_widths_and_not_reversed_accepts_the_direction_or_a_tie():
    """room: 0 when the interval's edge touches zero, 1 when the mean is two half-widths out,
    negative when it straddles zero; not_reversed: a direction or not resolved, never the other."""
    from course_utils.compare import not_reversed
    near = compare_paired([2.0, 3.0, 4.0], [0.0, 0.0, 0.0])
    assert near.room == pytest.approx(3.0 / near.half_width - 1)
    edge_low = near.interval[0]
    assert 0 < edge_low and near.room == pytest.approx(edge_low / near.half_width)
    clear = compare_paired([4.8, 5.0, 5.2, 4.9, 5.1], [0.0] * 5)
    assert clear.room > 1 and clear.verdict == "A > B"
    straddling = compare_paired([-1.0, 1.0, 0.5], [0.0] * 3)
    assert straddling.room < 0 and straddling.verdict == NOT_RESOLVED
    assert compare_paired([-4.0, -3.0, -2.0], [0.0] * 3).room == pytest.approx(near.room)
    assert clear.direction == clear.verdict == "A > B" and straddling.direction == "A > B"
    assert not_reversed("A > B") == ("A > B", NOT_RESOLVED)
    for bad in ("A", "A > A", " > B"):
        with pytest.raises(ValueError, match="A > B"):
            not_reversed(bad)


def test_a_claim_is_checked_against_a_tuple_of_verdicts_never_a_substring_or_a_tie():
    """holds: the verdict is one of the claim's verdicts; a bare string ("AB > C" contains
    "B > C") and a claim that only accepts "not resolved" are refused."""
    from course_utils.compare import not_reversed
    wins = compare_paired([0.50, 0.52, 0.55], [0.40, 0.43, 0.44], names=("B", "C"))
    tie = compare_paired([-1.0, 1.0, 0.5], [0.0] * 3, names=("B", "C"))
    assert wins.holds((wins.direction,)) and wins.holds(not_reversed("B > C"))
    assert tie.holds(not_reversed("B > C")) and not tie.holds(("B > C",))
    assert not wins.holds(("C > B",)) and not wins.holds(not_reversed("C > B"))
    with pytest.raises(TypeError, match="tuple of verdicts"):
        wins.holds("AB > C")
    for bad in ((NOT_RESOLVED,), ()):
        with pytest.raises(ValueError, match="never asserted"):
            tie.holds(bad)
    with pytest.raises(ValueError, match="not a direction"):
        wins.holds(("B > D",))
    # a tie bears out "not reversed" only leaning the claimed way (tie's mean is +0.17)
    assert not tie.holds(not_reversed("C > B"))
    leaning_back = compare_paired([1.0, -1.0, -0.5], [0.0] * 3, names=("B", "C"))
    assert leaning_back.verdict == NOT_RESOLVED and not leaning_back.holds(not_reversed("B > C"))
    assert leaning_back.holds(not_reversed("C > B"))


def test_what_one_runs_room_says_about_another_draw_of_seeds():
    """The module docstring's figures: two independent draws of n paired seeds of one true
    difference (drawn flat over ±6 standard deviations of a seed's difference, unknown to both),
    each judged by compare_paired. Where the first draw's room >= 1, the second resolves the same
    direction about 85% of the time at 3 seeds and over 90% at 5 and 10; where the first's edge
    just cleared zero (room in [0, 0.2)), about 60-67% (within 0.55-0.75 here); reversals well
    under 1% everywhere."""
    import torch
    from course_utils.compare import t95
    generator = torch.Generator().manual_seed(0)
    trials = 200_000
    for n, (low, high) in ((3, (0.80, 0.90)), (5, (0.90, 1.0)), (10, (0.90, 1.0))):
        truth = (torch.rand(trials, 1, generator=generator, dtype=torch.float64) - 0.5) * 12
        draws = [truth + torch.randn(trials, n, generator=generator, dtype=torch.float64) for _ in range(2)]
        means = [d.mean(1) for d in draws]
        half = [t95(n - 1) * d.std(1) / math.sqrt(n) for d in draws]
        room = means[0].abs() / half[0] - 1
        resolved = means[1].abs() > half[1]
        same = torch.sign(means[1]) == torch.sign(means[0])
        for select, (lo, hi) in (((room >= 1), (low, high)), (((room >= 0) & (room < 0.2)), (0.55, 0.75))):
            came_back = (resolved & same)[select].double().mean().item()
            reversed_ = (resolved & ~same)[select].double().mean().item()
            assert lo <= came_back <= hi, (n, came_back)
            assert reversed_ < 0.01, (n, reversed_)


def test_describe_a_direction_on_a_zero_width_interval():
    """Identical differences with no resolution: a zero-width interval, room infinite, no crash."""
    same = compare_paired([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    assert same.room == math.inf and "A > B" in same.describe()


def test_a_room_set_by_the_resolution_says_so():
    """Lesson 05's supervised ViT: three seeds gained +11.0 points each, so the seeds' spread is
    zero and the interval's half-width is the probe's resolution (one test image); its room then
    counts resolutions, and the line must say that rather than read as a measured small spread."""
    same = compare_paired([0.343, 0.340, 0.320], [0.233, 0.230, 0.210], ("last", "first"), resolution=0.001)
    assert same.at_resolution and same.half_width == 0.001
    assert "the half-width is the measurement's resolution" in same.describe(100, " points")
    spread = compare_paired([0.35, 0.34, 0.30], [0.23, 0.23, 0.21], ("last", "first"), resolution=0.001)
    assert not spread.at_resolution and "resolution" not in spread.describe(100, " points")
    unresolved = compare_paired([0.3, 0.3, 0.3], [0.3, 0.3, 0.3], resolution=0.001)
    assert unresolved.at_resolution and "resolution" not in unresolved.describe()   # no room printed
