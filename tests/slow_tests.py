"""The tests the fast subset (``pytest -m "not slow"``) leaves out, measured rather than guessed.

``slow_tests.txt`` lists them: test ids (``path::name``, a parametrized test by its name alone) and whole modules
(``path``, where a fixture of the module's costs the time, whichever of its tests runs first). The conftest marks
each ``slow``; tests marked ``@pytest.mark.slow`` in their code are slow too. Regenerate the list from a run of
the whole suite with every duration printed:

    pytest -q --durations=0 --durations-min=0 > durations.log
    python -m tests.slow_tests durations.log > tests/slow_tests.txt

A test is slow when its own setup, call and teardown take ``TEST_S`` or more; a module when its tests' setups
together take ``MODULE_SETUP_S`` or more (a module-scoped model, server or trained fixture).
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

LIST = Path(__file__).with_name("slow_tests.txt")
TEST_S = 1.5
MODULE_SETUP_S = 4.0
_LINE = re.compile(r"^(?P<s>\d+(?:\.\d+)?)s (?P<when>setup|call|teardown)\s+(?P<node>\S.*)$")


def listed() -> tuple[set[str], set[str]]:
    """(modules, test ids without parameters) in the list; empty where there is none."""
    modules, tests = set(), set()
    if LIST.is_file():
        for line in LIST.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                (tests if "::" in line else modules).add(line)
    return modules, tests


def is_listed(nodeid: str, modules: set[str], tests: set[str]) -> bool:
    return nodeid.split("::", 1)[0] in modules or nodeid.split("[", 1)[0] in tests


def measured(lines: list[str]) -> tuple[list[str], list[str]]:
    """(slow modules, slow test ids) from a run's duration lines."""
    per_test: dict[str, float] = defaultdict(float)
    setups: dict[str, float] = defaultdict(float)
    for line in lines:
        m = _LINE.match(line.strip())
        if m is None:
            continue
        test = m["node"].split("[", 1)[0]
        per_test[test] += float(m["s"])
        if m["when"] == "setup":
            setups[test.split("::", 1)[0]] += float(m["s"])
    modules = sorted(mod for mod, s in setups.items() if s >= MODULE_SETUP_S)
    tests = sorted(t for t, s in per_test.items() if s >= TEST_S and t.split("::", 1)[0] not in modules)
    return modules, tests


def main(argv: list[str]) -> int:
    modules, tests = measured(Path(argv[1]).read_text().splitlines())
    print(f"# measured by tests/slow_tests.py: modules whose setups take {MODULE_SETUP_S:g} s or more, then tests of "
          f"{TEST_S:g} s or more")
    print("\n".join([*modules, *tests]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
