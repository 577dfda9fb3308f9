"""core/memory.py: the size ceiling, the one-line refusal and the largest value that fits, by hand."""

import pytest

from replay_theory.core.memory import (
    MAX_SIZE,
    Estimate,
    Size,
    check_ceiling,
    check_sizes,
    check_threads,
    memory_limit,
    show_bytes,
    usable_cpus,
)


def _product(values):
    """a x b float64 arrays: 8 a b bytes (what a seeds x batch array takes)."""
    return Estimate({f"an a x b array = {values['a']} x {values['b']}": 8 * values["a"] * values["b"],
                     "nothing": 0})


SIZES = (Size("a"), Size("b"))


def test_a_run_that_fits_returns_its_estimate():
    assert check_sizes(SIZES, {"a": 10, "b": 10}, _product, limit=800).total == 800  # at the limit: fits


def test_the_size_furthest_above_its_default_is_named_with_the_largest_value_that_fits():
    # 8 x 10 x 100 = 8000 bytes > 800: b alone must drop to 800 / 80 = 10, a alone to 800 / 800 = 1
    with pytest.raises(ValueError) as err:
        check_sizes(SIZES, {"a": 10, "b": 100}, _product, defaults={"a": 10, "b": 10}, limit=800)
    assert str(err.value) == ("b 100 needs about 7.81 KiB (mostly an a x b array = 10 x 100), more than the 800 bytes "
                              "of memory this machine has; valid: an integer in [1, 10] with the other options as "
                              "given")


def test_without_defaults_the_size_furthest_above_what_fits_is_named():
    # a = 50, b = 40: 16000 bytes > 1000; a fits up to 3 (ratio 16.7), b up to 2 (ratio 20): b is named
    with pytest.raises(ValueError, match=r"^b 40 needs about .*valid: an integer in \[1, 2\] with"):
        check_sizes(SIZES, {"a": 50, "b": 40}, _product, limit=1000)


def test_sizes_that_cannot_fit_alone_are_named_together():
    # even a = b = 1 needs 8 bytes > 4: no single size can be lowered enough
    with pytest.raises(ValueError) as err:
        check_sizes(SIZES, {"a": 3, "b": 5}, _product, limit=4)
    assert str(err.value).startswith("a 3, b 5 need about 120 bytes together (mostly an a x b array = 3 x 5)")


@pytest.mark.parametrize("value", [0, -1, MAX_SIZE + 1, 2**63, 10**30, 2.0, True, "8", None])
def test_the_ceiling_refuses_what_is_not_an_integer_in_range(value):
    with pytest.raises(ValueError) as err:
        check_sizes(SIZES, {"a": value, "b": 1}, _product, limit=2**40)
    assert str(err.value) == f"a must be an integer in [1, {MAX_SIZE}], got {value!r}"


def test_the_ceiling_is_exact_at_both_ends():
    assert check_ceiling("n", MAX_SIZE, 0) == MAX_SIZE and check_ceiling("n", 0, 0) == 0
    with pytest.raises(ValueError, match=r"^n must be an integer in \[1, 2147483647\], got 0$"):
        check_ceiling("n", 0, 1)


def test_a_rate_is_bounded_by_the_estimate_alone():
    def fresh(values):  # w x 1e9 bytes: w <= 10 fits 1e10
        return Estimate({"w": values["w"] * 1e9})

    with pytest.raises(ValueError) as err:
        check_sizes((Size("w", integer=False),), {"w": 1e30}, fresh, limit=10**10)
    message = str(err.value)
    assert message.startswith("w 1e+30 needs about ") and "valid: a number in (0, " in message
    largest = float(message.split("(0, ")[1].split("]")[0])
    assert largest == pytest.approx(10, rel=1e-3)


def test_a_size_marked_without_memory_gets_the_ceiling_alone():
    def constant(values):
        return Estimate({"fixed": 100})

    check_sizes((Size("steps", memory=False),), {"steps": MAX_SIZE}, constant, limit=100)
    with pytest.raises(ValueError, match=r"^steps must be an integer in \[1, 2147483647\]"):
        check_sizes((Size("steps", memory=False),), {"steps": MAX_SIZE + 1}, constant, limit=100)


def test_threads_are_bounded_by_the_cpus():
    assert check_threads("--threads", 1) == 1 and check_threads("--threads", usable_cpus()) == usable_cpus()
    for bad in (0, usable_cpus() + 1, 10**6):
        with pytest.raises(ValueError, match=rf"^--threads must be an integer in \[1, {usable_cpus()}\] \(the CPUs"):
            check_threads("--threads", bad)


def test_the_memory_limit_is_at_most_physical_memory():
    import os

    assert 0 < memory_limit() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("n, shown", [(800, "800 bytes"), (2**20 * 380, "380 MiB"), (1.5 * 2**30, "1.5 GiB"),
                                      (745 * 2**30, "745 GiB"), (4 * 2**40, "4 TiB"), (2**62, "4.19e+06 TiB")])
def test_bytes_read_as_a_person_reads_them(n, shown):
    assert show_bytes(n) == shown
