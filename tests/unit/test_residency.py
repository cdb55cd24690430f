"""The residency policy over random households of models and requests: the budget always holds,
pinned and busy models stay, the voice model is not unloaded for background work while the
household speaks, and every request whose model fits is eventually served."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hearth.policy.residency import ModelView, Plan, ResidencyPolicy
from hearth.policy.scheduler import BACKGROUND_RANK, VOICE_RANK

MIB = 2**20


def apply(models: dict[str, ModelView], plan: Plan) -> None:
    for name in plan.unload:
        models[name].loaded = False
    if plan.load:
        models[plan.load].loaded = True


def test_lru_victim_and_only_as_many_as_needed():
    policy = ResidencyPolicy(budget_bytes=1000 * MIB)
    models = [ModelView("a", 400 * MIB, loaded=True, last_used=5),
              ModelView("b", 400 * MIB, loaded=True, last_used=1),
              ModelView("c", 300 * MIB)]
    plan = policy.plan(models, "c", BACKGROUND_RANK, now=10)
    assert plan == Plan(load="c", unload=["b"])


def test_voice_model_stays_for_a_background_request_while_voice_is_recent():
    policy = ResidencyPolicy(budget_bytes=500 * MIB, interactive_grace_s=300)
    voice = ModelView("voice", 400 * MIB, loaded=True, last_used=90, interactive_at=90)
    big = ModelView("summary", 400 * MIB)
    assert policy.plan([voice, big], "summary", BACKGROUND_RANK, now=100).wait
    # A voice request for another model may take it; so may background after the grace.
    assert policy.plan([voice, big], "summary", VOICE_RANK, now=100).unload == ["voice"]
    assert policy.plan([voice, big], "summary", BACKGROUND_RANK, now=500).unload == ["voice"]


def test_pinned_and_busy_stay_and_too_big_is_an_error():
    policy = ResidencyPolicy(budget_bytes=500 * MIB)
    pinned = ModelView("p", 300 * MIB, loaded=True, pinned=True)
    busy = ModelView("b", 200 * MIB, loaded=True, busy=1)
    other = ModelView("o", 100 * MIB)
    assert policy.plan([pinned, busy, other], "o", VOICE_RANK, now=0).wait
    huge = ModelView("h", 600 * MIB)
    assert "budget" in (policy.plan([pinned, huge], "h", VOICE_RANK, now=0).error or "")


def test_keep_alive_expiry():
    policy = ResidencyPolicy(budget_bytes=10**12)
    models = [ModelView("idle", 1, loaded=True, last_used=0, keep_alive_s=60),
              ModelView("fresh", 1, loaded=True, last_used=50, keep_alive_s=60),
              ModelView("pinned", 1, loaded=True, pinned=True, last_used=0, keep_alive_s=60),
              ModelView("forever", 1, loaded=True, last_used=0, keep_alive_s=None),
              ModelView("busy", 1, loaded=True, busy=2, last_used=0, keep_alive_s=60)]
    assert policy.expired(models, now=100) == ["idle"]


events = st.lists(st.tuples(st.sampled_from(["request", "finish", "tick"]),
                            st.integers(0, 3), st.sampled_from([VOICE_RANK, BACKGROUND_RANK])),
                  min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(50, 600), min_size=2, max_size=4),
       pinned=st.integers(-1, 3), budget=st.integers(600, 1500), script=events)
def test_random_households_keep_every_rule(sizes, pinned, budget, script):
    policy = ResidencyPolicy(budget_bytes=budget * MIB, interactive_grace_s=30)
    models = {f"m{i}": ModelView(f"m{i}", s * MIB, pinned=i == pinned, keep_alive_s=20)
              for i, s in enumerate(sizes)}
    if pinned in range(len(sizes)) and sizes[pinned] <= budget:
        models[f"m{pinned}"].loaded = True
    waiting: list[tuple[str, int]] = []
    now = 0.0
    for kind, index, rank in script:
        now += 5
        name = f"m{index % len(sizes)}"
        m = models[name]
        if kind == "request":
            waiting.append((name, rank))
        elif kind == "finish" and m.busy:
            m.busy -= 1
        elif kind == "tick":
            for gone in policy.expired(models.values(), now):
                assert not models[gone].pinned and not models[gone].busy
                models[gone].loaded = False
        # Serve what can be served, in arrival order.
        still = []
        for want, r in waiting:
            before = {k: v.loaded for k, v in models.items()}
            plan = policy.plan(list(models.values()), want, r, now)
            for victim in plan.unload:
                v = models[victim]
                assert not v.pinned and not v.busy, "unloaded a pinned or busy model"
                recent = v.interactive_at is not None and now - v.interactive_at < 30
                assert not (recent and r == BACKGROUND_RANK), "voice model dropped for background"
            apply(models, plan)
            assert policy.used(models.values()) <= policy.budget_bytes
            pinned_bytes = sum(v.bytes for v in models.values() if v.pinned and v.loaded)
            if plan.error:
                assert models[want].bytes > policy.budget_bytes - pinned_bytes
            elif plan.wait:
                assert before == {k: v.loaded for k, v in models.items()}
                still.append((want, r))
            else:
                assert models[want].loaded
                models[want].busy += 1
                models[want].last_used = now
                if r == VOICE_RANK:
                    models[want].interactive_at = now
        waiting = still
    # Liveness: once all work is done and the grace has passed, no request waits: each one's
    # model is loaded (it fits beside the pinned one) or refused.
    for m in models.values():
        m.busy = 0
    now += 1000
    for want, r in waiting:
        plan = policy.plan(list(models.values()), want, r, now)
        assert not plan.wait, (want, plan)
        apply(models, plan)
        assert policy.used(models.values()) <= policy.budget_bytes


def test_a_model_being_unloaded_is_never_picked_again():
    """Its unload is under way (the keep-alive sweep's, or another load's): it is neither a
    victim of the next load nor expired again, and its memory counts until it is gone."""
    policy = ResidencyPolicy(budget_bytes=100)
    models = [ModelView("a", 60, loaded=True, unloading=True), ModelView("b", 60)]
    plan = policy.plan(models, "b", BACKGROUND_RANK, now=1000.0)
    assert plan.wait and not plan.unload and plan.load is None
    assert policy.expired(models, now=1e9) == []
