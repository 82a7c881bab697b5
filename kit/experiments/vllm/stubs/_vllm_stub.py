"""What every stub module here is made of: a module whose names are placeholders that raise when used.

`scripts/vllm_on_device.sh` copies a stub package onto the import path only
where the real package is missing. vLLM 0.33's capture path imports these
packages at module level (for servers, downloads, tokenizers, grammars) but
never calls into them. A stub answers every attribute with a placeholder
class, so `from aiohttp import ClientSession`, annotations, `isinstance`
checks, subclassing and pydantic fields work, and calling or instantiating one raises
`StubCalled` naming the stub and why it is there, except in a module or class
body (at import), where it makes an inert value (noted in
`IMPORT_TIME_VALUES`) for a module-level constant. Submodules
(`import openai_harmony.x`) are stubs too.

vLLM's compiled extensions (`vllm._C_stable_libtorch`, `vllm._moe_C_stable_libtorch`,
`vllm.cumem_allocator`, ...: every `.so` its wheel's RECORD lists, which the
bundle does not carry) are stood in the same way by `stub_extensions`: a
meta-path finder makes each an empty module, so `import vllm._C_stable_libtorch`
(which `vllm.platforms.cuda` does to register the kernels' ops) succeeds and
registers nothing, and anything taken from one raises `StubCalled` when called.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import sys
import types

_ROOTS: dict[str, str] = {}  # stub package -> why it is stood in


class StubCalled(RuntimeError):
    """Something on the run's path used a stubbed package: the stub's list in docs/vllm.md is wrong."""


IMPORT_TIME_VALUES: list[str] = []  # placeholders a module body made while being imported


class _Meta(type):
    def __call__(cls, *args, **kwargs):
        name = f"{cls.__module__}.{cls.__qualname__}"
        if not sys._getframe(1).f_code.co_flags & inspect.CO_OPTIMIZED:
            # A module or class body builds a constant or decorates with it at import
            # (vllm.parser.harmony's `AnyTextFormat()`, `@cute.jit`): an inert value, noted.
            IMPORT_TIME_VALUES.append(name)
            return object.__new__(cls)
        raise StubCalled(f"{name} was called, but it is a stub: {_why(cls.__module__)}")

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(cls.__module__, f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item):
        return cls

    def __get_pydantic_core_schema__(cls, source, handler):
        # A pydantic model with a field of a stubbed type (vllm.entrypoints' protocol types): any value.
        from pydantic_core import core_schema

        return core_schema.any_schema()


def _why(module: str) -> str:
    if module in _EXTENSIONS:
        return _EXTENSIONS[module]
    return _ROOTS.get(module.split(".")[0], "stood in for vLLM's capture path")


def _placeholder(module: str, name: str) -> type:
    return _Meta(name.rsplit(".", 1)[-1], (), {"__module__": module, "__qualname__": name})


def _module_getattr(module: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(module, name)

    return __getattr__


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes `root.any.submodule` a stub module, for every registered stub root."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in _ROOTS and "." in fullname:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        stub_module(module)


_FINDER = _Finder()


def stub_module(module: types.ModuleType) -> None:
    module.__getattr__ = _module_getattr(module.__name__)
    module.__path__ = getattr(module, "__path__", [])
    module.__vllm_stub__ = _why(module.__name__)


def install(name: str, why: str) -> None:
    """Make package `name` (being imported now) and all its submodules stubs; `why` says what it is for."""
    _ROOTS[name] = " ".join(why.split())
    stub_module(sys.modules[name])
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


# --- vLLM's compiled extensions ------------------------------------------------------------------

_EXTENSIONS: dict[str, str] = {}  # compiled extension module -> why it is stood in
EXTENSIONS_LOADED: list[str] = []  # the stood-in extensions imported in this process, in order
EXTENSION_WHY = (
    "a compiled extension of the vLLM wheel, not carried (the bundle is vLLM's Python sources); "
    "importing it registers no ops, and the capture path calls none of them"
)


class _ExtensionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes each registered compiled extension an empty module; with `shadow`, even where the real one exists."""

    shadow = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _EXTENSIONS:
            return None
        if not self.shadow and importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
            return None  # the real extension is here: use it
        return importlib.machinery.ModuleSpec(fullname, self, origin="stub")

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__getattr__ = _module_getattr(module.__name__)
        module.__vllm_stub__ = _why(module.__name__)
        module.__doc__ = f"Stub of {module.__name__}: {module.__vllm_stub__}."
        EXTENSIONS_LOADED.append(module.__name__)


_EXTENSION_FINDER = _ExtensionFinder()


def stub_extensions(names, why: str = EXTENSION_WHY, shadow: bool = False) -> None:
    """Stand in the compiled extension modules `names` (`vllm._C_stable_libtorch`, ...) where they are missing.

    `shadow=True` stands them in even where the real ones are installed (tests
    that emulate the GPU machine on a machine that has vLLM's wheel).
    """
    for name in names:
        _EXTENSIONS[name] = " ".join(why.split())
    _EXTENSION_FINDER.shadow = _EXTENSION_FINDER.shadow or shadow
    if _EXTENSION_FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _EXTENSION_FINDER)
