"""Held-out invoices on the built-in invoice schema: long line-item lists in noisy layouts, against llama.cpp's grammar.

The demo corpus's invoices (``structspec.demo.corpus.gen_invoice``: 1-4 items, three tidy layouts, a payment note in
every document) wrote the server's shipped examples; these share none of its vendors, goods, layouts or notes:

- 4-8 line items (the schema's ``maxItems`` is 8), in one of five layouts: a column table with page furniture
  (``table``), the same table broken over two pages with the header repeated (``pages``), semicolon-separated rows
  (``csv``), a letter that names each item in a sentence (``letter``) and a scanned bill with ragged spacing and
  a subtotal and tax lines between the items and the amount due (``scan``);
- a payment note in only some documents (``notes`` is required: where the document says none, the right value is
  ``""``, and a sentence there is made up or copied from an example).

Arms, on one GGUF, greedy, speculation off (greedy outputs do not depend on it), one request at a time. A
structspec arm is ``examples/wording``: the worked examples shown and the prompt's wording around structspec's grammar.

  examples  server    the server's own worked example (what a caller of ``invoice`` gets)
            server2   the server's first two examples (values that differ between them)
            spaced    the server's example with its JSON written with spaces (``", "``, ``": "``): the key
                      prefixes the output writes compact do not occur as such in the prompt
            noted     the generator's examples with every note shown (``worked_examples.build(quiet_examples=0)``)
            quiet1    the same with the first example quiet: its note's sentences cut from its document, ``"notes":""``
            quiet     the same with every example shown quiet (``QUIET_EXAMPLES`` of them: what the server ships)
            foreign   the server's example of another schema (contact, under its title)
            client    one worked example the caller passes (another held-out invoice, in the ``table`` layout), as
                      the server serves it: after the server's own (``default_examples.fill_examples``)
            alone     the caller's example alone (the server's book emptied for the arm)
  wording   plain        structspec's plain format (headings; the output after ``### JSON:``)
            label        the same with the output after a bare ``JSON:`` (``ModelProfile.plain_json_line``: what
                         the server runs for Gemma 3 270M)
            instruction  the example, an instruction, the document, ``JSON:`` (``prompt_formats``)
  guard     (optional third part) ``noguard``: the copy guard off (``grammar.copy_guard``: an output never writes
            a value of the server's examples past what the document holds); by default it is on, as the server runs. It guards the
            server's own examples, which ``server`` and ``client`` are shown as the server adds them to a request
  llamacpp  llama.cpp's grammar (``LlamaGrammar.from_json_schema``) on the ``instruction`` wording with the
            caller's example: what a llama.cpp user runs

Per arm: outputs that finished (``stop``), valid ones, exact leaf fields (``notes`` aside), the values copied from
the examples shown (``WorkItem.copied``; and of those, the server's own examples' values), notes the document does not hold (made up or copied) and notes right (the
document's, or ``""`` where it has none). Fields are also given over the ``llamacpp`` arm's (else the first arm's)
on the same documents, with a paired bootstrap interval over documents (``ratio_interval``): one greedy run of 30
documents moves by 15-20% between runs of the same arm (llama.cpp's prompt cache follows the requests before).

    python -m structspec.bench.invoice_heldout --model gemma-3-270m --documents 30 --json report.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from structspec.assembly import assemble_engine
from structspec.bench.llamacpp_baselines import LlamaCppBaseline, context_for
from structspec.bench.prompt_formats import InstructionPrompts
from structspec.bench.ratio_interval import RatioInterval, paired_ratio
from structspec.bench.text_table import aligned
from structspec.bench.workloads import WorkItem
from structspec.chat_template import PlainPrompts
from structspec.demo import worked_examples
from structspec.demo.worked_examples import QUIET_EXAMPLES
from structspec.demo.corpus import flatten
from structspec.engine.api import ExtractionRequest
from structspec.engine.default_examples import ExampleBook, build_example_book, fill_examples
from structspec.grammar.copy_guard import normalized
from structspec.engine.types import FinishReason, Outcome, SamplingParams, SpeculationMode
from structspec.models.loading import load_profile, model_profile
from structspec.prompts import FewShotExample, compact_json
from structspec.schemas import load_builtin_schemas

EXAMPLES = ("server", "server2", "spaced", "noted", "quiet1", "quiet", "foreign", "client", "alone")
WORDINGS = ("plain", "label", "instruction")
LLAMACPP = "llamacpp"
ARMS = ("server/label", "client/label", LLAMACPP)  # the default run: the server as Gemma 3 270M is served, llama.cpp
LAYOUTS = ("table", "pages", "csv", "letter", "scan")

_VENDORS = ("Saltmarsh Print Co.", "Vantablue Ltd", "Odessa Tooling GmbH", "Brightwater Catering", "Quillon & Sons",
            "Kalevala Timber Oy", "Pinecrest Audio", "Marisol Textiles S.L.", "Hexfield Electric", "Tarn Valley Farms")
_CUSTOMERS = ("Rosalind Achebe", "Greyhound Dental Clinic", "Municipality of Ostby", "Corvid Games Ltd",
              "Helga Brandt", "St. Jude Primary School", "Arlo Fitzgerald", "Nimbus Yoga Studio", "Pavel Horvat")
_GOODS = ("A4 flyers (box of 500)", "oak floor boards m2", "cable ties 200mm", "catering lunch per guest",
          "studio monitor stand", "linen napkins", "circuit breaker 16A", "organic apples (crate)", "wool blanket",
          "lathe chisel set", "banner print 2x1m", "XLR cable 5m", "birch plywood 18mm", "coffee urn rental",
          "LED bulb E27", "site visit (hours)", "table cloth rental", "drill bits HSS", "honey jar 500g",
          "copper pipe 15mm")
_CURRENCY = {"USD": ("$", "USD"), "EUR": ("EUR ", "EUR"), "GBP": ("£", "GBP"), "CHF": ("CHF ", "CHF"),
             "JPY": ("JPY ", "JPY")}
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_NOTES = ("Net 45 days from receipt of goods.", "Goods remain our property until paid in full.",
          "Deposit of 30% received with thanks.", "Returns accepted within 10 days in original packaging.",
          "Delivery to loading bay 3 only.", "Bank: IBAN NL02 ABNA 0123 4567 89.")


def _amount(x: float) -> str:
    return f"{x:,.2f}"


def _price(x: float) -> int | float:
    return int(x) if x == int(x) else x  # JSON writes 12, not 12.0, as a document would


def invoice_document(r: random.Random, layout: str | None = None) -> tuple[str, dict[str, Any]]:
    """One held-out (document, truth) on the built-in invoice schema."""
    layout = layout or r.choice(LAYOUTS)
    cur = r.choice(list(_CURRENCY))
    sym, code = _CURRENCY[cur]
    year, month, day = r.randint(2024, 2027), r.randint(1, 12), r.randint(1, 28)
    shown = r.choice((f"{day:02d}.{month:02d}.{year}", f"{_MONTHS[month - 1]} {day}, {year}",
                      f"{day} {_MONTHS[month - 1][:3]} {year}"))
    number = r.choice((f"{r.randint(10000, 99999)}", f"SP-{r.randint(100, 999)}/{year % 100}",
                       f"{r.choice('ABCDEFGH')}{r.randint(1000, 9999)}-{r.randint(10, 99)}"))
    vendor, customer = r.choice(_VENDORS), r.choice(_CUSTOMERS)
    items: list[dict[str, Any]] = [{"description": g, "quantity": r.randint(1, 40),
                                    "unit_price": _price(round(r.uniform(0.5, 400), 2))}
                                   for g in r.sample(_GOODS, r.randint(4, 8))]
    subtotal = round(sum(i["quantity"] * i["unit_price"] for i in items), 2)
    taxed = layout in ("table", "pages", "scan")
    tax = round(subtotal * 0.2, 2) if taxed else 0.0
    total = round(subtotal + tax, 2)
    total = int(total) if total == int(total) else total
    note = r.choice(_NOTES) if r.random() < 0.5 else ""
    rows = [f"{n + 1:>2}  {i['description']:<26}{i['quantity']:>5}  {_amount(i['unit_price']):>10}  "
            f"{_amount(i['quantity'] * i['unit_price']):>11}" for n, i in enumerate(items)]
    head = "Pos Description                 Qty  Unit price       Amount"
    sums = [f"{'Subtotal':>48} {_amount(subtotal):>11}", f"{'VAT 20%':>48} {_amount(tax):>11}"] if taxed else []
    due = f"{'TOTAL DUE ' + code:>48} {_amount(total):>11}"
    if layout == "table":
        doc = "\n".join([vendor, "12 Harbour Road, Unit 4", f"Invoice {number}    Date: {shown}", f"Bill to: {customer}",
                         "", head, *rows, *sums, due, note, "Page 1 of 1"])
    elif layout == "pages":
        cut = len(rows) // 2
        doc = "\n".join([f"{vendor} - INVOICE", f"No. {number} / {shown}", f"Customer: {customer}", head, *rows[:cut],
                         "continued overleaf", "-- page 1 of 2 --", f"{vendor} - invoice {number} (cont.)", head,
                         *rows[cut:], *sums, due, note, "-- page 2 of 2 --"])
    elif layout == "csv":
        csv = [f"{i['description']};{i['quantity']};{_amount(i['unit_price'])}" for i in items]
        doc = "\n".join([f"invoice_no;{number}", f"date;{shown}", f"seller;{vendor}", f"buyer;{customer}",
                         f"currency;{code}", "description;qty;unit_price", *csv, f"amount_due;{_amount(total)}",
                         *([f"remark;{note}"] if note else [])])
    elif layout == "letter":
        said = "; ".join(f"{i['quantity']} {i['description']} at {sym}{_amount(i['unit_price'])} each" for i in items)
        doc = (f"Dear {customer},\n\nthank you for your order. For invoice {number}, dated {shown}, we charge: "
               f"{said}.\nThe total comes to {sym}{_amount(total)}. {note}\n\nKind regards,\n{vendor}").strip()
    else:  # scan
        ragged = [f"{i['description']}{' ' * r.randint(1, 6)}x{i['quantity']}{' ' * r.randint(2, 9)}"
                  f"{sym}{_amount(i['unit_price'])}" for i in items]
        doc = "\n".join([f"~ {vendor} ~", f"INV #   {number}", f"dt:  {shown}", f"to:  {customer}", "=" * 30, *ragged,
                         "=" * 30, f"sub   {sym}{_amount(subtotal)}", f"tax   {sym}{_amount(tax)}",
                         f"DUE   {sym}{_amount(total)} {code}", *([note] if note else []), "*** thank you ***"])
    truth = {"invoice_number": number, "issue_date": f"{year}-{month:02d}-{day:02d}", "vendor": vendor,
             "customer": customer, "currency": cur, "line_items": items, "total": total, "notes": note}
    return doc, truth


def invoice_items(n: int, seed: int = 5, bounded_list: bool = True) -> tuple[list[WorkItem], FewShotExample]:
    """``n`` held-out invoices (layouts in turn) and the caller's worked example (one more, drawn first).
    ``bounded_list``: the built-in schema as it is (``line_items`` at most 8); False: without ``maxItems``, as a
    caller's own invoice schema often is, where nothing but the model ends the list."""
    schema = load_builtin_schemas()["invoice"]
    if not bounded_list:
        schema = json.loads(json.dumps(schema))
        del schema["properties"]["line_items"]["maxItems"]
    r = random.Random(f"invoice-heldout:{seed}")
    text, truth = invoice_document(r, "table")
    example = FewShotExample(text, compact_json(truth))
    items = [invoice_document(r, LAYOUTS[k % len(LAYOUTS)]) for k in range(n)]
    return [WorkItem("extract", "invoice", doc, value, freetext_fields=("notes",), schema=schema)
            for doc, value in items], example


@dataclass
class Tally:
    items: int = 0
    finished: int = 0  # ended with stop (not cut at max_tokens)
    valid: int = 0
    right: int = 0  # exact leaf fields (notes aside)
    fields: int = 0
    copied: int = 0  # values the example shown holds and the document does not
    counted: int = 0
    copied_server: int = 0  # ... of those, values the server's own examples shown hold (what the guard guards)
    near_copied: int = 0  # strings the document does not hold that begin as a shown example's does (``near_copy``)
    notes_made_up: int = 0  # a notes value the document does not hold
    notes_right: int = 0  # the document's note, or "" where it has none
    tokens: int = 0
    seconds: float = 0.0
    right_by_item: list[int] = field(default_factory=list)  # exact fields per document, in the items' order

    def add(self, item: WorkItem, finished: bool, value: Any, n_tokens: int,
            server_shown: tuple[FewShotExample, ...] = ()) -> None:
        right, total = item.score(value)
        copied, counted = item.copied(value)
        self.copied_server += replace(item, examples=server_shown).copied(value)[0] if server_shown else 0
        self.near_copied += near_copies(value, item)
        note = value.get("notes", "") if isinstance(value, dict) else ""
        self.items += 1
        self.finished += finished
        self.valid += value is not None
        self.right, self.fields, self.tokens = self.right + right, self.fields + total, self.tokens + n_tokens
        self.right_by_item.append(right)
        self.copied, self.counted = self.copied + copied, self.counted + counted
        self.notes_made_up += int(isinstance(note, str) and bool(note.strip()) and note.strip() not in item.source)
        self.notes_right += int(value is not None and note == item.truth.get("notes"))


def run(model: str, items: list[WorkItem], example: FewShotExample, arms: list[str], max_tokens: int,
        executor: str = "llamacpp") -> dict[str, Tally]:
    """{arm: Tally} over ``items``; every arm on one loaded model. Raises ValueError for an unknown arm."""
    for arm in arms:
        shown, wording, guard = _parts(arm)
        if arm != LLAMACPP and (shown not in EXAMPLES or wording not in WORDINGS or guard not in ("", "noguard")):
            raise ValueError(f"unknown arm {arm!r}: {LLAMACPP}, or examples/wording[/noguard] with examples one of "
                             f"{', '.join(EXAMPLES)} and wording one of {', '.join(WORDINGS)}")
    models = load_profile(model, executor=executor)
    engine = assemble_engine(models)
    # the examples the server adds to a request for ``invoice`` (``assemble``: the profile's ``few_shot``)
    schema = items[0].schema if items else None
    assert schema is not None, "extraction items of one schema"
    book = build_example_book(model_profile(model).few_shot)
    server = book.for_schema(schema)
    examples = {"server": server, "client": (example,), "alone": (example,),
                "server2": build_example_book(2).for_schema(schema),
                "spaced": tuple(replace(ex, output=json.dumps(json.loads(ex.output), ensure_ascii=False))
                                for ex in server),
                **{arm: _generated(quiet, len(server)) for arm, quiet in (("noted", 0), ("quiet1", 1),
                                                                           ("quiet", QUIET_EXAMPLES))},
                "foreign": (book.foreign,) if book.foreign is not None else ()}
    wordings = {"plain": PlainPrompts(engine.tokenizer), "label": PlainPrompts(engine.tokenizer, json_line="label"),
                "instruction": InstructionPrompts(engine.tokenizer)}
    out: dict[str, Tally] = {}
    engine.start()
    try:
        for arm in arms:
            shown, wording, guard = _parts(arm if arm != LLAMACPP else "client/instruction")
            engine.prompts = wordings[wording]
            engine.copy_guard = guard != "noguard"
            # ``server`` and ``client`` are shown the server's examples as the server adds them to a request (the
            # guard guards those); every other arm is shown exactly its examples, as a caller's
            engine.examples = book if shown in ("server", "client") else ExampleBook()
            server_shown = {"server": server, "client": fill_examples((example,), server)[:-1]}.get(shown, ())
            tally, start = Tally(), time.perf_counter()
            shown_items = [replace(i, examples=examples[shown]) for i in items]
            if arm == LLAMACPP:
                _run_llamacpp(models, engine, shown_items, max_tokens, tally)
            else:
                _run_structspec(engine, shown_items, max_tokens, tally, send=shown != "server",
                                server_shown=server_shown)
            tally.seconds = time.perf_counter() - start
            out[arm] = tally
            print(f"{table({arm: tally}).splitlines()[-1]}", flush=True)
    finally:
        engine.stop()
    return out


def _generated(quiet_examples: int, shots: int) -> tuple[FewShotExample, ...]:
    """The first ``shots`` invoice examples the generator writes with its first ``quiet_examples`` quiet."""
    return tuple(FewShotExample(e["text"], e["output"])
                 for e in worked_examples.build(quiet_examples)["schemas"]["invoice"][:shots])


def near_copies(value: Any, item: WorkItem) -> int:
    """String values (3+ characters) the document does not hold that begin as a string value of a shown example
    does, which the document does not hold either: their first max(4, 60%) letters and digits alike
    (``copy_guard.normalized``: ``INV_2027-1149`` of ``INV-2027-1149``, ``consulting hours (invoices)`` of
    ``consulting hours``). What an exact comparison (``WorkItem.copied``) misses."""
    source = normalized(item.source.encode())
    shown = {normalized(v.encode()) for ex in item.examples for v in flatten(json.loads(ex.output)).values()
             if isinstance(v, str) and len(v.strip()) >= 3}
    shown = {u for u in shown if u and u not in source}
    n = 0
    for v in (flatten(value).values() if isinstance(value, (dict, list)) else ()):
        w = normalized(v.encode()) if isinstance(v, str) and len(v.strip()) >= 3 else b""
        if w and w not in source and any(len(os.path.commonprefix([w, u])) >= max(4, 0.6 * len(u)) for u in shown):
            n += 1
    return n


def _parts(arm: str) -> tuple[str, str, str]:
    """(examples, wording, guard) of ``examples/wording[/noguard]``."""
    shown, _, rest = arm.partition("/")
    wording, _, guard = rest.partition("/")
    return shown, wording, guard


def _run_structspec(engine, items: list[WorkItem], max_tokens: int, tally: Tally, send: bool = True,
                    server_shown: tuple[FewShotExample, ...] = ()) -> None:
    """structspec's engine on its prompt format (``engine.prompts``), each item's examples (``send``: as the
    caller's; else the engine adds the server's own, which the items hold for scoring)."""
    for item in items:
        assert item.schema is not None
        res = asyncio.run(engine.extract(ExtractionRequest(
            schema=item.schema, text=item.source, examples=item.examples if send else (),
            sampling=SamplingParams(max_tokens=max_tokens), speculation=SpeculationMode.OFF)))
        tally.add(item, res.finish_reason is FinishReason.STOP, res.value if res.outcome is Outcome.VALID else None,
                  len(res.token_ids), server_shown)


def _run_llamacpp(models, engine, items: list[WorkItem], max_tokens: int, tally: Tally) -> None:
    """llama.cpp's grammar on the engine's wording (``engine.prompts``), through ``LlamaCppBaseline`` (the decode
    bench's)."""
    def prompt_of(item: WorkItem) -> list[int]:
        assert item.schema is not None
        return engine.prompts.extraction(item.schema, item.source, None, item.examples).ids

    def record(latency, n_out, passes, finished, valid, right, total, **kw):
        return finished, n_out, json.loads(kw["text"]) if valid else None  # valid: it parsed and validated

    baseline = LlamaCppBaseline(models, "llamacpp_grammar", context_for(items, max_tokens, prompt_of))
    try:
        records, _ = baseline.run(items, max_tokens, lambda i: i.schema, prompt_of, record)
        for item, (finished, n_out, value) in zip(items, records):
            tally.add(item, finished, value, n_out)
    finally:
        baseline.close()


def fields_over(results: dict[str, Tally]) -> tuple[str, dict[str, RatioInterval | None]]:
    """(base arm, {arm: its fields over the base's on the same documents, with a paired 95% interval}): the base is
    ``llamacpp`` where it ran, else the first arm."""
    if not results:
        return "", {}
    base = LLAMACPP if LLAMACPP in results else next(iter(results))
    b = results[base].right_by_item
    ones = [1.0] * len(b)
    return base, {arm: paired_ratio(t.right_by_item, ones, b, ones) if len(t.right_by_item) == len(b) else None
                  for arm, t in results.items()}


def table(results: dict[str, Tally]) -> str:
    base, over = fields_over(results)
    rows = [["arm", "finished", "valid", "fields", f"fields / {base} (95%)", "copied", "of the server's",
             "near copies", "notes made up", "notes right", "tokens", "seconds"]]
    for arm, t in results.items():
        r = over.get(arm)
        rows.append([arm, f"{t.finished}/{t.items}", f"{t.valid}/{t.items}", f"{t.right}/{t.fields}",
                     f"{r.ratio:.2f} ({r.low:.2f}-{r.high:.2f})" if r is not None else "-",
                     f"{t.copied}/{t.counted}", str(t.copied_server), str(t.near_copied), f"{t.notes_made_up}/{t.items}", f"{t.notes_right}/{t.items}",
                     str(t.tokens), f"{t.seconds:.0f}"])
    return aligned(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--executor", default="llamacpp")
    parser.add_argument("--documents", type=int, default=30)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--unbounded-list", action="store_true",
                        help="line_items without maxItems: a schema of the caller's own, so the server's examples "
                             "are those it makes for one it does not ship (synthesized, or another schema's)")
    parser.add_argument("--arms", default=",".join(ARMS), help="examples/wording pairs and llamacpp (see above)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    items, example = invoice_items(args.documents, args.seed, bounded_list=not args.unbounded_list)
    results = run(args.model, items, example, args.arms.split(","), args.max_tokens, args.executor)
    print(table(results))
    if args.json:
        base, over = fields_over(results)
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "documents": args.documents, "seed": args.seed,
                       "unbounded_list": args.unbounded_list,
                       "max_tokens": args.max_tokens, "results": {a: asdict(t) for a, t in results.items()},
                       "fields_over": {"base": base,
                                       **{a: asdict(r) if r is not None else None for a, r in over.items()}}},
                      f, indent=1)


if __name__ == "__main__":
    main()
