"""Adversarial (lazy output): returns at once a tensor whose values are only computed, on the CPU, when it is
copied off the GPU; a timer around the call sees nothing. Expected: not credible (no kernel in the timed
calls) or wrong."""
import torch


class Lazy(torch.Tensor):
    @staticmethod
    def __new__(cls, x, y):
        t = torch.Tensor._make_subclass(cls, torch.empty_like(x))
        t._x, t._y = x, y
        return t

    def detach(self):
        return self

    def to(self, *args, **kwargs):
        return (self._x.cpu() + self._y.cpu()).to(*args, **kwargs)


def add(x, y):
    return Lazy(x, y)
