"""Write the worked examples the server adds for the built-in schemas and tools (``schemas/examples/builtin.json``).

    python -m structspec.demo.worked_examples            # rewrite the shipped file
    python -m structspec.demo.worked_examples --check    # exit 1 if the shipped file differs

The examples come from the synthetic corpus with a fixed seed different from the benchmark's
(serving examples are never benchmark items); the engine reads the file, never the corpus.

What makes a base model (Gemma 3 270M) copy from the input rather than from the examples
(measured as the copy rate of ``structspec bench decode``):
- **Varied examples.** Each schema's examples are picked one by one, each the candidate that
  differs most from those already picked (other enum values, another number of list items,
  another document style), so no single example's values look like "the answer".
- **Prose taken from the input.** A free-text field (a summary, notes, a description) is, in
  the examples, the sentence of the example's own document that says the most of it: the
  examples show that every value, prose included, comes from the document. A paraphrase
  there teaches the model to write the example's paraphrase again.
- **Quiet optional prose.** A free-text field that a document may not hold (``QUIET``: an invoice's
  notes) is, in the first ``quiet_examples`` examples, empty, and the sentences that would fill it are
  cut from their documents: a document that says nothing of it, and an output that says nothing
  either. Shown a note, a base model writes that note into documents that have none (on held-out
  invoices, Gemma 3 270M wrote the first example's note into 28 of 30 outputs; quiet, none).
"""

from __future__ import annotations

import json
import random
import re
import sys
from typing import Any

from structspec.demo.corpus import NOTE_PARTS, Example, flatten, generate, triage_from_ticket
from structspec.prompts import compact_json
from structspec.schemas import BUILTIN_EXAMPLES_FILE, load_builtin_schemas, load_builtin_tools

EXAMPLES_SEED = 7331  # not BENCH_SEED
PER_SCHEMA = 4  # the most any profile asks for (``few_shot``); a profile takes the first n
CANDIDATES = 24  # generated per schema to pick the varied ones from
_WORD = re.compile(r"\w+")
# schema -> (free-text field a document may not hold, the sentences of the corpus's documents that fill it)
QUIET = {"invoice": ("notes", tuple(NOTE_PARTS["terms"] + NOTE_PARTS["extra"]))}
QUIET_EXAMPLES = 3  # of each such schema's examples, the first this many are quiet (the profiles show up to 3)


def _sentences(document: str) -> list[str]:
    """The document's sentences (lines first, then sentence ends), stripped."""
    parts = []
    for line in document.splitlines():
        parts += [p.strip() for p in re.split(r"(?<=[.!?])\s+", line) if p.strip()]
    return parts


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.casefold()))


def extractive(ex: Example, schema: dict[str, Any]) -> dict[str, Any]:
    """The example's value with each free-text field replaced by the document sentence sharing most words with it."""
    value = json.loads(json.dumps(ex.value))
    sentences = _sentences(ex.source)
    for key in ex.freetext_fields:
        prose = value.get(key)
        if not isinstance(prose, str) or not sentences:
            continue
        best = max(sentences, key=lambda s: (len(_words(s) & _words(prose)), -len(s)))
        limit = (schema.get("properties", {}).get(key) or {}).get("maxLength")
        value[key] = best[:limit] if limit else best
    return value


def quiet(value: dict[str, Any], source: str, key: str, sentences: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    """(value, source) with ``value[key]`` empty and each of ``sentences`` (and the value itself) cut from
    ``source``: a document that does not hold the field, and its output. Lines left empty are dropped."""
    cut = [str(value.get(key) or ""), *sentences]
    lines = []
    for line in source.splitlines():
        for sentence in cut:
            if sentence:
                line = line.replace(sentence, "")
        line = re.sub(r"\s{2,}", " ", line).strip()
        if line:
            lines.append(line)
    return {**value, key: ""}, "\n".join(lines)


def _signature(value: dict[str, Any], source: str) -> set[str]:
    """What makes two examples look alike: short (enum-like) values, list lengths, the document's first word."""
    sig = {f"first={(source.split() or [''])[0]}"}
    for key, leaf in flatten(value).items():
        if isinstance(leaf, str) and len(leaf) <= 12 or isinstance(leaf, bool):
            sig.add(f"{key.split('.')[-1]}={leaf}")
    for key, leaf in value.items():
        if isinstance(leaf, list):
            sig.add(f"{key}#={len(leaf)}")
    return sig


def varied(candidates: list[tuple[dict[str, Any], str]], n: int) -> list[tuple[dict[str, Any], str]]:
    """``n`` of (value, source), greedily: each the one sharing the fewest signature items with those picked."""
    picked: list[tuple[dict[str, Any], str]] = []
    seen: set[str] = set()
    pool = list(candidates)
    while pool and len(picked) < n:
        best = min(range(len(pool)), key=lambda i: (len(_signature(*pool[i]) & seen), i))
        value, source = pool.pop(best)
        picked.append((value, source))
        seen |= _signature(value, source)
    return picked


def build(quiet_examples: int = QUIET_EXAMPLES) -> dict:
    """The examples file's content; ``quiet_examples``: how many of each ``QUIET`` schema's first examples are quiet."""
    schemas = load_builtin_schemas()
    candidates: dict[str, list[tuple[dict[str, Any], str]]] = {name: [] for name in schemas}
    per_tool: dict[str, list[tuple[dict[str, Any], str]]] = {t["function"]["name"]: [] for t in load_builtin_tools()}
    r = random.Random(EXAMPLES_SEED)
    for ex in generate(EXAMPLES_SEED, 1200, toolcall_share=0.5):
        if ex.task == "toolcall":
            bucket = per_tool.get(ex.value["name"])
            if bucket is not None and len(bucket) < CANDIDATES:
                bucket.append((ex.value, ex.source))
            continue
        if ex.schema_name == "support_ticket" and len(candidates["ticket_triage"]) < CANDIDATES:
            triage = triage_from_ticket(ex, r)
            candidates["ticket_triage"].append((triage.value, triage.source))
        bucket = candidates.get(ex.schema_name)
        if bucket is not None and len(bucket) < CANDIDATES:
            bucket.append((extractive(ex, schemas[ex.schema_name]), ex.source))
    render = lambda picks: [{"text": source, "output": compact_json(value)} for value, source in picks]  # noqa: E731
    picked = {name: varied(items, PER_SCHEMA) for name, items in candidates.items()}
    for name, (key, sentences) in QUIET.items():
        picked[name] = [quiet(*pick, key, sentences) if i < quiet_examples else pick
                        for i, pick in enumerate(picked[name])]
    return {"seed": EXAMPLES_SEED,
            "schemas": {name: render(picks) for name, picks in picked.items()},
            "tools": {name: render(varied(items, PER_SCHEMA)) for name, items in per_tool.items()}}


def render() -> str:
    return json.dumps(build(), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        same = BUILTIN_EXAMPLES_FILE.read_text() == text
        print("up to date" if same else f"{BUILTIN_EXAMPLES_FILE} differs from what the generator writes")
        return 0 if same else 1
    BUILTIN_EXAMPLES_FILE.parent.mkdir(parents=True, exist_ok=True)
    BUILTIN_EXAMPLES_FILE.write_text(text)
    print(f"wrote {BUILTIN_EXAMPLES_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
