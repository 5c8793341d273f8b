"""How `make test`'s lanes order and report their modules (a plugin of tests/conftest.py).

- Order: modules that boot VMs or drive a live server first, those with the most such tests
  first; the others after them in their own order (not by their count of tests: some that
  are not marked take tens of seconds for one or two tests, e.g. tests/guest/
  test_agent_wheel.py and tests/server/preview/test_preview_browser.py, and would end the run),
  which ends on tests/server's store, volume and web modules and tests/templatespec, each a
  few seconds to ~20 s (tests/server/api/, the API as a whole, sorts first: its property
  test takes ~90 s). `make pytest` runs the parallel lane with
  `--dist loadscope --no-loadscope-reorder`, so a worker takes modules in this order, and the
  run ends on quick modules that fill both workers to the end rather than on one long VM
  module with the other worker idle (xdist's own reorder, most tests first, put the VM
  modules of one or two tests, the slowest per test, last).
- `soak`: a test of a module's `MAKE_TEST_MODE` (test name -> host mode) in another host mode
  is marked `soak`: `make test` runs it in that one mode, `make soak` in every mode. Modules
  also mark `soak` themselves a variant whose every check another test in `make test` makes
  (each says which: e.g. the E2B async client of tests/e2e/test_e2b_sdk_versions.py).
- Report: the slowest modules by the time their tests took (setup, call and teardown; on
  the workers, so two workers' modules add up to about twice the lane's wall time)."""

from __future__ import annotations

from collections import defaultdict

import pytest

#: How many modules the report names.
REPORT_MODULES = 20

_HEAVY = ("vm", "e2e", "cluster")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _weight(items: list[pytest.Item]) -> int:
    """How many of a module's tests boot VMs or drive a live server."""
    return sum(1 for i in items if any(i.get_closest_marker(m) for m in _HEAVY))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        modes = getattr(getattr(item, "module", None), "MAKE_TEST_MODE", None)
        callspec = getattr(item, "callspec", None)
        if modes and callspec is not None and "host_mode" in callspec.params:
            keep = modes.get(getattr(item, "originalname", item.name))
            if keep is not None and callspec.params["host_mode"] != keep:
                item.add_marker(pytest.mark.soak)
    by_module: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_module[_module(item.nodeid)].append(item)
    # Stable: modules of equal weight keep their collection order, tests theirs.
    order = sorted(by_module, key=lambda m: -_weight(by_module[m]))
    items[:] = [item for m in order for item in by_module[m]]


_took: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _took[_module(report.nodeid)] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _took or hasattr(terminalreporter.config, "workerinput"):
        return
    slowest = sorted(_took.items(), key=lambda kv: -kv[1])[:REPORT_MODULES]
    terminalreporter.write_sep("=", f"slowest {len(slowest)} modules (setup + call + "
                               f"teardown, {sum(_took.values()):.0f} s in all modules)")
    for module, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}s {module}")
