"""The study's automatic batch size (``runner.measured_batch_size``) on cost curves whose
answer is known."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specbound.studies.runner import BATCH_SIZES, PAYING_ROW_SHARE, measured_batch_size


def costs_of(table):
    return lambda size: table[size]


def test_rows_that_cost_linear_time_stay_one_by_one():
    assert measured_batch_size(lambda size: 0.05 * size) == 1


def test_a_flat_forward_takes_the_largest_batch():
    assert measured_batch_size(lambda size: 0.05) == max(BATCH_SIZES) == 32


def test_the_cheapest_row_wins_not_the_largest_batch_that_pays():
    table = {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.0, 16: 6.0, 32: 9.6}  # 8 rows at 0.25 each, 16 at 0.375, 32 at 0.3
    assert measured_batch_size(costs_of(table)) == 8


def test_a_saving_inside_the_margin_keeps_batch_one():
    share = PAYING_ROW_SHARE + 0.05
    assert measured_batch_size(lambda size: 1.0 if size == 1 else share * size) == 1
    share = PAYING_ROW_SHARE - 0.05
    assert measured_batch_size(lambda size: 1.0 if size == 1 else share * size) == 2  # ties to the smaller B


def test_a_non_monotone_curve_as_llama_cpp_measures_it():
    # a row of 8 dearer than a row of 4 (another kernel path), 16 the cheapest: the shape of
    # the default target's costs on a 2-core AVX512 CPU (its 32-row cost made dearer per row than 16)
    table = {1: 1.0, 2: 1.73, 4: 2.89, 8: 7.30, 16: 9.0, 32: 20.0}
    assert measured_batch_size(costs_of(table)) == 16


@given(st.lists(st.floats(0.01, 100.0), min_size=len(BATCH_SIZES), max_size=len(BATCH_SIZES)))
def test_the_choice_pays_by_the_margin_and_no_size_has_a_cheaper_row(values):
    table = dict(zip(BATCH_SIZES, values))
    chosen = measured_batch_size(costs_of(table))
    assert chosen in BATCH_SIZES
    if chosen != 1:
        assert table[chosen] <= PAYING_ROW_SHARE * chosen * table[1]
        assert all(table[chosen] / chosen <= table[size] / size for size in BATCH_SIZES)
    else:  # the cheapest row does not pay by the margin, so no dearer one does
        assert all(table[size] > PAYING_ROW_SHARE * size * table[1] for size in BATCH_SIZES if size != 1)


@pytest.mark.parametrize("alone", [1e-4, 1.0, 1e3])
def test_the_choice_does_not_depend_on_the_unit_of_time(alone):
    table = {1: 1.0, 2: 1.9, 4: 3.0, 8: 5.0, 16: 12.0, 32: 30.0}
    assert measured_batch_size(lambda size: alone * table[size]) == 8
