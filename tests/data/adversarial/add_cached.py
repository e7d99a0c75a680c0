"""Adversarial (cached output): computes once per input shape and hands the same tensor back afterwards, as a
benchmark that reuses its inputs would never notice. Expected: wrong (every timed call has fresh inputs)."""
import torch

_SEEN = {}


def add(x, y):
    key = (tuple(x.shape), x.device.type)
    if key not in _SEEN:
        _SEEN[key] = x + y
    return _SEEN[key]
