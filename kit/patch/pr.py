"""PR 63155 applied in-process by editing the functions it changes, and taken back: one mechanism for any codebase.

The PR changes a few lines in a few functions. A `Codebase` lists them as
`Target`s: where each is defined, its parameters in vLLM 0.33.0, the PR's
edits as `kit.patch.source.Hunk`s, and what they change. `kit.patch.vllm`
holds the installed vLLM's list, `kit.patch.replica` the replica's, which are
the same functions in the same shape. `apply(policy)` finds every target,
checks its parameters, rewrites it from its own source with its hunks
(`kit.patch.source.rewrite`), and installs the rewrites as one
`kit.patch.install.Patch`: all or nothing, a Ctrl-C held back until the patch
is wholly on or wholly off. A module-level function (`graph_capture`) is also
installed in every loaded module that imported it by name, and `revert()`
puts the original back there too, in modules imported while the patch was on.

The edited model states hand the replay graphs a stream by
`kit.patch.policy.replay_stream` under the patch's `policy`, and each decision
is kept in `PrPatch.decisions`. `patched(policy)` is the patch for a `with`
block; blocks may overlap, in one thread or several (vLLM's microbatch
threads): the innermost sets the policy, its end puts back the one before,
and the patch stays on until the last block ends.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kit.errors import KitError
from kit.patch.install import Patch, interrupts_deferred, qualified_name
from kit.patch.policy import check_policy, has_early_aux, replay_stream
from kit.patch.source import Hunk, Rewrite, rewrite


@dataclass(frozen=True)
class Target:
    """One function the PR changes: where it is defined, its 0.33.0 parameters, the edits and what they do."""

    module: str
    qualname: str
    params: tuple[str, ...]
    hunks: tuple[Hunk, ...]
    change: str
    adds: tuple[str, ...] = ()  # attributes the PR adds to the function's class, None until the function sets them

    @property
    def where(self) -> str:
        return f"{self.module}.{self.qualname}"

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def in_module(self) -> bool:
        """A module-level function, which other modules may have imported by name."""
        return "." not in self.qualname


@dataclass(frozen=True)
class ReplayDecision:
    """Which stream one model state gave its replay graphs, and why."""

    model_state: str
    early_aux: bool | None  # None: the aux layer ids or the replay start could not be read
    shared: bool
    reason: str


_EARLY_AUX = {
    None: "aux layer ids or replay start not found",
    True: "aux hidden states before the replay layers",
    False: "no aux hidden state before the replay layers",
}


class PrPatch(Patch):
    """PR 63155 applied to one codebase: the `Patch` of its rewrites, what they change, and the stream decisions.

    `revert()` (or leaving the `with` block) takes it back.
    """

    def __init__(self, codebase: Codebase, policy: str) -> None:
        super().__init__(f"PR 63155 on {codebase.label()}", [])  # the replacements follow the rewrites
        self.codebase = codebase
        self.policy = policy
        self.rewrites: list[Rewrite] = []  # one per target, in the codebase's order
        self.installed: dict[str, list[str]] = {}  # target -> the modules or classes it was installed in
        self.decisions: list[ReplayDecision] = []

    def revert(self) -> None:
        """Put back every original object, also in modules that imported one while the patch was on."""
        codebase = self.codebase
        with codebase._lock, interrupts_deferred():
            super().revert()
            for target, rw in zip(codebase.targets, self.rewrites, strict=True):
                if target.in_module:
                    for module in _modules_holding(rw.function, target.name):
                        setattr(module, target.name, rw.original)
            if codebase._applied is self:
                codebase._applied = None

    def apply(self) -> PrPatch:
        """Install the rewrites: `Codebase.apply()` does it the first time, this again after a revert."""
        return self.codebase._install(self)

    def table(self) -> pd.DataFrame:
        """One row per function the PR changes: where it is defined, where it was installed, what changes."""
        return pd.DataFrame(
            {
                "function": target.where,
                "defined in": _defined_in(rw.original),
                "installed in": ", ".join(self.installed.get(target.where, [])),
                "change": target.change,
            }
            for target, rw in zip(self.codebase.targets, self.rewrites, strict=True)
        )

    def diff(self) -> str:
        """The PR's change to each function, as one unified diff (also once reverted)."""
        return "\n".join(rw.diff() for rw in self.rewrites)

    def _replay_stream(self, model_state: Any, stream: Any) -> Any:
        """The stream a model state hands its replay graphs under this patch's policy; the decision is kept."""
        early = has_early_aux(model_state)
        chosen = replay_stream(self.policy, early, stream)
        shared = chosen is not None and stream is not None
        outcome = "the model graphs' stream" if shared else "a stream of their own"
        reason = f"policy {self.policy}, {_EARLY_AUX[early]}: {outcome}"
        self.decisions.append(ReplayDecision(type(model_state).__qualname__, early, shared, reason))
        return chosen

    def __enter__(self) -> PrPatch:
        return self  # applied already, by `Codebase.apply()`

    def __repr__(self) -> str:
        state = "applied" if self.applied else "reverted"
        return f"<PrPatch PR 63155 on {self.codebase.label()} ({self.policy}): {state}>"


class Codebase:
    """The functions PR 63155 changes in one codebase, and the one patch applied to them at a time.

    `package` is imported first; `label()` names the codebase in messages
    (`vLLM 0.33.0`); `check(owners)` may refuse what the targets alone do not
    show, before anything is installed (`owners`: each target's class or
    module, by qualname).
    """

    def __init__(
        self,
        package: str,
        label: Callable[[], str],
        targets: tuple[Target, ...],
        *,
        check: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.package = package
        self.label = label
        self.targets = targets
        self._check = check
        self._lock = threading.RLock()
        self._applied: PrPatch | None = None
        self._blocks = 0  # `patched()` blocks open now, in any thread
        self._applied_before = False  # whether the patch was on when the first of them began

    def rewrites(self, handle: PrPatch | None = None) -> tuple[list[Rewrite], dict[str, Any]]:
        """The PR's version of every target, compiled but not installed, and each target's owner by qualname.

        The new lines' `replay_stream(model_state, stream)` is `handle`'s; without one it refuses to run.
        """
        self._import(self.package)
        found = [self._resolve(target) for target in self.targets]
        decide = handle._replay_stream if handle is not None else _dry_run_replay_stream
        done = []
        for target, (owner, function) in zip(self.targets, found, strict=True):
            names = {"replay_stream": decide} if "replay_stream(" in str(target.hunks) else None
            cls = owner if isinstance(owner, type) else None
            done.append(rewrite(function, target.hunks, where=target.where, label=self.label(), owner=cls, names=names))
        return done, {target.qualname: owner for target, (owner, _) in zip(self.targets, found, strict=True)}

    def diff(self) -> str:
        """What `apply()` would change, as a unified diff; installs nothing."""
        return "\n".join(rw.diff() for rw in self.rewrites()[0])

    def apply(self, policy: str = "pr") -> PrPatch:
        """Apply the PR; applying again returns the patch already applied, with `policy` set."""
        check_policy(policy)
        with self._lock:
            if self._applied is not None:
                self._applied.policy = policy
                return self._applied
            handle = PrPatch(self, policy)
            handle.rewrites, owners = self.rewrites(handle)
            if self._check is not None:
                self._check(owners)
            self._place(handle, owners)
            return self._install(handle)

    def revert(self) -> None:
        """Take back the applied patch, if any, whatever `patched()` blocks are open."""
        with self._lock:
            if self._applied is not None:
                self._applied.revert()

    def is_applied(self) -> bool:
        return self._applied is not None and self._applied.applied

    @contextlib.contextmanager
    def patched(self, policy: str = "pr") -> Iterator[PrPatch]:
        """The patch applied for the block, reverted after it whatever happens inside (unless it was on before).

        Blocks may overlap, in one thread or several: the patch stays on until
        the last open block ends. The policy is the patch's: the innermost
        block sets it, and its end puts back the one before.
        """
        check_policy(policy)
        handle = None
        try:
            # A Ctrl-C held back while applying is raised as this `with` ends: the block is open by then.
            with self._lock, interrupts_deferred():
                if self._blocks == 0:
                    self._applied_before = self.is_applied()
                previous = self._applied.policy if self._applied is not None else policy
                handle = self.apply(policy)
                self._blocks += 1
            yield handle
        finally:
            if handle is not None:
                with self._lock, interrupts_deferred():
                    self._blocks -= 1
                    handle.policy = previous
                    if self._blocks == 0 and not self._applied_before:
                        self.revert()

    def _install(self, handle: PrPatch) -> PrPatch:
        """Apply `handle`'s replacements and make it the applied patch; a Ctrl-C meanwhile waits for both."""
        with self._lock, interrupts_deferred():
            if self._applied is not None and self._applied is not handle:
                raise KitError(f"{self._applied!r} is on: revert it first")
            Patch.apply(handle)  # the attribute replacements themselves (PrPatch.apply comes back here)
            self._applied = handle
            return handle

    def _place(self, handle: PrPatch, owners: dict[str, Any]) -> None:
        """Where each rewrite goes, where its original is: `handle`'s replacements, additions and `installed`."""
        for target, rw in zip(self.targets, handle.rewrites, strict=True):
            owner = owners[target.qualname]
            places = [owner]
            if target.in_module:
                places += [m for m in _modules_holding(rw.original, target.name) if m is not owner]
            handle.replacements += [(place, target.name, rw.function) for place in places]
            handle.additions += [(owner, attr, None) for attr in target.adds]
            handle.installed[target.where] = [qualified_name(place) for place in places]

    def _import(self, name: str) -> Any:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            raise KitError(f"unsupported {self.label()}: cannot import {name} ({exc}); nothing was patched") from None

    def _resolve(self, target: Target) -> tuple[Any, Any]:
        """The target's owner (class or module) and its function, or a one-line refusal."""
        label = self.label()
        owner: Any = self._import(target.module)
        *classes, name = target.qualname.split(".")
        for cls in classes:
            owner = getattr(owner, cls, None)
            if owner is None:
                raise KitError(f"unsupported {label}: {target.module}.{cls} is missing; nothing was patched")
        function = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if function is None:
            raise KitError(f"unsupported {label}: {target.where} is missing; nothing was patched")
        params = tuple(inspect.signature(function).parameters)
        if "stream" in params:
            raise KitError(f"{label} already has PR 63155's change ({target.where} takes a stream); nothing to patch")
        if params != target.params:
            raise KitError(
                f"unsupported {label}: {target.where}{_args(params)} differs from "
                f"0.33.0's {target.qualname}{_args(target.params)}; nothing was patched"
            )
        return owner, function


def _dry_run_replay_stream(model_state: Any, stream: Any) -> Any:
    raise KitError("this is a dry-run rewrite (Codebase.rewrites without a patch); apply() installs a usable one")


def _modules_holding(obj: Any, name: str) -> list[Any]:
    """Every loaded module with `obj` as its attribute `name` (those that imported it by name)."""
    return [m for m in list(sys.modules.values()) if getattr(m, "__dict__", {}).get(name) is obj]


def _defined_in(function: Any) -> str:
    """`package/path/to/module.py:line` of a function's definition, from its top-level package's folder."""
    code = inspect.unwrap(function).__code__
    package = sys.modules[function.__module__.partition(".")[0]]
    root = Path(package.__file__).parent.parent
    path = Path(code.co_filename)
    return f"{path.relative_to(root) if path.is_relative_to(root) else path}:{code.co_firstlineno}"


def _args(params: tuple[str, ...]) -> str:
    return f"({', '.join(params)})"
