"""Triton's CPU interpreter lets a kernel read any module-level global; the GPU compiler accepts only
tl.constexpr globals (and modules, other jitted functions). CI runs the kernels in the interpreter
only, so this checks every kernel in labs/ for globals the GPU would refuse."""

import dis
import importlib
import pkgutil
import types

import triton
import triton.language as tl

import labs

try:  # under TRITON_INTERPRET=1, @triton.jit gives an InterpretedFunction
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # pragma: no cover - older Triton
    InterpretedFunction = triton.runtime.jit.JITFunction
JIT = (triton.runtime.jit.JITFunction, InterpretedFunction)


def lab_modules():
    """Every module under labs/, packages walked (the engine, each lab's kernels.py, ...)."""
    for info in pkgutil.walk_packages(labs.__path__, prefix="labs."):
        if info.name.endswith(("__main__", ".worker")):  # the CLI and the torchrun worker run on import
            continue
        yield importlib.import_module(info.name)


def lab_kernels():
    for module in lab_modules():
        for name, obj in vars(module).items():
            if isinstance(obj, JIT) and obj.fn.__module__ == module.__name__:
                yield f"{module.__name__}.{name}", obj


def globals_read(fn) -> set:
    """Names the function's code (nested code included) loads from its module's globals: the LOAD_GLOBAL
    instructions only (co_names also lists attribute names such as `.T`, which are not globals even when the
    module happens to hold a global of that name)."""
    names, stack = set(), [fn.__code__]
    while stack:
        code = stack.pop()
        names.update(i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME"))
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return {n for n in names if n in fn.__globals__}


CONSTEXPR_FUNCTION = tuple(filter(None, [getattr(triton.runtime.jit, "ConstexprFunction", None)]))


def allowed(value) -> bool:
    """Modules, constexprs, jitted functions, the language's builtins (a Gluon kernel may keep one under a name
    of its own, e.g. tma_load for whichever of async_copy_global_to_shared / async_load this Triton has) and
    constexpr functions (evaluated while compiling)."""
    return isinstance(value, (types.ModuleType, tl.constexpr) + JIT + CONSTEXPR_FUNCTION) \
        or getattr(value, "__triton_builtin__", False) is True


def test_every_kernel_reads_only_globals_the_gpu_compiler_accepts():
    kernels = dict(lab_kernels())
    assert len(kernels) >= 10  # the labs' kernels were found
    bad = {f"{where}: {name} = {fn.fn.__globals__[name]!r}"
           for where, fn in kernels.items() for name in globals_read(fn.fn)
           if not allowed(fn.fn.__globals__[name])}
    assert not bad, "make these tl.constexpr(...) or pass them as arguments: " + "; ".join(sorted(bad))


def test_the_check_catches_a_plain_global():
    source = "import triton\nimport triton.language as tl\nFACTOR = 3\n" \
             "@triton.jit\ndef k(x_ptr):\n    tl.store(x_ptr, tl.load(x_ptr) * FACTOR)\n"
    namespace = {"__name__": "probe_module"}
    exec(compile(source, "probe_module", "exec"), namespace)  # noqa: S102 - a fixed test snippet
    kernel = namespace["k"]
    assert "FACTOR" in globals_read(kernel.fn) and not allowed(namespace["FACTOR"])


def test_a_plain_python_function_is_no_builtin():
    def helper(x):
        return x

    assert not allowed(helper) and allowed(tl.load)


def test_attribute_names_are_not_globals():
    def kernel(x):
        return x.T + LIMIT  # noqa: F821 - set below, for the test's length only

    # a module global that shares its name with the attribute, and one the kernel really reads
    kernel.__globals__.update(T=object(), LIMIT=4)
    try:
        assert globals_read(kernel) == {"LIMIT"}
    finally:
        del kernel.__globals__["T"], kernel.__globals__["LIMIT"]
