"""Host cost flat in the queue's length (issue 28): an admission pass looks at a few requests
per (class, member), not at every waiting request, and its order is exactly the policy's.
Counted in calls, not timed (the times are in bench/engine_bench.py --only host)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sim_backend import SimBackend, make_core, request

from hearth.policy.queue import WaitQueue
from hearth.policy.scheduler import Policy, PolicyConfig
from hearth.shared.requests import Request

CLASSES = ("chat", "agent", "background")


def _keys_per_pass(waiting: int, free_slot: bool) -> float:
    b = SimBackend(n_ctx=65536, n_seq_max=16)
    core, _ = make_core("hearth", n_parallel=8, backend=b, max_queue=1000)
    for i in range(8):
        r, _ = request(b, "chat", 30, 10**6, user=f"m{i % 4}", seed=i)
        core.submit(r)
    core.step()
    for j in range(waiting):
        r, _ = request(b, CLASSES[j % 3], 40, 5, user=f"m{j % 4}", seed=100 + j)
        core.submit(r)
    core.step()
    calls = [0]
    key = core.policy.key

    def counted(*a, **k):
        calls[0] += 1
        return key(*a, **k)

    core.policy.key = counted  # type: ignore[method-assign]
    passes = 20
    for _ in range(passes):
        if free_slot:  # a slot comes free: the pass admits one
            core._finish(core.running[0], "stop", b.t)
        core.admitter.changed()
        core.step()
    return calls[0] / passes


def test_a_pass_with_every_slot_taken_looks_at_one_request_per_class_and_member():
    """8 streams hold every slot; 250 wait (3 classes × 4 members), none of whom may preempt:
    a pass computed 250 keys (and asked for two victims per request)."""
    many = _keys_per_pass(250, free_slot=False)
    assert many <= 12 + 4  # the heads, and the running streams' prefill order
    assert many <= _keys_per_pass(24, free_slot=False) + 1


def test_a_pass_that_fills_one_slot_looks_at_a_few():
    assert _keys_per_pass(250, free_slot=True) <= 2 * 12 + 4


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3), st.floats(0, 100)),
                min_size=1, max_size=40),
       st.floats(0, 200), st.lists(st.floats(0, 500), min_size=4, max_size=4),
       st.lists(st.integers(0, 3), max_size=8))
def test_the_lazy_order_is_the_policys_order(reqs, later, counters, running_users):
    policy = Policy(PolicyConfig())
    for u, c in enumerate(counters):
        policy.charge(f"m{u}", prompt_tokens=int(c), now=0.0)
    q = WaitQueue()
    made = []
    for rank, u, arrival in reqs:
        r = Request(prompt=[1], rank=rank, user=f"m{u}", sink=print)
        r.arrival = arrival
        made.append(r)
        q.append(r)
    for r in made[::3]:  # some leave and come back (preempted): at their place again
        q.remove(r)
        q.append(r)
    running = []
    for u in running_users:
        x = Request(prompt=[1], rank=1, user=f"m{u}", sink=print)
        x.arrival = 0.0
        running.append(x)
    now = 100.0 + later
    assert list(policy.order_pass(q, now, running)) == policy.order(list(q), now, running)
