"""The grading worker's own ``RequestTiming`` (it may not import servelab) agrees with the library's."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from servelab_instructor.grader import _worker
from servelab.metrics.latency import RequestTiming

SAMPLES = [  # (arrival, first_scheduled, emit_times, finish, prompt_tokens or None for the default)
    (0.0, 0.0, (0.0,), 0.0, None),  # a single token, emitted on arrival
    (1.0, 1.5, (2.0,), 2.25, 7),  # a single token: no TPOT
    (0.0, 0.1, (0.3, 0.4), 0.4, None),  # two tokens
    (10.0, 10.2, (10.5, 10.51, 10.9, 12.0), 12.5, 128),  # uneven gaps
    (-2.0, -1.0, (0.0, 0.0, 0.0), 1.0, 0),  # negative instants and repeated emits
]
PROPERTIES = ("output_tokens", "queue_delay", "ttft", "itl", "tpot", "e2e")


def _properties(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if isinstance(value, property)}


def test_fields_have_the_same_names_types_order_and_defaults():
    ours, theirs = dataclasses.fields(_worker.RequestTiming), dataclasses.fields(RequestTiming)
    assert [(f.name, f.default) for f in ours] == [(f.name, f.default) for f in theirs]
    assert list(typing.get_type_hints(_worker.RequestTiming).items()) == \
        list(typing.get_type_hints(RequestTiming).items())
    assert _worker.RequestTiming.__dataclass_params__.frozen and RequestTiming.__dataclass_params__.frozen


def test_both_have_the_same_properties():
    assert _properties(_worker.RequestTiming) == _properties(RequestTiming) == set(PROPERTIES)


@pytest.mark.parametrize("sample", SAMPLES)
def test_properties_give_equal_values(sample):
    *fields, prompt_tokens = sample
    extra = {} if prompt_tokens is None else {"prompt_tokens": prompt_tokens}
    ours, theirs = _worker.RequestTiming(*fields, **extra), RequestTiming(*fields, **extra)
    assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)
    assert {p: getattr(ours, p) for p in PROPERTIES} == {p: getattr(theirs, p) for p in PROPERTIES}


@pytest.mark.parametrize("sample", SAMPLES)
def test_a_library_timing_crosses_the_wire_as_the_worker_s(sample):
    *fields, prompt_tokens = sample
    theirs = RequestTiming(*fields, **({} if prompt_tokens is None else {"prompt_tokens": prompt_tokens}))
    ours = _worker.decode(_worker.encode(theirs))
    assert isinstance(ours, _worker.RequestTiming)
    assert {p: getattr(ours, p) for p in PROPERTIES} == {p: getattr(theirs, p) for p in PROPERTIES}
    assert _worker.decode(_worker.encode(ours), timing=RequestTiming) == theirs
