"""Synthetic corpus for the demo models and the benchmark workloads.

Every example is a document rendered in one of several styles, followed by its
JSON extraction for a schema in ``schemas/`` (or a tool request followed by its
call). Values in the JSON are copied from the document (names, numbers, ids),
enums are inferred from wording, and free-text fields (summaries, notes,
descriptions) are prose conditioned on the document: so outputs mix copied
spans, fixed structure and prose, like real extraction traffic.

Everything is driven by one ``random.Random(seed)``: the same seed gives the
same corpus byte for byte.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

from structspec.prompts import ToolSpec, compact_json, extraction_prompt, toolcall_prompt
from structspec.schemas import load_builtin_schemas, load_builtin_tools

FIRST = ("Anna Ben Carla David Elena Farid Greta Hiro Ines Jonas Keiko Liam Maya Nadia Omar Priya Quentin Rosa "
         "Samir Tara Umar Vera Wei Xenia Yusuf Zoe Aaron Bianca Chen Dmitri Esther Felix Gloria Hannah Ivan Julia "
         "Kofi Lena Marco Nina Oscar Paula Rafael Sofia Tomas Ursula Viktor Wanda").split()
LAST = ("Adler Brooks Castillo Dubois Eriksen Fischer Garcia Haddad Ito Jensen Kowalski Lindqvist Moreau Nakamura "
        "Okafor Petrov Quinn Rossi Schmidt Tanaka Ueda Varga Weber Xu Yilmaz Zimmermann Alvarez Becker Costa "
        "Dimitriou Evans Ferreira Gupta Horvat Iqbal Jovanovic Keller Laurent Mendes Novak").split()
COMPANY_A = ("Acme Blue Cedar Delta Ember Fjord Granite Harbor Iris Juniper Kestrel Lumen Meridian Northwind Orbit "
             "Pinnacle Quartz Redwood Summit Tidal Umbra Vertex Willow Zenith Atlas Beacon Cobalt Drift").split()
COMPANY_B = ("Labs Systems Logistics Foods Analytics Studios Works Partners Energy Robotics Health Media Supply "
             "Consulting Software Textiles").split()
SUFFIX = ("GmbH", "Ltd", "Inc.", "LLC", "S.A.", "AG", "")
CITIES = [("Berlin", "Germany"), ("Munich", "Germany"), ("Paris", "France"), ("Lyon", "France"), ("Madrid", "Spain"),
          ("Lisbon", "Portugal"), ("Rome", "Italy"), ("Milan", "Italy"), ("Vienna", "Austria"), ("Zurich", "Switzerland"),
          ("Oslo", "Norway"), ("Stockholm", "Sweden"), ("Copenhagen", "Denmark"), ("Warsaw", "Poland"),
          ("Prague", "Czechia"), ("Dublin", "Ireland"), ("London", "United Kingdom"), ("Leeds", "United Kingdom"),
          ("Toronto", "Canada"), ("Chicago", "United States"), ("Austin", "United States"), ("Boston", "United States"),
          ("Tokyo", "Japan"), ("Osaka", "Japan"), ("Seoul", "South Korea"), ("Sydney", "Australia"),
          ("Nairobi", "Kenya"), ("Lagos", "Nigeria"), ("Istanbul", "Turkey"), ("Athens", "Greece")]
JOBS = ("Sales Manager", "Software Engineer", "Head of Finance", "Product Designer", "Operations Lead",
        "Data Analyst", "Marketing Director", "Procurement Officer", "CTO", "Account Executive", "HR Partner",
        "Customer Success Manager", "Research Scientist", "Office Manager")
ITEMS = ("consulting hours", "cloud hosting (monthly)", "laptop stand", "annual software license", "office chairs",
         "printer toner", "network switch", "design workshop", "translation services", "security audit",
         "USB-C cables", "training session", "support plan", "wireless headsets", "data migration",
         "coffee beans (kg)", "standing desk", "server rack", "copywriting", "legal review")
PRODUCTS = ("noise-cancelling headphones", "espresso machine", "mechanical keyboard", "trail running shoes",
            "4K monitor", "robot vacuum", "electric kettle", "camping tent", "smartwatch", "road bike",
            "air purifier", "standing desk", "drone", "bluetooth speaker", "cast iron pan", "office chair")
BRANDS = ("Nordlys", "Kiro", "Altavia", "Brightway", "Solenne", "Tamarack", "Vireo", "Quillon", "Haldor", "Mistral",
          "Parvo", "Ostrava", "Lumio", "Caldera")
CURRENCIES = {"USD": ("$", "US dollars"), "EUR": ("€", "euros"), "GBP": ("£", "pounds"), "JPY": ("¥", "yen"),
              "CHF": ("CHF ", "Swiss francs")}
EVENT_KINDS = ("quarterly planning meeting", "product launch", "team offsite", "customer workshop", "board review",
               "hackathon", "onboarding session", "charity dinner", "design review", "sales kickoff",
               "security training", "book club")
VENUES = ("Room 4.12", "the main auditorium", "Cafe Central", "the rooftop terrace", "Hall B", "the Oak meeting room",
          "the innovation lab", "Hotel Astoria", "the community center", "Studio 3")
MONTHS = ("January February March April May June July August September October November December").split()

# Free-text building blocks. The phrase chosen depends on the document (its
# category, kind, sentiment...), so a model that reads the document predicts
# the prose better than one that only knows the phrase lists.
TICKET_PROBLEMS = {  # (as the customer writes it, as the summary says it)
    "billing": [("I was charged twice for the same order", "was charged twice for the same order"),
                ("there is an unexpected fee on my latest invoice", "sees an unexpected fee on the latest invoice"),
                ("I cannot download last month's invoice", "cannot download the invoice for last month"),
                ("I was billed after cancelling my plan", "was billed after cancelling the plan")],
    "technical": [("syncing fails with an error", "gets an error when syncing data"),
                  ("the device will not connect to my network", "cannot connect the device to the network"),
                  ("the app crashes as soon as it starts", "sees the app crash on start"),
                  ("exports stop halfway through", "finds that exports stop halfway")],
    "account": [("I can't log in since I reset my password", "cannot log in after a password reset"),
                ("I need to hand the account to a colleague", "wants to change the account owner"),
                ("the verification email never arrived", "did not receive the verification email"),
                ("my account got locked without any warning", "sees the account locked without warning")],
    "shipping": [("my parcel still hasn't arrived", "has not received the parcel yet"),
                 ("the package arrived damaged", "received a damaged package"),
                 ("the box contained the wrong item", "got the wrong item in the box"),
                 ("tracking has not updated for a week", "sees no tracking updates for a week")],
    "other": [("I have a question about your privacy policy", "has a question about the privacy policy"),
              ("I'd like to share feedback on the new design", "wants to give feedback on the new design"),
              ("I wonder whether students get a discount", "asks whether there is a student discount"),
              ("I'd like to know your opening hours", "wants to know the opening hours")],
}
TICKET_ACTIONS = {
    "billing": ["refund the duplicate charge", "correct the invoice", "send the missing invoice", "cancel the charge"],
    "technical": ["fix the sync error", "help set up the connection", "provide a working update", "restore the export"],
    "account": ["unlock the account", "transfer ownership", "resend the verification email", "reset the login"],
    "shipping": ["send a replacement", "track down the parcel", "exchange the item", "refund the shipping cost"],
    "other": ["answer the question", "pass the feedback on", "confirm the discount", "share the opening hours"],
}
MOOD = {
    "negative": ["The customer is frustrated and", "The customer is unhappy and", "Clearly annoyed, the customer"],
    "neutral": ["The customer", "The customer calmly", "In a short message the customer"],
    "positive": ["The customer is friendly and", "Despite the issue the customer is positive and", "The customer politely"],
}
PRIORITY_WORDS = {"low": ["whenever you get a chance", "no rush"], "medium": ["this week if possible", "soon"],
                  "high": ["as soon as possible", "today please"], "urgent": ["immediately", "right now, this is critical"]}
SENTIMENT_OPENERS = {"negative": ["I am really disappointed.", "This is unacceptable.", "I'm quite upset about this."],
                     "neutral": ["Hello,", "Hi team,", "Good morning,"],
                     "positive": ["Thanks for the great service so far!", "I love your product.", "Hope you're well!"]}
ADJECTIVES = ("compact", "durable", "lightweight", "quiet", "elegant", "powerful", "versatile", "reliable",
              "energy-efficient", "sturdy")
USES = {"headphones": "long flights and busy offices", "espresso": "a rich cup every morning",
        "keyboard": "fast typing and gaming", "shoes": "muddy trails and long runs", "monitor": "sharp photo editing",
        "vacuum": "keeping floors clean without effort", "kettle": "quick tea and coffee",
        "tent": "weekend trips in any weather", "smartwatch": "tracking workouts and sleep",
        "bike": "daily commutes and weekend rides", "purifier": "cleaner air at home", "desk": "working on your feet",
        "drone": "aerial photos and videos", "speaker": "music at parties and picnics", "pan": "searing and baking",
        "chair": "long days at the desk"}
NOTE_PARTS = {
    "terms": ["Payment is due within 30 days.", "Payment is due within 14 days.", "Please pay by bank transfer.",
              "A late fee of 2% applies after the due date."],
    "extra": ["Thank you for your business.", "Prices include VAT.", "Shipping was free on this order.",
              "Please quote the invoice number with your payment."],
}
EVENT_PURPOSE = {
    "quarterly planning meeting": "set goals for the next quarter", "product launch": "present the new product",
    "team offsite": "build the team and plan the year", "customer workshop": "gather feedback from customers",
    "board review": "review results with the board", "hackathon": "build prototypes in a day",
    "onboarding session": "welcome new colleagues", "charity dinner": "raise money for a local cause",
    "design review": "review the latest designs", "sales kickoff": "launch the new sales year",
    "security training": "learn the new security rules", "book club": "discuss this month's book",
}


@dataclass(frozen=True)
class Example:
    """One training or evaluation example."""

    task: str  # "extract" or "toolcall"
    schema_name: str  # schemas/<name>.json, or "agent_tools"
    prompt: str
    output: str  # compact JSON the model should write
    value: dict[str, Any]  # the ground truth behind ``output``
    freetext_fields: tuple[str, ...] = field(default=())  # keys (dotted) whose values are prose
    source: str = ""  # the document (extraction) or the user's message (tool call)
    tool_names: tuple[str, ...] = ()  # tools shown in the prompt, in order (tool calls)

    @property
    def text(self) -> str:
        return self.prompt + self.output


def _name(r: random.Random) -> str:
    return f"{r.choice(FIRST)} {r.choice(LAST)}"


def _company(r: random.Random) -> str:
    return " ".join(x for x in (r.choice(COMPANY_A), r.choice(COMPANY_B), r.choice(SUFFIX)) if x)


def _date(r: random.Random) -> tuple[str, str]:
    y, m, d = r.randint(2023, 2027), r.randint(1, 12), r.randint(1, 28)
    iso = f"{y:04d}-{m:02d}-{d:02d}"
    style = r.randrange(3)
    shown = iso if style == 0 else (f"{d} {MONTHS[m - 1]} {y}" if style == 1 else f"{MONTHS[m - 1]} {d}, {y}")
    return iso, shown


def _money(r: random.Random, lo: float, hi: float) -> float:
    x = round(r.uniform(lo, hi), 2) if r.random() < 0.7 else r.randint(int(lo) + 1, int(hi))
    return int(x) if x == int(x) else x  # JSON writes 12, not 12.0, as a document would


def _fmt_amount(x: float) -> str:
    return f"{x:.2f}" if x != int(x) else f"{int(x)}"


def _sentences(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def gen_invoice(r: random.Random) -> tuple[dict[str, Any], str]:
    vendor, customer = _company(r), (_company(r) if r.random() < 0.7 else _name(r))
    cur = r.choice(list(CURRENCIES))
    sym = CURRENCIES[cur][0]
    iso, shown = _date(r)
    items: list[dict[str, Any]] = []
    for desc in r.sample(ITEMS, r.randint(1, 4)):
        items.append({"description": desc, "quantity": r.randint(1, 12), "unit_price": _money(r, 5, 900)})
    total = round(sum(i["quantity"] * i["unit_price"] for i in items), 2)
    total = int(total) if total == int(total) else total
    terms, extra = r.choice(NOTE_PARTS["terms"]), r.choice(NOTE_PARTS["extra"])
    number = f"INV-{r.randint(2023, 2027)}-{r.randint(1, 9999):04d}"
    lines = "\n".join(f"{i['quantity']} x {i['description']} @ {sym}{_fmt_amount(i['unit_price'])}" for i in items)
    style = r.randrange(3)
    if style == 0:
        doc = (f"INVOICE {number}\nFrom: {vendor}\nBill to: {customer}\nDate: {shown}\n{lines}\n"
               f"Total due: {sym}{_fmt_amount(total)} ({cur})\n{terms} {extra}")
    elif style == 1:
        doc = (f"Dear {customer},\nplease find attached invoice {number} from {vendor}, dated {shown}.\n{lines}\n"
               f"The amount due is {_fmt_amount(total)} {CURRENCIES[cur][1]}. {terms}\n{extra}")
    else:
        doc = (f"{vendor} | Invoice no. {number} | issued {shown}\nCustomer: {customer}\nItems:\n{lines}\n"
               f"TOTAL {cur} {_fmt_amount(total)}\n{extra} {terms}")
    notes = _sentences(terms, extra) if r.random() < 0.5 else _sentences(extra, terms)
    value = {"invoice_number": number, "issue_date": iso, "vendor": vendor, "customer": customer, "currency": cur,
             "line_items": items, "total": total, "notes": notes}
    return value, doc


def gen_contact(r: random.Random) -> tuple[dict[str, Any], str]:
    first, last = r.choice(FIRST), r.choice(LAST)
    company = _company(r)
    domain = company.split()[0].lower() + r.choice([".com", ".io", ".de", ".co.uk", ".org"])
    email = f"{first.lower()}.{last.lower()}@{domain}" if r.random() < 0.6 else f"{first[0].lower()}{last.lower()}@{domain}"
    phone = f"+{r.randint(1, 49)} {r.randint(100, 999)} {r.randint(1000000, 9999999)}"
    city, country = r.choice(CITIES)
    job = r.choice(JOBS)
    channel = r.choice(["email", "phone", "any"])
    pref = {"email": r.choice(["Best reached by email.", "Prefers email over calls."]),
            "phone": r.choice(["Please call rather than email.", "Prefers a phone call."]),
            "any": r.choice(["Happy to be reached by phone or email.", "Any channel works."])}[channel]
    style = r.randrange(3)
    if style == 0:
        doc = f"--\n{first} {last}\n{job}, {company}\n{city}, {country}\nT: {phone}\nE: {email}\n{pref}"
    elif style == 1:
        doc = (f"Met {first} {last} at the fair. {first} works as {job} at {company} in {city} ({country}). "
               f"Phone {phone}, email {email}. {pref}")
    else:
        doc = f"Name: {first} {last}\nCompany: {company}\nRole: {job}\nLocation: {city}, {country}\nContact: {email} / {phone}\nNote: {pref}"
    value = {"name": f"{first} {last}", "email": email, "phone": phone, "company": company, "job_title": job,
             "city": city, "country": country, "preferred_channel": channel}
    return value, doc


def gen_event(r: random.Random) -> tuple[dict[str, Any], str]:
    kind = r.choice(EVENT_KINDS)
    org = _company(r) if r.random() < 0.5 else _name(r)
    title = f"{r.choice(COMPANY_A)} {kind.title()}" if r.random() < 0.6 else kind.capitalize()
    iso, shown = _date(r)
    hh, mm = r.randint(7, 20), r.choice([0, 15, 30, 45])
    dur = r.choice([30, 45, 60, 90, 120, 180, 240])
    online = r.random() < 0.35
    loc = "Online (video call)" if online else f"{r.choice(VENUES)}, {r.choice(CITIES)[0]}"
    people = [_name(r) for _ in range(r.randint(0, 4))]
    purpose = EVENT_PURPOSE[kind]
    who = f"Invited: {', '.join(people)}." if people else "Everyone is welcome."
    style = r.randrange(2)
    if style == 0:
        doc = (f"Subject: {title}\nHi all, {org} invites you to the {kind} on {shown} at {hh:02d}:{mm:02d} "
               f"for {dur} minutes, {'online' if online else 'at ' + loc}. We will {purpose}. {who}")
    else:
        doc = (f"{title}\nWhen: {shown}, {hh:02d}:{mm:02d} ({dur} min)\nWhere: {loc}\nHost: {org}\n"
               f"Goal: {purpose}.\n{who}")
    summary = _sentences(f"{org} hosts a {kind} to {purpose}.",
                         r.choice(["It takes place online." if online else f"It takes place at {loc}.",
                                   f"It lasts {dur} minutes."]))
    value = {"title": title, "date": iso, "start_time": f"{hh:02d}:{mm:02d}", "duration_minutes": dur,
             "location": loc, "organizer": org, "attendees": people, "is_online": online, "summary": summary}
    return value, doc


def gen_ticket(r: random.Random) -> tuple[dict[str, Any], str]:
    cat = r.choice(list(TICKET_PROBLEMS))
    prio = r.choice(list(PRIORITY_WORDS))
    sent = r.choice(list(SENTIMENT_OPENERS))
    i = r.randrange(4)
    (said, problem), action = TICKET_PROBLEMS[cat][i], TICKET_ACTIONS[cat][r.randrange(4) if r.random() < 0.3 else i]
    name = _name(r)
    product = (f"{r.choice(BRANDS)} {r.choice(PRODUCTS)}" if r.random() < 0.6
               else f"{r.choice(COMPANY_A)} Cloud {r.choice(['Basic', 'Pro', 'Team'])}")
    tid = f"TCK-{r.randint(10000, 99999)}"
    doc = (f"Ticket {tid} from {name}\n{r.choice(SENTIMENT_OPENERS[sent])} I'm writing about my {product}: "
           f"{said}. Could you please {action} {r.choice(PRIORITY_WORDS[prio])}?")
    summary = _sentences(f"{r.choice(MOOD[sent])} {problem} with the {product}.",
                         r.choice(["", f"This is {'an' if cat[0] in 'aeiou' else 'a'} {cat} issue.", f"The ticket is marked {prio}."]))
    value = {"ticket_id": tid, "customer_name": name, "product": product, "category": cat, "priority": prio,
             "sentiment": sent, "summary": summary, "requested_action": action.capitalize() + "."}
    return value, doc


def gen_listing(r: random.Random) -> tuple[dict[str, Any], str]:
    prod, brand = r.choice(PRODUCTS), r.choice(BRANDS)
    model = f"{brand} {r.choice(['Pro', 'Air', 'One', 'X', 'Lite', 'Max', 'S2', '300'])} {prod}"
    cur = r.choice(list(CURRENCIES))
    price = _money(r, 10, 2000)
    stock = r.random() < 0.7
    cond = r.choice(["new", "new", "used", "refurbished"])
    rating = None if r.random() < 0.2 else round(r.uniform(2.5, 5.0), 1)
    adj = r.sample(ADJECTIVES, 2)
    use = next(v for k, v in USES.items() if k in prod)
    doc = (f"{model}\nby {brand} - {cond}\nPrice: {CURRENCIES[cur][0]}{_fmt_amount(price)} ({cur})\n"
           f"{'In stock, ships tomorrow' if stock else 'Currently out of stock'}\n"
           f"{'Rating: ' + str(rating) + '/5' if rating is not None else 'No reviews yet'}\n"
           f"A {adj[0]} and {adj[1]} {prod}, made for {use}.")
    desc = _sentences(f"The {model} is a {adj[0]}, {adj[1]} {prod} for {use}.",
                      {"new": "It is sold new.", "used": "It is a used unit.", "refurbished": "It is refurbished."}[cond],
                      r.choice(["", "It ships quickly." if stock else "It is out of stock right now."]))
    value = {"name": model, "brand": brand, "price": price, "currency": cur, "in_stock": stock, "condition": cond,
             "rating": rating, "description": desc}
    return value, doc


GENERATORS: dict[str, Callable[[random.Random], tuple[dict[str, Any], str]]] = {
    "invoice": gen_invoice, "contact": gen_contact, "event": gen_event, "support_ticket": gen_ticket,
    "product_listing": gen_listing,
}
SUMMARY_KIND = {"invoice": "invoice", "contact": "contact", "event": "event", "support_ticket": "ticket",
                "product_listing": "listing"}
FREETEXT = {"invoice": ("notes",), "event": ("summary",), "support_ticket": ("summary",),
            "product_listing": ("description",), "contact": ()}


def summarize(r: random.Random, kind: str, v: dict[str, Any]) -> str:
    """Three or four sentences of prose about a document, built from its facts."""
    if kind == "invoice":
        n = len(v["line_items"])
        return _sentences(
            f"{v['vendor']} billed {v['customer']} on {v['issue_date']}.",
            f"The invoice lists {n} item{'s' if n > 1 else ''}, including {v['line_items'][0]['description']}.",
            f"The total is {_fmt_amount(v['total'])} {v['currency']}.", v["notes"].split(".")[0] + ".")
    if kind == "contact":
        return _sentences(f"{v['name']} is {v['job_title']} at {v['company']}.",
                          f"They are based in {v['city']}, {v['country']}.",
                          {"email": "Email is the best way to reach them.", "phone": "They prefer a phone call.",
                           "any": "Any channel works for them."}[v["preferred_channel"]])
    if kind == "event":
        return _sentences(v["summary"], f"It starts at {v['start_time']} on {v['date']}.",
                          f"{len(v['attendees'])} people are invited." if v["attendees"] else "Everyone is welcome.")
    if kind == "support_ticket":
        return _sentences(v["summary"], f"They ask us to {v['requested_action'][0].lower() + v['requested_action'][1:]}",
                          f"Priority: {v['priority']}.")
    return _sentences(v["description"], f"It costs {_fmt_amount(v['price'])} {v['currency']}.",
                      "It has no reviews yet." if v["rating"] is None else f"Buyers rate it {v['rating']} out of 5.")


TOOL_REQUESTS: dict[str, Callable[[random.Random], tuple[dict[str, Any], str]]] = {}


def _tool(name: str):
    def deco(fn):
        TOOL_REQUESTS[name] = fn
        return fn
    return deco


@_tool("get_weather")
def _weather(r: random.Random):
    city = r.choice(CITIES)[0]
    unit = r.choice(["celsius", "fahrenheit"])
    u = {"celsius": r.choice(["in Celsius", "in °C", ""]), "fahrenheit": r.choice(["in Fahrenheit", "in °F"])}[unit]
    msg = r.choice([f"What's the weather like in {city} right now{' ' + u if u else ''}?",
                    f"Is it raining in {city}? Give me the temperature {u or 'in Celsius'}."])
    if not u and "Celsius" not in msg:
        unit = "celsius"
    return {"city": city, "unit": unit}, msg


@_tool("search_flights")
def _flights(r: random.Random):
    (a, _), (b, _) = r.sample(CITIES, 2)
    iso, shown = _date(r)
    n = r.randint(1, 4)
    msg = r.choice([f"Find me flights from {a} to {b} on {shown} for {n} {'person' if n == 1 else 'people'}.",
                    f"I need to fly {a} -> {b}, {shown}, {n} passenger{'s' if n > 1 else ''}."])
    return {"origin": a, "destination": b, "date": iso, "passengers": n}, msg


@_tool("create_event")
def _create_event(r: random.Random):
    kind = r.choice(EVENT_KINDS)
    iso, shown = _date(r)
    hh, mm = r.randint(7, 20), r.choice([0, 30])
    dur = r.choice([30, 60, 90])
    msg = f"Put a {kind} in my calendar on {shown} at {hh:02d}:{mm:02d}, {dur} minutes."
    return {"title": kind.capitalize(), "date": iso, "time": f"{hh:02d}:{mm:02d}", "duration_minutes": dur}, msg


@_tool("send_email")
def _send_email(r: random.Random):
    first, last = r.choice(FIRST), r.choice(LAST)
    to = f"{first.lower()}.{last.lower()}@{r.choice(COMPANY_A).lower()}.com"
    kind = r.choice(EVENT_KINDS)
    iso, shown = _date(r)
    subject = f"{kind.capitalize()} on {shown}"
    body = _sentences(f"Hi {first},", f"a quick reminder about the {kind} on {shown}.",
                      r.choice(["Please bring your notes.", "Let me know if you can make it.",
                                "The agenda follows soon."]), "Best regards")
    msg = f"Email {to} about the {kind} on {shown}. Say hi to {first} and {body.split('. ', 1)[-1].split('.')[0].lower()}."
    return {"to": to, "subject": subject, "body": body}, msg


@_tool("lookup_order")
def _lookup_order(r: random.Random):
    oid = f"ORD-{r.randint(100000, 999999)}"
    msg = r.choice([f"Where is my order {oid}?", f"Can you check the status of order {oid} please?"])
    return {"order_id": oid}, msg


@_tool("convert_currency")
def _convert(r: random.Random):
    a, b = r.sample(list(CURRENCIES), 2)
    amt = _money(r, 1, 5000)
    msg = r.choice([f"How much is {_fmt_amount(amt)} {a} in {b}?", f"Convert {_fmt_amount(amt)} {CURRENCIES[a][1]} to {CURRENCIES[b][1]}."])
    return {"amount": amt, "from_currency": a, "to_currency": b}, msg


def make_extraction(r: random.Random, name: str, schemas: dict[str, dict]) -> Example:
    value, doc = GENERATORS[name](r)
    if r.random() < 0.22:  # the free-text workload: a summary of the same documents
        out = {"kind": SUMMARY_KIND[name], "summary": summarize(r, name, value)}
        return Example("extract", "summary", extraction_prompt(schemas["summary"], doc), compact_json(out), out,
                       ("summary",), source=doc)
    return Example("extract", name, extraction_prompt(schemas[name], doc), compact_json(value), value, FREETEXT[name],
                   source=doc)


def make_toolcall(r: random.Random, tools: list[ToolSpec]) -> Example:
    name = r.choice(sorted(TOOL_REQUESTS))
    args, msg = TOOL_REQUESTS[name](r)
    shown = [t for t in tools if t.name == name] + r.sample([t for t in tools if t.name != name], r.randint(1, len(tools) - 1))
    r.shuffle(shown)
    call = {"name": name, "arguments": args}
    free = ("arguments.body",) if name == "send_email" else ()
    return Example("toolcall", "agent_tools", toolcall_prompt(shown, [("user", msg)]), compact_json(call), call, free,
                   source=msg, tool_names=tuple(t.name for t in shown))


def triage_from_ticket(ticket: Example, r: random.Random) -> Example:
    """A ``ticket_triage`` example (a short output: the queue and a confidence) from a support-ticket one.

    Not part of the training corpus: the triage schema came after the demo pair was trained, and
    the corpus must stay what trained it. The confidence is no ground truth (it is not scored)."""
    value = {"label": ticket.value["category"], "confidence": r.choice(["medium", "high", "high"])}
    return Example("extract", "ticket_triage", "", compact_json(value), value, ("confidence",), source=ticket.source)


def generate(seed: int, n: int, toolcall_share: float = 0.2) -> list[Example]:
    """``n`` examples from one seed; the same seed gives the same list."""
    r = random.Random(seed)
    schemas = load_builtin_schemas()
    tools = [ToolSpec.from_openai(t) for t in load_builtin_tools()]
    names = sorted(GENERATORS)
    out = []
    for _ in range(n):
        if r.random() < toolcall_share:
            out.append(make_toolcall(r, tools))
        else:
            out.append(make_extraction(r, r.choice(names), schemas))
    return out


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Leaf values by dotted path: how field accuracy is scored."""
    if isinstance(value, dict):
        items: dict[str, Any] = {}
        for k, v in value.items():
            items.update(flatten(v, f"{prefix}{k}."))
        return items
    if isinstance(value, list):
        items = {}
        for i, v in enumerate(value):
            items.update(flatten(v, f"{prefix}{i}."))
        return items or {prefix.rstrip("."): []}
    return {prefix.rstrip("."): value}
