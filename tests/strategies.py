"""Hypothesis strategies shared by the tests of the gateway's and the processor's input checks."""

from __future__ import annotations

from hypothesis import strategies as st

# Integers a JSON producer can write: orjson refuses anything beyond 64 bits ("Integer exceeds
# 64-bit range"), so an unbounded st.integers() fails the test inside its own strategy at random.
json_ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)

# Any JSON value orjson can write: what a hostile or broken producer may put in a field.
json_values = st.recursive(
    st.none() | st.booleans() | json_ints | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=12,
)
