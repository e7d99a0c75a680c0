"""Adversarial (inputs modified): zeroes y, then returns a copy of x, which equals x + y for a judge that
computes its reference after the call from the same tensors. Expected: wrong (the references come from the
judge's own copies of the inputs)."""
import torch


def add(x, y):
    y.zero_()
    return x.clone()
