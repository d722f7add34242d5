"""Workloads the drafting policy was not tuned on: other schemas, other documents, other output lengths.

The demo corpus (``structspec.demo.corpus``) trained the demo pair and tuned the policy's defaults; these three do
not share its schemas, wording or shapes, so a policy that only fits the demo traffic shows it here:

- ``manifest``: long, noisy shipping manifests (a header, 3-5 line items in a column layout with notes and
  page furniture between them) into an object holding an array of objects: long outputs, much of it copied;
- ``classify``: short customer messages into an intent label and an urgency flag: outputs under 20 tokens
  (with a BPE vocabulary), where drafting has no room to pay;
- ``nested_tools``: requests for an agent whose tools take nested arguments (objects in arrays in objects):
  calls of 40-90 tokens, values copied from the message inside structure the grammar forces.

Each item carries one worked example of its own schema (another document of the same generator, with other
values, passed as a caller passes one), its ground truth, and for tool calls the whole tool list.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from structspec.bench.workloads import WorkItem
from structspec.prompts import FewShotExample, compact_json

HELDOUT_WORKLOADS = ("manifest", "classify", "nested_tools")

_FIRST = ("Ines", "Tomasz", "Keiko", "Ruairi", "Amara", "Lukas", "Priya", "Mateo", "Yara", "Oskar", "Selin", "Jonas")
_LAST = ("Okafor", "Lindqvist", "Takahashi", "Brennan", "Castillo", "Novak", "Haddad", "Moreau", "Sato", "Dubois")
_CITIES = ("Rotterdam", "Gdansk", "Valencia", "Tallinn", "Porto", "Antwerp", "Genoa", "Bergen", "Izmir", "Tangier")
_GOODS = (("bearing housing", "BH"), ("copper coil 2mm", "CC"), ("hydraulic hose 3/4", "HH"), ("LED panel 60x60", "LP"),
          ("stainless bolt M8", "SB"), ("pallet wrap 500mm", "PW"), ("gear motor 0.75kW", "GM"),
          ("thermal paste 50g", "TP"), ("safety gloves L", "SG"), ("cable tray 2m", "CT"), ("air filter F7", "AF"))
_CARRIERS = ("Nordlink Freight", "Meridian Cargo", "Baltic Roadways", "Atlas Shipping")

MANIFEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "manifest_id": {"type": "string"},
        "carrier": {"type": "string"},
        "origin": {"type": "string"},
        "destination": {"type": "string"},
        "items": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "properties": {"sku": {"type": "string"}, "description": {"type": "string"},
                           "quantity": {"type": "integer", "minimum": 1}, "weight_kg": {"type": "number"}},
            "required": ["sku", "description", "quantity", "weight_kg"], "additionalProperties": False}},
        "hazardous": {"type": "boolean"},
    },
    "required": ["manifest_id", "carrier", "origin", "destination", "items", "hazardous"],
    "additionalProperties": False,
}

INTENTS = ("cancel_order", "change_address", "refund_status", "damaged_item", "missing_parcel", "invoice_copy",
           "product_question", "account_locked")
CLASSIFY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"intent": {"type": "string", "enum": list(INTENTS)}, "urgent": {"type": "boolean"}},
    "required": ["intent", "urgent"], "additionalProperties": False,
}

_PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
           "required": ["name", "email"], "additionalProperties": False}
NESTED_TOOLS: tuple[dict[str, Any], ...] = (
    {"type": "function", "function": {
        "name": "schedule_meeting", "description": "Put a meeting in the shared calendar and invite people.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string"},
            "when": {"type": "object", "properties": {"date": {"type": "string"}, "start": {"type": "string"},
                                                      "minutes": {"type": "integer"}},
                     "required": ["date", "start", "minutes"], "additionalProperties": False},
            "attendees": {"type": "array", "items": _PERSON, "minItems": 1},
            "place": {"type": "object", "properties": {"city": {"type": "string"}, "room": {"type": "string"}},
                      "required": ["city", "room"], "additionalProperties": False}},
            "required": ["title", "when", "attendees", "place"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "ship_parcel", "description": "Book a courier for a parcel between two addresses.",
        "parameters": {"type": "object", "properties": {
            "sender": {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
                       "required": ["name", "city"], "additionalProperties": False},
            "recipient": {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
                          "required": ["name", "city"], "additionalProperties": False},
            "parcels": {"type": "array", "minItems": 1, "items": {
                "type": "object", "properties": {"weight_kg": {"type": "number"}, "fragile": {"type": "boolean"}},
                "required": ["weight_kg", "fragile"], "additionalProperties": False}}},
            "required": ["sender", "recipient", "parcels"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "open_account", "description": "Open a customer account with its company and contacts.",
        "parameters": {"type": "object", "properties": {
            "company": {"type": "object", "properties": {"name": {"type": "string"}, "country": {"type": "string"}},
                        "required": ["name", "country"], "additionalProperties": False},
            "contacts": {"type": "array", "items": _PERSON, "minItems": 1},
            "plan": {"type": "string", "enum": ["basic", "team", "enterprise"]}},
            "required": ["company", "contacts", "plan"], "additionalProperties": False}}},
)


def _person(r: random.Random) -> tuple[str, str]:
    first, last = r.choice(_FIRST), r.choice(_LAST)
    return f"{first} {last}", f"{first.lower()}.{last.lower()}@{r.choice(('example.org', 'mail.test', 'corp.test'))}"


def _manifest(r: random.Random, items_at_most: int = 5) -> tuple[str, dict[str, Any]]:
    mid = f"MF-{r.randint(10, 99)}-{r.randint(1000, 9999)}"
    carrier, origin = r.choice(_CARRIERS), r.choice(_CITIES)
    destination = r.choice([c for c in _CITIES if c != origin])
    items = []
    for good, prefix in r.sample(_GOODS, r.randint(min(3, items_at_most), items_at_most)):
        items.append({"sku": f"{prefix}-{r.randint(100, 999)}", "description": good,
                      "quantity": r.randint(1, 60), "weight_kg": round(r.uniform(0.5, 90.0), 1)})
    hazardous = r.random() < 0.25
    lines = [f"CARGO MANIFEST   {mid}", f"Carrier: {carrier}          page 1/1",
             f"From {origin} port terminal -> To {destination}", "-" * 12, "SKU / DESCRIPTION / QTY / KG"]
    for i, it in enumerate(items):
        lines.append(f"{it['sku']}  {it['description']}  {it['quantity']}  {it['weight_kg']}")
        if i == 2:
            lines.append("  (continued - check seals on arrival)")
    lines += ["-" * 12, f"Hazardous goods on board: {'YES' if hazardous else 'none declared'}",
              "Signed at dispatch. Keep this sheet with the consignment."]
    value = {"manifest_id": mid, "carrier": carrier, "origin": origin, "destination": destination, "items": items,
             "hazardous": hazardous}
    return "\n".join(lines), value


_MESSAGES: dict[str, tuple[str, ...]] = {
    "cancel_order": ("Please cancel order {n}, I ordered it by mistake.", "I don't want order {n} anymore, stop it."),
    "change_address": ("I moved last week; ship order {n} to my new flat instead.", "Wrong street on order {n}!"),
    "refund_status": ("Where is my refund for order {n}? It's been two weeks.", "Has the refund for {n} gone out?"),
    "damaged_item": ("The lamp in order {n} arrived cracked.", "Box for {n} was crushed and the mug is broken."),
    "missing_parcel": ("Tracking says delivered but order {n} never came.", "Parcel {n} is lost, nobody has it."),
    "invoice_copy": ("Could you send me the invoice for order {n} again?", "I need a PDF receipt for {n}."),
    "product_question": ("Does the kettle from order {n} work on 110V?", "Is the jacket in {n} waterproof?"),
    "account_locked": ("I can't log in, my account got locked after order {n}.", "Locked out of my account again."),
}


def _classify(r: random.Random) -> tuple[str, dict[str, Any]]:
    intent = r.choice(INTENTS)
    urgent = r.random() < 0.3
    text = r.choice(_MESSAGES[intent]).format(n=f"#{r.randint(10000, 99999)}")
    if urgent:
        text += " This is urgent, I need it sorted today."
    return text, {"intent": intent, "urgent": urgent}


def _meeting(r: random.Random) -> tuple[str, dict[str, Any]]:
    people = [_person(r) for _ in range(r.randint(1, 3))]
    title = r.choice(("Quarterly review", "Supplier onboarding", "Roadmap sync", "Budget check-in"))
    date = f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
    start, minutes = f"{r.randint(8, 17):02d}:{r.choice(('00', '30'))}", r.choice((30, 45, 60, 90))
    city, room = r.choice(_CITIES), f"{r.choice(('Harbour', 'Atrium', 'Loft'))} {r.randint(1, 9)}"
    who = ", ".join(f"{n} ({e})" for n, e in people)
    msg = f"Set up '{title}' on {date} at {start} for {minutes} minutes in {city}, room {room}, with {who}."
    args = {"title": title, "when": {"date": date, "start": start, "minutes": minutes},
            "attendees": [{"name": n, "email": e} for n, e in people], "place": {"city": city, "room": room}}
    return msg, {"name": "schedule_meeting", "arguments": args}


def _parcel(r: random.Random) -> tuple[str, dict[str, Any]]:
    (sender, _), (recipient, _) = _person(r), _person(r)
    a, b = r.sample(_CITIES, 2)
    parcels = [{"weight_kg": round(r.uniform(0.2, 25.0), 1), "fragile": r.random() < 0.4} for _ in range(r.randint(1, 3))]
    desc = "; ".join(f"{p['weight_kg']} kg{' fragile' if p['fragile'] else ''}" for p in parcels)
    msg = f"Courier needed: from {sender} in {a} to {recipient} in {b}. Parcels: {desc}."
    args = {"sender": {"name": sender, "city": a}, "recipient": {"name": recipient, "city": b}, "parcels": parcels}
    return msg, {"name": "ship_parcel", "arguments": args}


def _account(r: random.Random) -> tuple[str, dict[str, Any]]:
    company = f"{r.choice(('Vela', 'Kestrel', 'Orbis', 'Lumen'))} {r.choice(('Logistics', 'Labs', 'Textiles', 'Foods'))}"
    country = r.choice(("Portugal", "Estonia", "Norway", "Morocco", "Turkey"))
    people = [_person(r) for _ in range(r.randint(1, 2))]
    plan = r.choice(("basic", "team", "enterprise"))
    who = " and ".join(f"{n} <{e}>" for n, e in people)
    msg = f"New customer {company} from {country} on the {plan} plan; contacts {who}."
    args = {"company": {"name": company, "country": country},
            "contacts": [{"name": n, "email": e} for n, e in people], "plan": plan}
    return msg, {"name": "open_account", "arguments": args}


_CALLS: tuple[Callable[[random.Random], tuple[str, dict[str, Any]]], ...] = (_meeting, _parcel, _account)


def build_heldout_workload(workload: str, n: int, seed: int) -> list[WorkItem]:
    """``n`` items of ``workload`` (one of ``HELDOUT_WORKLOADS``), each with one worked example of its own kind made
    with another seed (other values). Raises: ValueError (an unknown workload)."""
    if workload not in HELDOUT_WORKLOADS:
        raise ValueError(f"unknown held-out workload {workload!r}; one of {', '.join(HELDOUT_WORKLOADS)}")
    r, shown = random.Random(seed), random.Random(seed + 1000)
    out = []
    for _ in range(n):
        if workload == "nested_tools":
            make = r.choice(_CALLS)
            msg, call = make(r)
            ex_msg, ex_call = make(shown)  # the same tool, other values
            while ex_msg == msg:
                ex_msg, ex_call = make(shown)
            out.append(WorkItem("toolcall", "nested_tools", msg, call, tools=NESTED_TOOLS,
                                examples=(FewShotExample(ex_msg, compact_json(ex_call)),)))
            continue
        make_doc, schema = (_manifest, MANIFEST_SCHEMA) if workload == "manifest" else (_classify, CLASSIFY_SCHEMA)
        text, value = make_doc(r)
        while True:  # another document; for classify another label too (an example must not give the answer away)
            ex_text, ex_value = _manifest(shown, 2) if workload == "manifest" else make_doc(shown)  # a short example
            if ex_text != text and (workload != "classify" or ex_value["intent"] != value["intent"]):
                break
        out.append(WorkItem("extract", workload, text, value, schema=schema,
                            examples=(FewShotExample(ex_text, compact_json(ex_value)),)))
    return out
