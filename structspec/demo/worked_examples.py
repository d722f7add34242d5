"""Write the worked examples the server adds for the built-in schemas and tools (``schemas/examples/builtin.json``).

    python -m structspec.demo.worked_examples            # rewrite the shipped file
    python -m structspec.demo.worked_examples --check    # exit 1 if the shipped file differs

The examples come from the synthetic corpus with a fixed seed different from the benchmark's
(serving examples are never benchmark items); the engine reads the file, never the corpus.
"""

from __future__ import annotations

import json
import random
import sys

from structspec.demo.corpus import generate, triage_from_ticket
from structspec.schemas import BUILTIN_EXAMPLES_FILE, load_builtin_schemas, load_builtin_tools

EXAMPLES_SEED = 7331  # not BENCH_SEED
PER_SCHEMA = 4  # the most any profile asks for (``few_shot``); a profile takes the first n


def build() -> dict:
    schemas = load_builtin_schemas()
    per_schema: dict[str, list[dict[str, str]]] = {name: [] for name in schemas}
    per_tool: dict[str, list[dict[str, str]]] = {t["function"]["name"]: [] for t in load_builtin_tools()}
    r = random.Random(EXAMPLES_SEED)
    for ex in generate(EXAMPLES_SEED, 400, toolcall_share=0.5):
        if ex.schema_name == "support_ticket" and len(per_schema.get("ticket_triage", [None] * PER_SCHEMA)) < PER_SCHEMA:
            triage = triage_from_ticket(ex, r)
            per_schema["ticket_triage"].append({"text": triage.source, "output": triage.output})
        bucket = per_tool.get(ex.value["name"]) if ex.task == "toolcall" else per_schema.get(ex.schema_name)
        if bucket is not None and len(bucket) < PER_SCHEMA:
            bucket.append({"text": ex.source, "output": ex.output})
    return {"seed": EXAMPLES_SEED, "schemas": per_schema, "tools": per_tool}


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
