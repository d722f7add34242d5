"""The plain prompt format against plainer alternatives, for base models (no chat template), measured.

A *variant* is a wording of an extraction prompt (worked examples included); everything else is held fixed:
one engine, its grammar, greedy decoding, speculation off (greedy outputs do not depend on it), the same items
and the same worked examples. Per variant and workload the report counts outputs that *finished* (ended with
``stop``, not cut at ``max_tokens``), that are valid, and their field score (``WorkItem.score``: exact leaf
values against the truth).

Workloads: ``builtin`` (the demo corpus's held-out extraction documents with the server's shipped examples)
and three of this module's own, in styles and schemas the demo pair never saw, each with a worked example of its
own (``own_workload``): ``flight`` (a booking request in a sentence), ``recipe`` (a list of ingredients: where a
base model runs on inside an array) and ``order`` (a list of objects).

    python -m structspec.bench.prompt_formats --model gemma-3-270m --items 8 --json report.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from structspec.assembly import assemble_engine
from structspec.bench.text_table import aligned
from structspec.bench.workloads import WorkItem, build_workload
from structspec.chat_template import PlainPrompts, Prompt
from structspec.engine.api import ExtractionRequest
from structspec.engine.types import FinishReason, Outcome, SamplingParams, SpeculationMode
from structspec.models.loading import load_profile
from structspec.prompts import FewShotExample, compact_json, encode_prompt, extraction_prompt, schema_title


class InstructionPrompts(PlainPrompts):
    """``instruction``: an instruction line, the document, ``JSON:`` (no headings), examples as the same blocks."""

    def extraction(self, schema, text, instruction=None, examples=(), *, schema_id="", public=False) -> Prompt:
        def block(title: str, document: str, output: str = "") -> str:
            said = f"{instruction.strip()}\n" if instruction else ""
            return f"Extract the {title or 'data'} from this text as JSON.\n{said}{document.strip()}\nJSON:\n{output}"

        own = schema_title(schema, schema_id)
        prompt = "\n\n".join([*(block(ex.title or own, ex.text, ex.output) for ex in examples), block(own, text)])
        return Prompt(prompt, encode_prompt(self.tokenizer, prompt))


class FieldsPrompts(PlainPrompts):
    """``plain+fields``: the plain format with the schema's top-level fields named in its heading."""

    def extraction(self, schema, text, instruction=None, examples=(), *, schema_id="", public=False) -> Prompt:
        fields = ", ".join(schema.get("properties", {})) if isinstance(schema, dict) else ""
        said = f"Fields: {fields}.\n" + (instruction or "")
        prompt = extraction_prompt(schema, text, said.strip(), examples, schema_id)
        return Prompt(prompt, encode_prompt(self.tokenizer, prompt))


def label_prompts(tokenizer: Any) -> PlainPrompts:
    """``label``: the plain format with each output after a bare ``JSON:`` (``ModelProfile.plain_json_line``)."""
    return PlainPrompts(tokenizer, json_line="label")


VARIANTS: dict[str, Callable[[Any], PlainPrompts]] = {
    "plain": PlainPrompts, "label": label_prompts, "instruction": InstructionPrompts, "plain+fields": FieldsPrompts}

# The workloads of this module's own: a schema, a draw of its values, and a document that states them.
_NAMES = ("Ana Costa", "Bo Lindqvist", "Chidi Okafor", "Dana Weiss", "Emre Yilmaz", "Fiona Walsh", "Goran Petrov")
_CITIES = ("Lisbon", "Oslo", "Lagos", "Denver", "Izmir", "Cork", "Sofia", "Hanoi", "Perth", "Quito")
_DISHES = ("Lentil soup", "Fish tacos", "Mushroom risotto", "Chicken curry", "Greek salad", "Pancakes")
_INGREDIENTS = ("onion", "garlic", "rice", "lentils", "tomato", "lime", "butter", "flour", "eggs", "chicken",
                "mushrooms", "feta", "cucumber", "milk", "cumin", "cod")
_SKUS = ("AX-100", "BR-220", "CT-315", "DM-404", "EL-550", "FN-612", "GX-777")

OWN_SCHEMAS: dict[str, dict[str, Any]] = {
    "flight": {"title": "Flight booking", "type": "object", "additionalProperties": False,
               "required": ["passenger", "flight", "origin", "destination", "date", "seats", "cabin"],
               "properties": {"passenger": {"type": "string"}, "flight": {"type": "string"},
                              "origin": {"type": "string"}, "destination": {"type": "string"},
                              "date": {"type": "string", "format": "date"},
                              "seats": {"type": "integer", "minimum": 1, "maximum": 9},
                              "cabin": {"enum": ["economy", "business", "first"]}}},
    "recipe": {"title": "Recipe", "type": "object", "additionalProperties": False,
               "required": ["name", "servings", "minutes", "ingredients", "vegetarian"],
               "properties": {"name": {"type": "string"}, "servings": {"type": "integer"},
                              "minutes": {"type": "integer"},
                              "ingredients": {"type": "array", "items": {"type": "string"}},
                              "vegetarian": {"type": "boolean"}}},
    "order": {"title": "Order", "type": "object", "additionalProperties": False,
              "required": ["order_id", "customer", "lines"],
              "properties": {"order_id": {"type": "string"}, "customer": {"type": "string"},
                             "lines": {"type": "array", "items": {
                                 "type": "object", "additionalProperties": False, "required": ["sku", "quantity"],
                                 "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}}}}}},
}


def _draw(kind: str, r: random.Random) -> tuple[str, dict[str, Any]]:
    """One (document, truth) of ``kind``."""
    if kind == "flight":
        origin, destination = r.sample(_CITIES, 2)
        v: dict[str, Any] = {"passenger": r.choice(_NAMES), "flight": f"{r.choice(['TP', 'SK', 'LH', 'KL'])}{r.randint(100, 9999)}",
             "origin": origin, "destination": destination, "date": f"2027-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
             "seats": r.randint(1, 4), "cabin": r.choice(["economy", "business", "first"])}
        return (f"Hello, this is {v['passenger']}. Please book {v['seats']} {v['cabin']} seat(s) on flight "
                f"{v['flight']} from {origin} to {destination} on {v['date']}. Many thanks!"), v
    if kind == "recipe":
        v = {"name": r.choice(_DISHES), "servings": r.randint(2, 8), "minutes": r.choice([15, 20, 30, 45, 60]),
             "ingredients": r.sample(_INGREDIENTS, r.randint(2, 5)), "vegetarian": r.random() < 0.5}
        return (f"{v['name']} - serves {v['servings']}, ready in {v['minutes']} minutes. You will need "
                f"{', '.join(v['ingredients'])}. {'Vegetarian.' if v['vegetarian'] else 'Not vegetarian.'}"), v
    lines = [{"sku": s, "quantity": r.randint(1, 12)} for s in r.sample(_SKUS, r.randint(1, 3))]
    v = {"order_id": f"SO-{r.randint(10000, 99999)}", "customer": r.choice(_NAMES), "lines": lines}
    said = "; ".join(f"{x['quantity']} x {x['sku']}" for x in lines)
    return f"Order {v['order_id']} placed by {v['customer']}: {said}. Ship as soon as possible.", v


def own_workload(kind: str, n: int, seed: int = 11) -> list[WorkItem]:
    """``n`` items of ``kind`` (one of ``OWN_SCHEMAS``), each shown the same worked example, drawn apart."""
    r = random.Random(f"{kind}:{seed}")
    text, truth = _draw(kind, r)
    example = FewShotExample(text, compact_json(truth))  # as the grammar writes JSON: compact
    items = [_draw(kind, r) for _ in range(n)]
    return [WorkItem("extract", kind, doc, value, schema=OWN_SCHEMAS[kind], examples=(example,))
            for doc, value in items]


@dataclass
class Tally:
    items: int = 0
    finished: int = 0  # ended with stop (not cut at max_tokens)
    valid: int = 0
    right: int = 0  # leaf fields equal to the truth
    fields: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return self.right / self.fields if self.fields else 0.0


def run(model: str, workloads: dict[str, list[WorkItem]], variants: list[str], max_tokens: int,
        executor: str = "auto") -> dict[str, dict[str, Tally]]:
    """{variant: {workload: Tally}}: every item of every workload under every variant, on one engine."""
    engine = assemble_engine(load_profile(model, executor=executor))
    engine.start()
    results: dict[str, dict[str, Tally]] = {}
    try:
        for variant in variants:
            engine.prompts = VARIANTS[variant](engine.tokenizer)
            for name, items in workloads.items():
                t, start = Tally(), time.perf_counter()
                for item in items:
                    assert item.schema is not None  # extraction workloads only
                    res = asyncio.run(engine.extract(ExtractionRequest(
                        schema=item.schema, text=item.source, examples=item.examples,
                        sampling=SamplingParams(max_tokens=max_tokens), speculation=SpeculationMode.OFF)))
                    right, total = item.score(res.value if res.outcome is Outcome.VALID else None)
                    t.items += 1
                    t.finished += res.finish_reason is FinishReason.STOP
                    t.valid += res.outcome is Outcome.VALID
                    t.right, t.fields, t.tokens = t.right + right, t.fields + total, t.tokens + len(res.token_ids)
                t.seconds = time.perf_counter() - start
                results.setdefault(variant, {})[name] = t
    finally:
        engine.stop()
    return results


def table(results: dict[str, dict[str, Tally]]) -> str:
    rows = [["variant", "workload", "finished", "valid", "field score", "tokens", "seconds"]]
    for variant, per in results.items():
        for name, t in [*per.items(), ("all", _total(per.values()))]:
            rows.append([variant, name, f"{t.finished}/{t.items}", f"{t.valid}/{t.items}", f"{t.score:.2f}",
                         str(t.tokens), f"{t.seconds:.0f}"])
    return aligned(rows)


def _total(tallies) -> Tally:
    out = Tally()
    for t in tallies:
        for k in ("items", "finished", "valid", "right", "fields", "tokens", "seconds"):
            setattr(out, k, getattr(out, k) + getattr(t, k))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--executor", default="auto")
    parser.add_argument("--items", type=int, default=8, help="items per workload")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--workloads", default="builtin," + ",".join(OWN_SCHEMAS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    workloads = {name: build_workload("extraction", args.items, few_shot=1) if name == "builtin"
                 else own_workload(name, args.items) for name in args.workloads.split(",")}
    results = run(args.model, workloads, args.variants.split(","), args.max_tokens, args.executor)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "items": args.items, "max_tokens": args.max_tokens,
                       "results": {v: {w: {**asdict(t), "score": t.score} for w, t in per.items()}
                                   for v, per in results.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
