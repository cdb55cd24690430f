"""Preemption is never for nothing (issue 48), on the simulated backend: every admission pass
that preempts a running sequence admits the request it preempted for, and no request loses its
own cache hit to its admission. Random households on pools that preempt, with entry caps,
spare voice ids, kept voice prefixes, repeated prompts (a finished answer is a prefix of its
retry's) and cached conversations cut to their shared system prompt."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sim_backend import SimBackend, make_core, request

EXAMPLES = int(os.environ.get("HEARTH_PROPERTY_EXAMPLES", "150"))
SYSTEM = [7000 + i for i in range(50)]
PREFIXES = {"system": SYSTEM, "agent": SYSTEM + [8000 + i for i in range(30)],
            "tools": SYSTEM + [8100 + i for i in range(45)]}
LONGEST = 95 + 40 + 30  # the longest prefix, prompt and reply


class Watch:
    """Records what each admission pass did: whom it looked up (and the hit found), whom it
    preempted while looking at whom, whom it seated with which hit."""

    def __init__(self, core):
        self.core = core
        self.violations: list[str] = []
        self.passes_preempting = 0
        a, kv = core.admitter, core.kv
        admit, preempt, find, seat = a.admit, a.preempt, kv.find, kv.seat
        self._in_pass = False
        self._for = None  # the request the pass is looking at
        self._found: dict[int, int] = {}  # request id -> hit its lookup found in this pass
        self._preempted_for: list = []
        self._seated: dict[int, int] = {}  # request id -> hit it was seated with

        def watched_find(tokens):
            self._for = next((r for r in core.waiting if r.tokens is tokens), None)
            entry, hit = find(tokens)
            if self._in_pass and self._for is not None:
                self._found[self._for.id] = hit
            return entry, hit

        def watched_preempt(victim, now, keep_kv=True):
            if self._in_pass:
                self._preempted_for.append((victim, self._for))
            return preempt(victim, now, keep_kv)

        def watched_seat(r, seq, entry, hit, need):
            if self._in_pass:
                self._seated[r.id] = hit
                found = self._found.get(r.id, 0)
                preempted = any(f is r for _, f in self._preempted_for)
                alone = not any(x is not r for x in core.running)
                if hit < found and (preempted or not alone):
                    self.violations.append(
                        f"request {r.id} ({r.cls}) found a {found}-token hit and was seated "
                        f"with {hit}")
            return seat(r, seq, entry, hit, need)

        def watched_admit(now):
            self._in_pass, self._for = True, None
            self._found, self._preempted_for, self._seated = {}, [], {}
            try:
                admit(now)
            finally:
                self._in_pass = False
            if self._preempted_for:
                self.passes_preempting += 1
            for victim, r in self._preempted_for:
                if r is None or r.id not in self._seated:
                    self.violations.append(
                        f"request {victim.id} ({victim.cls}) was preempted for "
                        f"{None if r is None else (r.id, r.cls)}, which was not admitted")

        a.admit, a.preempt, kv.find, kv.seat = (watched_admit, watched_preempt, watched_find,
                                                 watched_seat)


household = st.lists(
    st.tuples(st.sampled_from(["voice", "chat", "agent", "background"]),
              st.sampled_from([None, *PREFIXES]), st.sampled_from([1, 5, 20, 40]),
              st.integers(1, 30), st.integers(0, 4), st.sampled_from(["ann", "bob", "kid"]),
              st.integers(0, 4)),  # the seed: the same one twice is the same prompt
    min_size=2, max_size=24)


def run_household(jobs, n_ctx, n_parallel, entries, spare, kept_share):
    b = SimBackend(n_ctx=n_ctx, n_seq_max=n_parallel + entries + spare)
    core, _ = make_core("hearth", n_parallel=n_parallel, backend=b,
                        prefix_cache_entries=entries, voice_spare_slots=spare,
                        prefix_cache_kept_share=kept_share)
    watch = Watch(core)
    reqs = []
    for cls, shared, n, out, gap, user, seed in jobs:
        r, sink = request(b, cls, n, out, user=user, seed=seed, prefix=PREFIXES.get(shared))
        core.submit(r)
        reqs.append((r, sink))
        for _ in range(gap):
            core.step()
    for _ in range(20_000):
        if all(s.done is not None for _, s in reqs):
            break
        core.step()
    return core, b, reqs, watch


# Two households the admission before issue 48 failed (found among ~2,000 random ones, of
# which about 2% failed): a running chat turn preempted for another that the pass then did not
# admit, and a chat turn seated without the 50-token hit it had found while others ran.
PREEMPTED_FOR_NOBODY = dict(
    jobs=[("chat", "tools", 1, 5, 3, "ann", 4), ("chat", "tools", 5, 24, 3, "kid", 1),
          ("voice", "system", 5, 5, 1, "kid", 3), ("background", "agent", 5, 27, 4, "ann", 0),
          ("agent", None, 1, 21, 0, "bob", 4), ("agent", "agent", 40, 14, 1, "ann", 2),
          ("chat", "tools", 40, 20, 4, "ann", 0), ("voice", None, 5, 18, 4, "kid", 0)],
    n_ctx=189, n_parallel=2, entries=2, spare=1, kept_share=0.6)
HIT_LOST = dict(
    jobs=[("chat", "agent", 20, 5, 1, "ann", 4), ("chat", None, 40, 30, 3, "kid", 2),
          ("chat", "tools", 20, 8, 4, "kid", 1), ("chat", "agent", 20, 5, 3, "kid", 4),
          ("agent", None, 20, 5, 1, "bob", 0), ("background", "agent", 40, 5, 2, "ann", 3),
          ("chat", "agent", 40, 30, 3, "ann", 4), ("chat", None, 20, 12, 3, "bob", 2)],
    n_ctx=188, n_parallel=2, entries=2, spare=1, kept_share=0.0)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@example(**PREEMPTED_FOR_NOBODY)
@example(**HIT_LOST)
@given(jobs=household, n_ctx=st.integers(LONGEST, 3 * LONGEST), n_parallel=st.integers(1, 3),
       entries=st.integers(1, 4), spare=st.integers(0, 2),
       kept_share=st.sampled_from([0.0, 0.3, 0.6]))
def test_every_pass_that_preempts_admits_whom_it_preempted_for(jobs, n_ctx, n_parallel,
                                                               entries, spare, kept_share):
    core, b, reqs, watch = run_household(jobs, n_ctx, n_parallel, entries, spare, kept_share)
    assert not watch.violations, watch.violations
    assert all(s.done is not None and s.done.kind == "done" for _, s in reqs)
    assert core.pool.used_cells == b.used and b.refusals == 0
