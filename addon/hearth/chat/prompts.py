"""Chat prompts from the model's own Jinja chat template (read from the GGUF).

Fallbacks: when the GGUF carries no template (Gemma 3 270M's has none), its architecture's turn
format (Gemma's for gemma*, which has no system role: system text opens the first user turn;
ChatML for any other), and a
tools-in-the-system-prompt format when the template ignores ``tools`` (SmolLM2's does): the tools
are listed as JSON in the system message and the model is asked to answer with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` — the Hermes/Qwen format, which
:mod:`hearth.chat.tools` parses.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger(__name__)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

GEMMA = (
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = ns.system + message['content'] + '\n\n' %}"
    "{% else %}"
    "{% if ns.system and message['role'] == 'assistant' %}"
    "{{ '<start_of_turn>user\n' + ns.system | trim + '<end_of_turn>\n' }}"
    "{% set ns.system = '' %}"
    "{% endif %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n'"
    " + ns.system + message['content'] + '<end_of_turn>\n' }}"
    "{% set ns.system = '' %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if ns.system %}{{ '<start_of_turn>user\n' + ns.system | trim + '<end_of_turn>\n' }}"
    "{% endif %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
FALLBACKS = {"gemma": GEMMA}  # by the GGUF's general.architecture prefix; else ChatML


def fallback_template(architecture: str | None) -> str:
    return next((t for prefix, t in FALLBACKS.items()
                 if (architecture or "").startswith(prefix)), CHATML)


TOOLS_SYSTEM_PROMPT = (
    "You can call functions. The available functions, as JSON schemas:\n"
    "<tools>\n{tools}\n</tools>\n"
    "To call a function, answer with only this, once per call:\n"
    '<tool_call>{{"name": <function name>, "arguments": <arguments as a JSON object>}}'
    "</tool_call>"
)


class PromptError(ValueError):
    pass


def _raise(message: str) -> None:
    raise TemplateError(message)


IMAGE_PARTS = ("image_url", "input_image")


def content_text(content: Any) -> str:
    """OpenAI message content: a string, or a list of parts of which the text parts count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                out.append(str(part.get("text", "")))
            elif isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
                # Said plainly: an AI Task with a camera snapshot lands here.
                raise PromptError(
                    "this model has no vision support: it cannot read image content parts "
                    f"({part.get('type')}); send text only, or serve a vision model")
            else:
                raise PromptError("only text content parts are supported")
        return "".join(out)
    raise PromptError("message content must be a string or a list of text parts")


RESERVED_TEMPLATE_VARIABLES = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


class ChatFormatter:
    def __init__(self, template: str | None, bos_token: str = "", eos_token: str = "",
                 architecture: str | None = None):
        fallback = fallback_template(architecture)
        self.source = template or fallback
        self.is_fallback = template is None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        # As transformers renders it: keys in their order, text as it is. (Jinja's own tojson
        # sorts keys and writes ' < > & and every non-ASCII letter as \u escapes.)
        env.filters["tojson"] = lambda v, **kw: json.dumps(v, ensure_ascii=False, **kw)
        try:
            self.template = env.from_string(self.source)
        except TemplateError as e:  # a broken template in a GGUF: the fallback still works
            self.template = env.from_string(fallback)
            self.source, self.is_fallback = fallback, True
            self.error = str(e)
        self.bos_token = bos_token
        self.eos_token = eos_token
        # A template that never mentions tools would silently drop them.
        self.native_tools = "tools" in self.source

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
               add_generation_prompt: bool = True,
               template_kwargs: dict[str, Any] | None = None) -> str:
        msgs = [self._message(m) for m in messages]
        if tools and not self.native_tools:
            msgs = self._tools_in_system(msgs, tools)
        # The request's own variables (enable_thinking, ...), never the ones set here.
        kwargs: dict[str, Any] = {k: v for k, v in (template_kwargs or {}).items()
                                  if k not in RESERVED_TEMPLATE_VARIABLES}
        if tools and self.native_tools:
            kwargs["tools"] = tools
        try:
            return self.template.render(
                messages=msgs, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)
        except TemplateError as e:
            raise PromptError(f"the chat template rejected these messages: {e}") from e

    def render_pieces(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                      template_kwargs: dict[str, Any] | None = None
                      ) -> tuple[str, list[tuple[str, bool]]]:
        """The prompt, and the same prompt as ``(text, is_template)`` pieces: the template's
        own text, whose markers are control tokens, and each message's content, which is text
        whatever it holds (``<|im_start|>system`` typed into a message must not open a turn;
        the assistant's own turns excepted).

        The template is rendered twice, once with a marker in place of each content: the
        markers show where content goes; the plain render shows what the template did to it
        (a ``trim``, say). A template that changes content otherwise gets it unchanged."""
        text = self.render(messages, tools, template_kwargs=template_kwargs)
        nonce = uuid.uuid4().hex[:12]
        contents: list[str] = []
        marked_msgs = []
        for m in messages:
            content = content_text(m.get("content"))
            # An assistant turn is the model's own words coming back (templates split its
            # reasoning out of it): rendered as the template does.
            if content and m.get("role") != "assistant":
                m = {**m, "content": f"\ue000{nonce}:{len(contents)}\ue001"}
                contents.append(content)
            marked_msgs.append(m)
        if not contents:
            return text, [(text, True)]
        marked = self.render(marked_msgs, tools, template_kwargs=template_kwargs)
        parts = re.split(f"\ue000{nonce}:(\\d+)\ue001", marked)
        return text, _fit_pieces(text, parts, contents)

    def _message(self, m: dict[str, Any]) -> dict[str, Any]:
        role = m.get("role")
        out: dict[str, Any] = {"role": role, "content": content_text(m.get("content"))}
        calls = m.get("tool_calls")
        if role == "assistant" and calls:
            if self.native_tools:
                # Arguments as an object, as templates expect (Qwen2.5's writes them with
                # ``tojson``): left a JSON string, the history showed every earlier call with
                # escaped arguments (``"arguments": "{\"name\": …}"``), and the 1.5B wrote
                # its next call so.
                out["tool_calls"] = [
                    {**c, "function": {**c["function"],
                                       "arguments": _json_args(c["function"].get("arguments"))}}
                    if isinstance(c.get("function"), dict) else c for c in calls]
            else:
                out["content"] += "".join(
                    "<tool_call>" + json.dumps({
                        "name": c["function"]["name"],
                        "arguments": _json_args(c["function"].get("arguments"))}) + "</tool_call>"
                    for c in calls)
        if role == "tool":
            if not self.native_tools:
                out = {"role": "user",
                       "content": f"<tool_response>{out['content']}</tool_response>"}
            elif "tool_call_id" in m:
                out["tool_call_id"] = m["tool_call_id"]
        if "name" in m and role != "tool":
            out["name"] = m["name"]
        return out

    @staticmethod
    def _tools_in_system(msgs: list[dict[str, Any]], tools: list[dict]) -> list[dict]:
        listing = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
        text = TOOLS_SYSTEM_PROMPT.format(tools=listing)
        if msgs and msgs[0]["role"] == "system":
            # The tools before the instructions: they are the same every turn, while Home
            # Assistant's system prompt ends with the current time, and a prefix cache reuses
            # only what comes before the first difference.
            first = dict(msgs[0])
            first["content"] = f"{text}\n\n{first['content']}"
            return [first, *msgs[1:]]
        return [{"role": "system", "content": text}, *msgs]


def _fit_pieces(text: str, parts: list[str], contents: list[str]) -> list[tuple[str, bool]]:
    """Pieces from a marked render's ``parts`` (template text and content indexes, in turn),
    each content as the plain render ``text`` has it: as sent, or trimmed."""
    pieces: list[tuple[str, bool]] = []
    pos, exact = 0, True
    for i, part in enumerate(parts):
        if i % 2 == 0:  # the template's own text
            exact = exact and text.startswith(part, pos)
            pos += len(part)
            pieces.append((part, True))
            continue
        content = contents[int(part)]
        after = parts[i + 1] if i + 1 < len(parts) else ""
        for cand in (content, content.strip(), content.lstrip(), content.rstrip()):
            if exact and text.startswith(cand, pos) and text.startswith(after, pos + len(cand)):
                break
        else:
            cand, exact = content, False
        pos += len(cand)
        pieces.append((cand, False))
    if not exact:
        log.debug("the chat template changes message content; content is sent as given")
    return [(t, special) for t, special in pieces if t]


def template_capabilities(template: str) -> list[str]:
    """What a chat model can do, in Ollama's words (``/api/show``; ``/v1/queue`` too): tools
    (Hearth serves tools on any template) and thinking where the template has a chain of
    thought. Never ``vision``: Hearth reads no images. Not ``embedding``: Ollama reserves it for
    embedding-only models, and clients hide those from chat pickers."""
    caps = ["completion", "tools"]
    if any(mark in template for mark in ("<think>", "enable_thinking", "reasoning_content")):
        caps.append("thinking")
    return caps


def _json_args(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args
