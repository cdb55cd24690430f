"""Which model and class a request is, from the model name it sends.

Clients that cannot add a field to a request (Home Assistant's Ollama and OpenAI integrations,
Open WebUI) can still pick a class, so the class travels in the model's name: every model is
also listed as ``<name>:voice``, ``:chat``, ``:agent`` and ``:background``, and a request to an
alias runs in that class. A plain name (or ``<name>:latest``, as Ollama spells it) leaves the
class to the request's field, header or the endpoint's default; ``hearth``, ``default`` or no
name at all leave the model to the class's default (see :mod:`hearth.fleet.registry`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from ..chat.completions import CompletionError
from ..fleet.registry import UnknownModel
from ..fleet.runtime import Runtime
from ..policy.scheduler import RANK_NAMES
from .http import CLASS_USED, FLEET, VOICE_SHARES, ApiError, request_class

T = TypeVar("T")


def resolve(request: web.Request, name: str | None, *, ollama: bool = False
            ) -> tuple[str | None, str | None]:
    """(the model named or None, the class its alias names or None); 404 for a model not
    served here."""
    reg = request.app[FLEET].registry
    try:
        return reg.route(name)
    except UnknownModel:
        if ollama:  # Ollama's own words, which its clients and users know
            raise ApiError(404, f"model '{name}' not found", "model_not_found",
                           "model") from None
        listed = ", ".join(reg.names)
        raise ApiError(404, f"model {name!r} does not exist; this server serves {listed} "
                       "(each also as <name>:voice, :chat, :agent, :background)",
                       "model_not_found", "model") from None


@contextlib.asynccontextmanager
async def use_model(request: web.Request, name: str | None, priority: str | int | None,
                    default_class: str, *, ollama: bool = False,
                    keep_alive_s: float | None = None, user: str | None = None
                    ) -> AsyncIterator[tuple[Runtime, int]]:
    """The request's model, loaded and held for the request, and its class (``user``'s voice
    past its share runs as chat; the answer's ``X-Hearth-Class`` header says which)."""
    fleet = request.app[FLEET]
    model, alias = resolve(request, name, ollama=ollama)
    asked = request_class(request, priority, default_class, alias)
    with request.app[VOICE_SHARES].hold(user, asked) as rank:
        request[CLASS_USED] = RANK_NAMES[rank]
        model = model or fleet.registry.for_class(RANK_NAMES[rank])
        async with fleet.use(model, rank, keep_alive_s) as rt:
            yield rt, rank


async def with_model(request: web.Request, name: str | None, priority: str | int | None,
                     default_class: str, run: Callable[[Runtime, int], Awaitable[T]], *,
                     ollama: bool = False, keep_alive_s: float | None = None,
                     user: str | None = None) -> T:
    """``run(model, rank)`` on the request's model; when that is a remote worker found down
    before it took anything of the request (no connection, or 503), once more: by then the
    fleet sends it to the worker's fallback."""
    for retry in (True, False):
        try:
            async with use_model(request, name, priority, default_class, ollama=ollama,
                                 keep_alive_s=keep_alive_s, user=user) as (rt, rank):
                return await run(rt, rank)
        except CompletionError as e:
            if e.code != "worker_down" or not retry:
                raise
    raise AssertionError("not reached")


def listed(request: web.Request) -> list[tuple[Any, list[str]]]:
    """Each model's worker with the names it is listed under."""
    fleet = request.app[FLEET]
    return [(w, fleet.registry.listed_names(w.name)) for w in fleet.workers.values()]
