"""The household workload: a seeded trace of sessions built from a JSON definition.

A *session* is what one household member (or device) does: a voice command (one call), a chat
(several turns with reading/typing time between them), an agent run (several short calls with
tool time between them), a summary of a document, or an embedding batch. Sessions arrive as a
Poisson process per class; inside a session each call is sent when the previous one has finished
plus the scripted pause, as a real client would.

All text is generated here from the vocabulary in the definition with one ``random.Random`` per
class (seeded by ``seed`` and the class name), so the trace is the same on every machine and every
run, and a shorter run's trace is a prefix of a longer one. Earlier assistant turns and tool
results are scripted rather than taken from the model's output, so every mode replays exactly the
same prompts.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CLASSES = ("voice", "chat", "agent", "background", "embedding")
DEFAULT_WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "household.json"


@dataclass
class Call:
    max_tokens: int = 0
    messages: list[dict[str, str]] | None = None  # chat completion
    inputs: list[str] | None = None  # embeddings
    delay_s: float = 0.0  # pause after the previous call of the session finished


@dataclass
class Session:
    id: str
    cls: str
    user: str
    start_s: float
    calls: list[Call]
    meta: dict[str, Any] = field(default_factory=dict)


def load_spec(path: str | Path = DEFAULT_WORKLOAD) -> dict[str, Any]:
    spec = json.loads(Path(path).read_text())
    for cls in spec["classes"]:
        if cls not in CLASSES:
            raise ValueError(f"unknown class {cls!r} in {path}")
    return spec


def approx_tokens(text: str, chars_per_token: float) -> int:
    return max(1, round(len(text) / chars_per_token))


class TextMaker:
    """Deterministic household prose and Home-Assistant-style prompts from the vocabulary."""

    def __init__(self, spec: dict[str, Any], rng: random.Random):
        self.spec = spec
        self.rng = rng
        self.prose = spec["prose"]
        self.home = spec["home"]
        self.cpt = spec["chars_per_token"]

    # -- prose ------------------------------------------------------------------------------
    def fill(self, template: str, **extra: str) -> str:
        r, p = self.rng, self.prose
        area = r.choice(self.home["areas"])
        values = {"subject": r.choice(p["subjects"]), "object": r.choice(p["objects"]),
                  "time": r.choice(p["times"]), "n": str(r.randint(2, 90)),
                  "area": area["name"].lower(), "floor": area["floor"].lower(), **extra}
        return template.format(**values)

    def sentence(self) -> str:
        r, p = self.rng, self.prose
        s = (f"{r.choice(p['subjects'])} {r.choice(p['verbs'])} {r.choice(p['objects'])} "
             f"{r.choice(p['times'])}, {self.fill(r.choice(p['details']))}.")
        return s[0].upper() + s[1:]

    def paragraph(self, sentences: int) -> str:
        return " ".join(self.sentence() for _ in range(sentences))

    def words(self, n: int) -> str:
        """About ``n`` words of prose (whole sentences)."""
        out: list[str] = []
        while sum(len(s.split()) for s in out) < n:
            out.append(self.sentence())
        return " ".join(out)

    def document(self, tokens: int) -> tuple[str, str]:
        kind = self.rng.choice(self.prose["doc_kinds"])
        parts = [f"{kind.capitalize()}, {self.home['family']} household"]
        while approx_tokens("\n\n".join(parts), self.cpt["prose"]) < tokens:
            parts.append(self.paragraph(self.rng.randint(3, 6)))
        return kind, "\n\n".join(parts)

    # -- Home Assistant -------------------------------------------------------------------------
    def entities(self, tokens: int) -> list[dict[str, Any]]:
        """Exposed entities, area by area, until their listing is about ``tokens`` long."""
        r = self.rng
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        listing_tokens = 0
        while listing_tokens < tokens:
            area = r.choice(self.home["areas"])
            dev = r.choice(self.home["devices"])
            name = dev["name"].format(area=area["name"])
            if name in seen:
                if len(seen) >= len(self.home["areas"]) * len(self.home["devices"]):
                    break
                continue
            seen.add(name)
            attrs = {}
            for k, v in dev.get("attrs", {}).items():
                attrs[k] = r.randint(v[0], v[1]) if isinstance(v[0], int) else r.choice(v)
            ent = {"name": name, "domain": dev["domain"], "area": area["name"],
                   "floor": area["floor"], "state": r.choice(dev["states"]), "attrs": attrs}
            out.append(ent)
            listing_tokens += approx_tokens(entity_line(ent), self.cpt["entities"])
        return out

    def command(self, entities: list[dict[str, Any]]) -> str:
        r = self.rng
        ent = r.choice(entities)
        templates = self.home["commands"].get(ent["domain"]) or ["what is the state of {name}"]
        text = r.choice(templates).format(name=ent["name"].lower(), area=ent["area"].lower(),
                                          pct=r.choice([10, 25, 30, 50, 70]),
                                          temp=r.randint(17, 23))
        question = text.startswith(("is ", "are ", "what", "how"))
        return text[0].upper() + text[1:] + ("?" if question else ".")


def entity_line(e: dict[str, Any]) -> str:
    attrs = "".join(f"\n  {k}: {v}" for k, v in e["attrs"].items())
    return (f"- name: {e['name']}\n  id: {e['domain']}.{e['name'].lower().replace(' ', '_')}\n"
            f"  area: {e['area']}\n  state: {e['state']}{attrs}")


def voice_system_prompt(spec: dict[str, Any], satellite: dict[str, str],
                        entities: list[dict[str, Any]]) -> str:
    """A Home-Assistant-style voice prompt: instructions, the satellite's place, the entities."""
    family = spec["home"]["family"]
    head = (
        f"You are the voice of the {family} family's smart home, running on Home Assistant.\n"
        f"This request comes from the voice satellite in the {satellite['area']} "
        f"({satellite['floor']}). Commands that name no area, such as 'lights off', mean the "
        f"{satellite['area']}.\n"
        "Rules:\n"
        "- Reply in one short spoken sentence without lists, markdown or emoji; the reply is "
        "read aloud.\n"
        "- To change a device, call a tool; never claim a change you did not make.\n"
        "- Refer to devices by the names below; if two devices could match, ask which one.\n"
        "- Answer questions about states from the listing; it is current as of this request.\n"
        "- If a request is unsafe or impossible, say so briefly.\n"
        "Tools: turn_on(entity), turn_off(entity), set_brightness(entity, percent), "
        "set_temperature(entity, degrees), set_cover_position(entity, position), lock(entity), "
        "unlock(entity), media_pause(entity), media_play(entity, query), "
        "set_volume(entity, percent), get_state(entity).\n"
        "Exposed entities:\n"
    )
    return head + "\n".join(entity_line(e) for e in entities)


def agent_system_prompt(spec: dict[str, Any], entities: list[dict[str, Any]]) -> str:
    tools = "\n".join(f"- {t['name']}({t['args']}): {t['about']}" for t in spec["prose"]["tools"])
    names = ", ".join(f"{e['domain']}.{e['name'].lower().replace(' ', '_')}" for e in entities)
    return (
        "You are an automation agent for a household running Home Assistant. Work step by step. "
        "In each reply either call exactly one tool, as one line of JSON "
        '{"tool": <name>, "args": {...}}, or, when the task is done, give a one-sentence '
        "report that starts with DONE.\n"
        f"Tools:\n{tools}\n"
        f"Entities you may use: {names}."
    )


def _uniform(rng: random.Random, bounds: list[float]) -> float:
    return round(rng.uniform(bounds[0], bounds[1]), 3)


def _pick_user(rng: random.Random, weights: dict[str, float]) -> str:
    users = sorted(weights)
    return rng.choices(users, weights=[weights[u] for u in users])[0]


def _arrivals(rng: random.Random, rate_per_min: float, duration_s: float) -> list[float]:
    out: list[float] = []
    if rate_per_min <= 0:
        return out
    t = 0.0
    while True:
        t += rng.expovariate(rate_per_min / 60.0)
        if t >= duration_s:
            return out
        out.append(round(t, 3))


def generate(spec: dict[str, Any], duration_s: float, load: float = 1.0,
             seed: int | None = None) -> list[Session]:
    """The trace: every session of every class starting within ``duration_s``, by start time.

    ``load`` scales every class's arrival rate (1.0 = the rates in the definition).
    """
    seed = spec["seed"] if seed is None else seed
    classes = spec["classes"]
    sessions: list[Session] = []
    # The home (entities, satellite prompts) is shared by every class: its own stream.
    home_rng = random.Random(f"{seed}:home")
    home = TextMaker(spec, home_rng)
    voice_spec = classes.get("voice", {})
    sats = voice_spec.get("satellites", [{"id": "satellite", "area": "Kitchen",
                                          "floor": "Ground floor"}])
    budget = voice_spec.get("system_prompt_tokens", 1200)
    sample = voice_system_prompt(spec, sats[0], [])
    entities = home.entities(budget - approx_tokens(sample, spec["chars_per_token"]["prose"]))
    prompts = {s["id"]: voice_system_prompt(spec, s, entities) for s in sats}
    agent_prompt = agent_system_prompt(spec, entities)

    for cls in CLASSES:
        c = classes.get(cls)
        if not c:
            continue
        # Separate streams for arrival times and content: session i has the same content
        # whatever the duration or load.
        arrivals = _arrivals(random.Random(f"{seed}:{cls}:arrivals"), c["rate_per_min"] * load,
                             duration_s)
        rng = random.Random(f"{seed}:{cls}")
        text = TextMaker(spec, rng)
        for i, t in enumerate(arrivals):
            user = _pick_user(rng, c["users"])
            sid = f"{cls}-{i:03d}"
            if cls == "voice":
                sat = rng.choice(sats)
                msgs = [{"role": "system", "content": prompts[sat["id"]]},
                        {"role": "user", "content": text.command(entities)}]
                calls = [Call(max_tokens=rng.randint(*c["max_tokens"]), messages=msgs)]
                meta: dict[str, Any] = {"satellite": sat["id"]}
            elif cls == "chat":
                calls, meta = _chat(spec, c, rng, text)
            elif cls == "agent":
                calls, meta = _agent(spec, c, rng, text, agent_prompt)
            elif cls == "background":
                kind, doc = text.document(rng.randint(*c["doc_tokens"]))
                msgs = [{"role": "system", "content": "You summarise documents for a household. "
                         "Write a short summary with the decisions and dates that matter."},
                        {"role": "user", "content": f"Summarise this {kind}:\n\n{doc}"}]
                calls = [Call(max_tokens=rng.randint(*c["max_tokens"]), messages=msgs)]
                meta = {"document": kind}
            else:  # embedding
                inputs = [text.words(rng.randint(*c["text_words"])) for _ in range(c["batch"])]
                calls = [Call(inputs=inputs)]
                meta = {}
            sessions.append(Session(sid, cls, user, t, calls, meta))
    sessions.sort(key=lambda s: (s.start_s, s.id))
    return sessions


def _chat(spec: dict[str, Any], c: dict[str, Any], rng: random.Random,
          text: TextMaker) -> tuple[list[Call], dict[str, Any]]:
    p = spec["prose"]
    history: list[dict[str, str]] = [
        {"role": "system", "content": f"You are Hearth, the {spec['home']['family']} family's "
         "home assistant. Be friendly, practical and concise."}]
    calls: list[Call] = []
    turns = rng.randint(*c["turns"])
    for k in range(turns):
        ask = text.fill(rng.choice(p["chat_requests"] if k == 0 else p["chat_followups"]))
        history.append({"role": "user", "content": ask})
        calls.append(Call(max_tokens=rng.randint(*c["max_tokens"]), messages=list(history),
                          delay_s=0.0 if k == 0 else _uniform(rng, c["think_s"])))
        # The scripted reply that the next turn carries as history.
        history.append({"role": "assistant",
                        "content": text.words(rng.randint(*c["reply_words"]))})
    return calls, {"turns": turns}


def _agent(spec: dict[str, Any], c: dict[str, Any], rng: random.Random, text: TextMaker,
           system: str) -> tuple[list[Call], dict[str, Any]]:
    tools = spec["prose"]["tools"]
    history = [{"role": "system", "content": system},
               {"role": "user", "content": text.fill(rng.choice(spec["prose"]["agent_tasks"]))}]
    calls: list[Call] = []
    n = rng.randint(*c["calls"])
    for k in range(n):
        calls.append(Call(max_tokens=rng.randint(*c["max_tokens"]), messages=list(history),
                          delay_s=0.0 if k == 0 else _uniform(rng, c["tool_s"])))
        tool = rng.choice(tools)
        history.append({"role": "assistant",
                        "content": json.dumps({"tool": tool["name"], "args": {}})})
        history.append({"role": "user", "content": f"Result of {tool['name']}: "
                        + text.paragraph(rng.randint(1, 2))})
    return calls, {"calls": n}


def describe(sessions: list[Session]) -> dict[str, dict[str, float]]:
    """Counts per class: sessions, calls, and (approximate) prompt characters."""
    out: dict[str, dict[str, float]] = {}
    for s in sessions:
        d = out.setdefault(s.cls, {"sessions": 0, "calls": 0, "max_tokens": 0})
        d["sessions"] += 1
        d["calls"] += len(s.calls)
        d["max_tokens"] += sum(c.max_tokens for c in s.calls)
    return {c: out[c] for c in CLASSES if c in out}


def to_json(sessions: list[Session]) -> list[dict[str, Any]]:
    return [asdict(s) for s in sessions]
