"""llama.cpp's grammar path fuzzed in a worker process (issue 26): random schemas within
Hearth's limits go through the converter, the limits, llama.cpp's grammar parser and a sampled
token, in a real worker on the rung the server would pick (tests/llama_in_process.py). A schema
that crashes llama.cpp kills that worker, not the test run: the failure names the schema, and
the next example gets a new worker."""

from __future__ import annotations

import os
from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings
from llama_in_process import skipped_rungs
from schema_strategies import schemas

from hearth.chat.schema_limits import check_grammar_size, check_schema
from hearth.chat.tool_grammars import json_schema_grammar
from hearth.engine.base import WorkerLost
from hearth.fleet.models import packaged_model
from hearth.fleet.process import WorkerError, WorkerProcess
from hearth.shared.protocol import ContextParams
from hearth.shared.requests import SamplingParams

pytestmark = pytest.mark.model
EXAMPLES = int(os.environ.get("HEARTH_GRAMMAR_FUZZ_EXAMPLES", "40"))


class Worker:
    """A worker for the fuzzing, started again after each crash."""

    def __init__(self) -> None:
        self.cfg = {"model": str(packaged_model()), "embedding_model": "", "n_gpu_layers": 0,
                    "use_mmap": True, "verbose": False, "skip": skipped_rungs(),
                    "embed_batch": 64,
                    "context": asdict(ContextParams(n_ctx=512, n_seq_max=2, n_batch=64,
                                                    n_ubatch=64, n_threads=2))}
        self.proc: WorkerProcess | None = None
        self.crashes: list[str] = []

    def get(self) -> WorkerProcess:
        if self.proc is None or self.proc.lost is not None:
            self.proc = WorkerProcess(self.cfg, watchdog_s=60)
            self.proc.wait_ready(120)
        return self.proc

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stop()


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(schemas)
def test_no_schema_within_the_limits_crashes_a_worker(worker, schema):
    check_schema(schema, "schema")
    gbnf = json_schema_grammar(schema)
    check_grammar_size(gbnf, "schema")
    w = worker.get()
    try:
        try:
            w.service("check_grammar", gbnf)
        except WorkerError:
            return  # refused cleanly by llama.cpp: a 400 for the request, not a crash
        sampler = w.call([], "new_sampler", SamplingParams(grammar=gbnf, seed=1))
        token = w.info["canary_token"]
        status, out, _ = w.call([], "decode_sample", [token], [0], [0], [True], [(sampler, 0)])
        w.call([("free_sampler", sampler), ("seq_rm", 0, -1, -1)], "sync")
        assert status == 0 and len(out) == 1
    except WorkerLost as lost:
        pytest.fail(f"llama.cpp's grammar path crashed its worker ({lost.cause}) on {schema}")
