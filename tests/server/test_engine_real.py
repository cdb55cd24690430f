"""The engine on the real llama.cpp backend with SmolLM2-135M (greedy decoding)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from llama_in_process import open_model
from real_model import greedy

from hearth.chat.prompts import ChatFormatter
from hearth.engine import Engine, EngineConfig, EngineCore, RequestError
from hearth.llama.backend import LlamaBackend
from hearth.llama.llama_adapter import Context, ContextParams
from hearth.policy.scheduler import PolicyConfig, class_rank
from hearth.shared.requests import Request, SamplingParams

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model():
    m = open_model()
    yield m
    m.close()


class Sink:
    def __init__(self):
        self.events = []
        self.done = threading.Event()

    def __call__(self, evs):
        self.events.extend(evs)
        if any(e.kind in ("done", "error") for e in evs):
            self.done.set()

    @property
    def tokens(self):
        return [t for e in self.events if e.kind == "token" for t in e.token_ids]

    @property
    def text(self):
        return "".join(e.text for e in self.events if e.kind == "token")

    @property
    def last(self):
        return self.events[-1]


def make(model, mode="hearth", n_parallel=8, n_ctx=8192, prefix_cache=True, **cfg):
    entries = 8 if prefix_cache else 0
    b = LlamaBackend(model, ContextParams(n_ctx=n_ctx, n_seq_max=n_parallel + entries,
                                          n_batch=512, n_ubatch=128))
    core = EngineCore(b, PolicyConfig(mode=mode, n_parallel=n_parallel),
                      EngineConfig(prefix_cache=prefix_cache, prefix_cache_entries=entries,
                                   **cfg))
    core.calibrate(model.tokenize("warm", add_special=False)[0], rounds=1)
    return core, b


def chat_tokens(model, text: str, system: str | None = None) -> list[int]:
    f = ChatFormatter(model.chat_template())
    msgs = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": text}]
    return model.tokenize(f.render(msgs), add_special=False)


def req(prompt, cls="chat", max_tokens=32, **kw):
    s = Sink()
    return Request(prompt=prompt, rank=class_rank(cls), sink=s, max_tokens=max_tokens,
                   sampling=GREEDY, ignore_eos=True, **kw), s


def drain(core, sinks, limit=100_000):
    n = 0
    while not all(s.done.is_set() for s in sinks):
        core.step()
        n += 1
        assert n < limit
    return n


QUESTIONS = ["What is the capital of France?", "Name three colours.", "Count to five.",
             "What is a kettle?", "Say something about cats.", "Why is the sky blue?",
             "Write a haiku about rain.", "What do bees make?"]


def solo_logits(model, tokens: list[int]) -> np.ndarray:
    """Logits after ``tokens`` computed for that sequence alone, in a fresh context."""
    ctx = Context(model, ContextParams(n_ctx=4096, n_seq_max=1, n_batch=512, n_ubatch=128))
    try:
        n, step = len(tokens), ctx.n_batch
        for p0 in range(0, n, step):
            part = tokens[p0:p0 + step]
            last = p0 + len(part) == n
            assert ctx.decode(part, list(range(p0, p0 + len(part))), [0] * len(part),
                              [False] * (len(part) - 1) + [last]) == 0
        return np.ctypeslib.as_array(ctx.logits((n - 1) % step), shape=(model.n_vocab,)).copy()
    finally:
        ctx.close()


# Two tokens whose logits are this close count as a tie that kernel noise may break either way
# (the noise measured below reaches 0.8 in single logits, and a flip moves two of them; 0.5
# failed one run in three, at a margin of 0.54: how the engine cuts the prompts varies).
# A real fault (wrong KV cells, a wrong position) parts at margins of the logits' spread, ~3.4.
NEAR_TIE = 1.0


def assert_parts_only_at_a_near_tie(model, prompt: list[int], ref: list[int], got: list[int]):
    """``got`` equals ``ref`` up to the first token where they differ, and there the two choices
    are within NEAR_TIE of each other in logits recomputed for that context (either may come out
    ahead: the recomputation is itself one more kernel shape)."""
    assert len(got) == len(ref)
    i = next((j for j in range(len(ref)) if ref[j] != got[j]), None)
    if i is None:
        return
    logits = solo_logits(model, prompt + ref[:i])
    margin = float(logits[ref[i]] - logits[got[i]])
    assert abs(margin) < NEAR_TIE, f"diverged at token {i} with margin {margin}"


def test_batched_logits_differ_from_solo_only_by_float_noise(model):
    """Why batched and solo greedy runs can part: the same sequence decoded beside seven others
    (other KV cells, other matmul shapes) gets logits that differ in the low bits."""
    prompts = [chat_tokens(model, q) for q in QUESTIONS]
    alone = solo_logits(model, prompts[0])
    ctx = Context(model, ContextParams(n_ctx=4096, n_seq_max=8, n_batch=512, n_ubatch=128))
    try:
        toks, pos, seqs, outs, last = [], [], [], [], 0
        for s, p in enumerate(prompts):
            toks += p
            pos += range(len(p))
            seqs += [s] * len(p)
            outs += [False] * (len(p) - 1) + [True]
            if s == 0:
                last = len(p) - 1
        assert ctx.decode(toks, pos, seqs, outs) == 0
        batched = np.ctypeslib.as_array(ctx.logits(last), shape=(model.n_vocab,)).copy()
    finally:
        ctx.close()
    diff = np.abs(batched - alone)
    print(f"max |Δlogit| {diff.max():.4f}, mean {diff.mean():.5f}, logit std {alone.std():.3f}")
    # Measured here: max 0.80, mean 0.19 against a logit spread of 3.4 — the same order as
    # switching flash attention off for the solo run (max 1.51, mean 0.56). Noise of kernels
    # picked by batch shape, not a different computation: the distributions agree closely, and
    # where the best token differs, the solo run had a near-tie there.
    corr = float(np.corrcoef(batched, alone)[0, 1])
    gap = float(alone.max() - alone[int(np.argmax(batched))])
    print(f"correlation {corr:.5f}, solo margin of the batched choice {gap:.4f}")
    assert corr > 0.99
    assert gap < NEAR_TIE


def test_batched_generations_equal_one_at_a_time(model):
    """Greedy: 8 generations batched together equal each run alone, token for token, except
    where the solo run's best two tokens are a near-tie (there float noise may pick the other);
    bitwise equality of every token is not something llama.cpp's batched kernels give."""
    core, b = make(model, prefix_cache=False)
    alone = []
    for q in QUESTIONS:
        r, s = req(chat_tokens(model, q))
        core.submit(r)
        drain(core, [s])
        alone.append(s.tokens)
    pairs = [req(chat_tokens(model, q)) for q in QUESTIONS]
    for r, _ in pairs:
        core.submit(r)
    drain(core, [s for _, s in pairs])
    b.close()
    together = [s.tokens for _, s in pairs]
    assert all(len(t) == 32 for t in together)
    identical = 0
    for q, solo, batched in zip(QUESTIONS, alone, together, strict=True):
        if solo == batched:
            identical += 1
            continue
        assert_parts_only_at_a_near_tie(model, chat_tokens(model, q), solo, batched)
    # How many come out identical depends on the CPU's kernels and on how the prompts are cut
    # into batches (2 of 8 on one machine, 0 of 8 on CI's once): the near-tie rule above is the
    # correctness test, so the count is only reported.
    print(f"{identical} of {len(QUESTIONS)} batched generations identical to their solo run")


def test_preempted_generation_resumes_exactly(model):
    core, b = make(model, n_parallel=2, prefix_cache=False)
    prompt = chat_tokens(model, "Tell me a long story about a lighthouse keeper.")
    r, ref = req(prompt, cls="background", max_tokens=48)
    core.submit(r)
    drain(core, [ref])

    bgs = [req(prompt, cls="background", max_tokens=48),
           req(chat_tokens(model, "Describe a forest."), cls="background", max_tokens=48)]
    for r, _ in bgs:
        core.submit(r)
    while bgs[0][0].n_generated < 12 or bgs[1][0].n_generated < 12:
        core.step()
    v, vs = req(chat_tokens(model, "Turn on the kitchen light."), cls="voice", max_tokens=8)
    core.submit(v)
    drain(core, [vs, *(s for _, s in bgs)])
    assert sum(r.preemptions for r, _ in bgs) == 1
    assert v.preemptions == 0
    # Resuming recomputes prompt + generated tokens as one prefill (other kernel shapes than
    # token-by-token decode), so the same near-tie rule applies as for batching.
    assert_parts_only_at_a_near_tie(model, prompt, ref.tokens, bgs[0][1].tokens)
    # Nothing lost or duplicated at the preemption point: the text is the tokens' text.
    got = bgs[0][1]
    assert got.text == b"".join(model.piece(t) for t in got.tokens).decode("utf-8", "replace")
    assert len(got.tokens) == 48 and got.tokens[:12] == ref.tokens[:12]
    b.close()


def test_shared_system_prompt_is_served_from_the_prefix_cache(model):
    core, b = make(model)
    system = "You are a voice assistant for a home. " + " ".join(
        f"Device {i}: light.room_{i} is off in area {i % 7}." for i in range(70))
    first = chat_tokens(model, "Turn on the kitchen light.", system=system)
    assert 900 <= len(first) <= 1600
    r1, s1 = req(first, cls="voice", max_tokens=4)
    core.submit(r1)
    drain(core, [s1])
    second = chat_tokens(model, "What time is it?", system=system)
    r2, s2 = req(second, cls="voice", max_tokens=4)
    core.submit(r2)
    drain(core, [s2])
    assert s2.last.usage["cached_tokens"] / len(second) >= 0.9
    assert core.pool.stats()["hit_rate"] > 0
    b.close()


def test_cancel_frees_the_sequence_and_its_kv(model):
    core, b = make(model, prefix_cache=False)
    r, s = req(chat_tokens(model, "Write a very long essay."), max_tokens=500)
    core.submit(r)
    while r.n_generated < 5:
        core.step()
    assert core.pool.used_cells > 0 and b.seq_pos_max(r.seq_id) > 0
    seq = r.seq_id
    core.cancel(r.id)
    core.step()
    assert s.last.finish_reason == "cancelled"
    assert not core.running and core.pool.used_cells == 0
    assert b.seq_pos_max(seq) == -1
    b.close()


def test_prompt_longer_than_the_context_is_a_clean_error(model):
    core, b = make(model, n_ctx=1024, prefix_cache=False)
    long = model.tokenize("word " * 3000, add_special=False)
    with pytest.raises(RequestError) as e:
        core.submit(req(long)[0])
    assert e.value.status == 400 and "context" in str(e.value)
    r, s = req(chat_tokens(model, "Hi"), max_tokens=4)  # still serving
    core.submit(r)
    drain(core, [s])
    assert s.last.kind == "done"
    b.close()


def test_voice_during_a_long_background_prefill_answers_before_it_ends(model):
    """Threaded, real time: the voice request arrives while a ~3,000-token summary prefills."""
    core, b = make(model, prefix_cache=False, latency_target_s=0.06)
    engine = Engine(core)
    engine.start()
    try:
        doc = "The household meeting notes say: " + " ".join(
            f"item {i} concerns the garden, the heating and the shopping list." for i in range(230))
        bg, bgs = req(chat_tokens(model, "Summarise: " + doc), cls="background", max_tokens=8)
        assert len(bg.prompt) > 2500
        engine.submit(bg)
        deadline = time.monotonic() + 30
        while bg.n_past < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bg.n_past >= 300
        v, vs = req(chat_tokens(model, "Turn off the lights."), cls="voice", max_tokens=4)
        engine.submit(v)
        assert vs.done.wait(60) and bgs.done.wait(120)
        assert v.first_token_at < bg.first_token_at
        assert bg.first_token_at - v.first_token_at > 1.0  # the prefill had far to go
    finally:
        engine.stop()
        b.close()


def test_embeddings_many_inputs_in_one_decode(model):
    core, b = make(model, prefix_cache=False)
    s = Sink()
    texts = ["the kitchen light", "the kitchen lamp", "a tax return form"]
    r = Request(prompt=[model.tokenize(t) for t in texts], rank=4, sink=s, kind="embed")
    core.submit(r)
    drain(core, [s])
    vecs = s.last.embedding
    assert len(vecs) == 3 and len(vecs[0]) == model.n_embd

    def cos(a, c):
        return sum(x * y for x, y in zip(a, c, strict=True))

    assert cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2])
    b.close()


def test_the_embedded_model_is_one_the_engine_can_share(model):
    """SmolLM2 is a plain transformer: neither recurrent nor hybrid, no sliding window, so
    Hearth serves it (a recurrent or hybrid GGUF is refused at load, see runner.boot.unservable)."""
    from hearth.runner.boot import unservable

    assert (model.is_recurrent, model.is_hybrid, model.n_swa) == (False, False, 0)
    assert unservable(model) is None


def _greedy_json(model, sample_with) -> str:
    """40 greedy tokens of a JSON answer, sampled by ``sample_with(ctx, schema_grammar)``."""
    from hearth.chat.tool_grammars import json_schema_grammar

    grammar = json_schema_grammar({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
        "required": ["name", "age", "city"]})
    return _greedy(model, "Describe a person as JSON: ", lambda ctx: sample_with(ctx, grammar))


def _greedy(model, text: str, sample_with, n: int = 40) -> str:
    return greedy(model, text, sample_with, n)


def test_grammar_checked_on_the_sampled_token_gives_what_the_full_grammar_gives(model):
    """Sampling first and checking only the chosen token against the grammar (llama.cpp's
    common sampler does the same; a whole-vocabulary grammar pass costs ~4 ms a token here)
    yields the very tokens of the grammar applied to every candidate, greedy."""
    import llama_cpp as L

    from hearth.llama.llama_sampling import Sampler, _grammar_sampler

    def whole_vocabulary(ctx, grammar):
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(chain, _grammar_sampler(model, grammar))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        return lambda row: L.llama_sampler_sample(chain, ctx.ptr, row)

    def ours(ctx, grammar):
        sampler = Sampler(model, SamplingParams(temperature=0, grammar=grammar))
        return lambda row: sampler.sample(ctx, row)

    expected = _greedy_json(model, whole_vocabulary)
    assert expected.startswith('{"name": ')
    assert _greedy_json(model, ours) == expected


def test_packed_prefix_cache_serves_the_same_continuations(model):
    """Cached voice turns above a one-off document's freed cells are packed into the lowest
    cells while the engine idles (llama.cpp's saved sequence state, restored); the next turn is
    still served from the cache and continues as it does on an engine that never packed."""
    system = "You are a voice assistant for a home. " + " ".join(
        f"Device {i}: light.room_{i} is off in area {i % 7}." for i in range(40))
    turns = [chat_tokens(model, q, system=system) for q in
             ("Turn on the kitchen light.", "Is the porch light on?", "What time is it?")]
    doc = chat_tokens(model, "Summarise: " + " ".join(f"note {i} about the garden."
                                                      for i in range(120)))
    results = []
    for pack in (False, True):
        core, b = make(model, compact_prefix_cache=pack)
        r, s = req(doc, cls="background", max_tokens=2)
        core.submit(r)
        drain(core, [s])
        for t in turns[:2]:
            r, s = req(t, cls="voice", max_tokens=4)
            core.submit(r)
            drain(core, [s])
        assert core.kv.evict_entry(None)  # the document: its cells below the turns come free
        assert core.idle() == pack and core.pool.packings == int(pack)
        r, s = req(turns[2], cls="voice", max_tokens=24)
        core.submit(r)
        drain(core, [s])
        assert r.cached_tokens > len(turns[2]) // 2
        results.append(s.tokens)
        b.close()
    assert_parts_only_at_a_near_tie(model, turns[2], results[0], results[1])
