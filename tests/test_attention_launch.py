"""The launch helpers' unwrapping of Triton's descriptor-encoding launcher (labs/attention/launch.py), on CPU: a
stand-in shaped like Triton 3.6's wrapper (a closure over the C launcher, the descriptors' positions and their
metadata, with make_tensordesc_arg among its globals), and plain functions that must be left alone."""

from labs.attention import launch

ENCODED = []


def make_tensordesc_arg(arg, meta):  # the stand-in's encoder: what Triton would turn a descriptor into
    ENCODED.append(arg)
    return [f"map({arg},{meta})", 7, 8]


def _wrapper_like_triton():
    def launcher(*args):
        return args
    tensordesc_indices = {0, 2}
    tensordesc_meta = ["m0", "m2"]

    def inner(*args):  # the names Triton's wrap_handle_tensordesc closes over
        return launcher, tensordesc_indices, tensordesc_meta, args
    return launcher, inner


def test_unwraps_a_descriptor_launcher_and_encodes_each_descriptor_once():
    launcher, inner = _wrapper_like_triton()
    found = launch._descriptor_encoder(inner)
    assert found is not None and found[0] is launcher
    ENCODED.clear()
    params = found[1](["qdesc", 5, "kdesc", 9])
    assert params == ("map(qdesc,m0)", 7, 8, 5, "map(kdesc,m2)", 7, 8, 9)
    assert ENCODED == ["qdesc", "kdesc"]


def test_leaves_other_launchers_alone():
    assert launch._descriptor_encoder(print) is None  # a C function: no descriptors to encode
    assert launch._descriptor_encoder(lambda *a: a) is None  # no closure
    x = 1
    assert launch._descriptor_encoder(lambda *a: (a, x)) is None  # a closure without Triton's names
