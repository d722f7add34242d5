"""The README's Python client example runs as written (against a server on the fake engine)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from tests.service.fakes import FakeEngine
from tests.service.harness import ServerThread, settings_for

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_using_it_example_runs(tmp_path: Path) -> None:
    section = README.read_text().split("## Using it", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    assert 'Client("localhost:50051")' in code
    out = io.StringIO()
    with ServerThread(settings_for(tmp_path), FakeEngine()) as st, contextlib.redirect_stdout(out):
        exec(compile(code.replace("localhost:50051", st.target), "README.md", "exec"), {"__name__": "readme"})
    lines = out.getvalue().splitlines()
    assert len(lines[0].split()) >= 2  # name and email of the Contact
    assert "invoice_number" in lines[1]  # the registered invoice schema's keys
    assert any(line.startswith("invoice ") for line in lines[2:])
