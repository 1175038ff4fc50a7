"""The LLM agent that proposes reward candidates through tools, and the chat backends it talks to.

    backend = OpenAIBackend(url="http://127.0.0.1:8000/v1", model="qwen2.5-7b-instruct")
    outcome = run_agent(backend, workspace, mode, seed=7, max_turns=24)
    outcome.proposals, outcome.belief, outcome.messages   # submitted candidates, the belief, the transcript

The loop: a system message (the role, the workspace, the tools), a round message (the
scheduled mode unless the framework is ablated, how many candidates to submit, the file
list), then turns of `backend.chat`; every tool call the reply makes is answered by
`Workspace.call` (`derl_jax.methods.arbo.tools`) in a `tool` message. It ends when the round's
candidates are submitted, after `max_turns` replies, or after `max_backend_errors` backend
failures in a row (an HTTP error the endpoint answers with, a reply that is not a chat
completion); an endpoint that stays down (`EndpointDown`) ends the round and the search. A malformed tool
call is answered with an error and the agent goes on; nothing the model writes can raise out
of `run_agent`.

Backends (`chat(messages, tools, seed) -> Reply` for the agent; `complete(messages, n, seed)
-> n reply texts` for Eureka's sampling):

  OpenAIBackend  any OpenAI-compatible `/chat/completions` endpoint (vLLM, SGLang, llama.cpp,
                 a hosted API), through urllib; the API key, if any, is read from the
                 environment variable named by `api_key_env`. Tool calls come as the
                 endpoint's `tool_calls`, or as `<tool_call>{json}</tool_call>` blocks in
                 the text for servers without a tool parser. `complete` asks for `n` choices
                 and asks again while a server returns fewer. Each request is retried with
                 backoff (`derl_jax.methods.arbo.endpoint`); an endpoint that stays down
                 raises `EndpointDown`, which stops the search before the round is charged.
  LocalBackend   a local Hugging Face chat checkpoint run in-process by the project's JAX
                 sampler (`derl_jax.models.sampling.sample_jit`); tools are described in the
                 system message and called with `<tool_call>` blocks (the Qwen2.5 format);
                 `complete` samples the n replies as one batch. A conversation longer than
                 the model's context loses its oldest exchanges (the system and round
                 messages stay). Temperature 0 decodes greedily.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Sequence

from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.endpoint import BackendError, EndpointDown, Retry, post_json  # noqa: F401 (re-exported)
from derl_jax.methods.arbo.schedule import EXPLOIT, EXPLORE
from derl_jax.methods.arbo.tools import ANALYSIS_FILE, BELIEF_FILE, LANGUAGE, Workspace

TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
PROMPT_BUCKETS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: Any  # a JSON object text (or whatever the model wrote)


@dataclasses.dataclass(frozen=True)
class Reply:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()

    def message(self) -> dict:
        """The assistant message for the transcript (OpenAI format)."""
        message: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": str(c.name), "arguments": _as_text(c.arguments)}}
                for c in self.tool_calls]
        return message


def _as_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def parse_tool_calls(text: str, prefix: str = "call") -> tuple[str, tuple[ToolCall, ...]]:
    """(text outside the blocks, calls) from `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
    blocks; a block that is not such an object becomes a call named "" carrying the raw text."""
    calls = []
    for k, match in enumerate(TOOL_CALL.finditer(text)):
        raw = match.group(1).strip()
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            calls.append(ToolCall(f"{prefix}_{k}", value["name"], value.get("arguments", {})))
        else:
            calls.append(ToolCall(f"{prefix}_{k}", "", raw))
    return TOOL_CALL.sub("", text).strip(), tuple(calls)


def reply_from_completion(body: Any, prefix: str = "call") -> Reply:
    """The Reply in an OpenAI chat-completion response body; BackendError when it is not one."""
    try:
        message = body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise BackendError(f"not a chat completion: {json.dumps(body)[:200]}") from None
    if not isinstance(message, dict):
        raise BackendError(f"not a chat completion message: {message!r:.200}")
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = json.dumps(content)
    raw_calls = message.get("tool_calls") or []
    if not raw_calls:
        return Reply(*parse_tool_calls(content, prefix))
    calls = []
    for k, raw in enumerate(raw_calls if isinstance(raw_calls, list) else [raw_calls]):
        function = raw.get("function") if isinstance(raw, dict) else None
        function = function if isinstance(function, dict) else {}
        call_id = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"{prefix}_{k}"
        name = function.get("name") if isinstance(function.get("name"), str) else ""
        calls.append(ToolCall(call_id, name, function.get("arguments", raw)))
    return Reply(content, tuple(calls))


# --------------------------------------------------------------------------- backends


@dataclasses.dataclass
class OpenAIBackend:
    """POST `<url>/chat/completions` (module docstring)."""

    url: str
    model: str = ""
    api_key_env: str = ""
    temperature: float = 0.7
    max_tokens: int = 1024
    timeout_s: float = 120.0

    retry: Retry = dataclasses.field(default_factory=Retry)

    def _post(self, body: dict) -> Any:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return post_json(f"{self.url.rstrip('/')}/chat/completions", body, headers, timeout_s=self.timeout_s,
                         retry=self.retry)

    def chat(self, messages: Sequence[dict], tools: Sequence[dict], seed: int) -> Reply:
        body = {"model": self.model, "messages": list(messages), "tools": list(tools), "tool_choice": "auto",
                "temperature": self.temperature, "max_tokens": self.max_tokens, "seed": int(seed)}
        return reply_from_completion(self._post(body), prefix=f"call{seed}")

    def complete(self, messages: Sequence[dict], n: int, seed: int) -> list[str]:
        """n reply texts to `messages` (no tools); servers that return fewer choices are asked again
        (seed + 1, ...), at most n requests in all."""
        texts: list[str] = []
        for attempt in range(n):
            body = {"model": self.model, "messages": list(messages), "n": n - len(texts),
                    "temperature": self.temperature, "max_tokens": self.max_tokens, "seed": int(seed) + attempt}
            texts += choice_texts(self._post(body))
            if len(texts) >= n:
                break
        return texts[:n]


def choice_texts(body: Any) -> list[str]:
    """The message contents of every choice of a chat-completion body; BackendError when it has none."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices:
        raise BackendError(f"not a chat completion: {json.dumps(body)[:200]}")
    texts = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        texts.append(content if isinstance(content, str) else "")
    return texts


def tools_system_text(tools: Sequence[dict]) -> str:
    """The Qwen2.5 way of describing tools in the system message."""
    specs = "\n".join(json.dumps(t) for t in tools)
    return ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{specs}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def plain_messages(messages: Sequence[dict], tools: Sequence[dict]) -> list[dict]:
    """OpenAI-format messages as plain role/content turns for a chat template: tools go into the
    system message, tool calls into `<tool_call>` blocks, tool results into `<tool_response>`."""
    out = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "system" and not out and tools:
            content += tools_system_text(tools)
        if role == "assistant" and message.get("tool_calls"):
            blocks = []
            for call in message["tool_calls"]:
                function = call["function"]
                try:
                    arguments = json.loads(function["arguments"])
                except json.JSONDecodeError:
                    arguments = function["arguments"]
                blocks.append("<tool_call>\n" + json.dumps({"name": function["name"], "arguments": arguments})
                              + "\n</tool_call>")
            content = "\n".join(([content] if content else []) + blocks)
        if role == "tool":
            role, content = "user", f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    return out


class LocalBackend:
    """A local HF chat checkpoint sampled in-process (module docstring)."""

    def __init__(self, checkpoint: str, tokenizer: str = "", *, temperature: float = 0.7, max_new_tokens: int = 512,
                 param_dtype: str | None = None):
        from derl_jax.models.hf import load_hf_model
        from derl_jax.models.hf_tokenizer import HFTokenizer

        self.tokenizer = HFTokenizer.from_directory(tokenizer or checkpoint)
        self.config, self.graphdef, self.params = load_hf_model(checkpoint, param_dtype)
        self.temperature = float(temperature)
        self.max_new_tokens = int(max_new_tokens)

    def prompt_text(self, messages: Sequence[dict], tools: Sequence[dict]) -> str:
        return self.tokenizer.apply_chat_template(plain_messages(messages, tools))

    def _sample(self, messages: Sequence[dict], tools: Sequence[dict], n: int, seed: int) -> list[str]:
        """n sampled reply texts to the conversation (its oldest exchanges dropped to fit)."""
        import jax

        from derl_jax.models.sampling import sample_jit

        room = self.config.max_position - self.max_new_tokens
        buckets = [b for b in PROMPT_BUCKETS if b <= room] or [room]
        messages = list(messages)
        text = self.prompt_text(messages, tools)
        while len(self.tokenizer.encode(text)) > buckets[-1] and len(messages) > 3:
            del messages[2]  # the oldest exchange after the system and round messages
            text = self.prompt_text(messages, tools)
        ids, mask = self.tokenizer.encode_prompts([text] * n, buckets, truncate=True)
        greedy = self.temperature == 0
        out = sample_jit(self.graphdef, self.params, jax.numpy.asarray(ids), jax.numpy.asarray(mask),
                         jax.random.key(int(seed)), max_new_tokens=self.max_new_tokens, eos_id=self.tokenizer.eos_id,
                         pad_id=self.tokenizer.pad_id, temperature=1.0 if greedy else self.temperature, greedy=greedy)
        return self.tokenizer.decode_batch(jax.device_get(out.tokens), jax.device_get(out.mask))

    def chat(self, messages: Sequence[dict], tools: Sequence[dict], seed: int) -> Reply:
        return Reply(*parse_tool_calls(self._sample(messages, tools, 1, seed)[0], prefix=f"call{seed}"))

    def complete(self, messages: Sequence[dict], n: int, seed: int) -> list[str]:
        return self._sample(messages, (), n, seed)


# --------------------------------------------------------------------------- the loop


@dataclasses.dataclass(frozen=True)
class AgentOutcome:
    proposals: tuple[hist.Proposal, ...]
    belief: hist.Belief | None  # None: nothing written this round (the previous belief stays)
    turns: int
    tool_errors: int
    backend_errors: int
    stopped: str  # "submitted", "max_turns", or the last backend error
    messages: tuple[dict, ...] = ()
    belief_written: bool = False


def system_prompt(workspace: Workspace, framework: bool = True) -> str:
    """The agent's standing instructions: its role, the workspace, the tools."""
    names = ", ".join(f"g{i + 1} = {name}" for i, name in enumerate(workspace.primitive_names))
    own = (f" {ANALYSIS_FILE} is yours to keep notes in across rounds; {BELIEF_FILE} holds your diagnoses and "
           "intended next steps and you rewrite it every round." if workspace.view.belief else "")
    return (
        "You search for a reward function for reinforcement learning of a language-model policy"
        + (f" on {workspace.task}" if workspace.task else "") + f". A reward is an arithmetic expression over the "
        f"primitives {names}, using {LANGUAGE}. Each candidate you submit trains one policy; its score is the "
        "trained policy's validation accuracy, and the search keeps the best. Your workspace holds files: the task "
        "(task.md), the code of the domain (env/) and of each primitive (primitives/), and "
        + ("what the evaluator recorded about past candidates (evaluation_log.md, candidates/<id>.md)"
           if workspace.scores_shown else "the past candidates (candidates/<id>.md)") + ", all read-only." + own
        + " Study them with list_files and read_file"
        + (", write with write_file" if workspace.view.belief else "")
        + ", and submit candidates with submit_candidate. Every submission is charged: one that is not a valid "
        "reward or repeats a candidate uses up its slot all the same."
        + ("" if framework else " How to search is up to you."))


def round_prompt(workspace: Workspace, mode: str | None) -> str:
    """The round's message: the schedule's guidance (mode None: none), the number of candidates, the files."""
    guidance = ""
    best = hist.incumbent(workspace.history)
    if mode == EXPLOIT and best is not None:
        score = f", score {best.score:.4f}" if workspace.scores_shown else ""
        guidance = (f" Mode: exploit. Refine the current best candidate {best.id} ({best.text}{score}); "
                    f"submit refinements with parent={best.id}.")
    elif mode == EXPLORE:
        guidance = " Mode: explore. Propose structurally different candidates (parent=null opens a new branch)."
    belief = f" Rewrite {BELIEF_FILE} before you submit." if workspace.view.belief else ""
    return (f"Round {workspace.history.rounds}.{guidance}{belief} Submit exactly {workspace.wanted} distinct "
            f"candidates with submit_candidate. {len(workspace.history.observations)} candidates have been "
            f"evaluated so far. The files:\n{workspace.listing()}")


def run_agent(backend: Any, workspace: Workspace, mode: str | None, *, seed: int, max_turns: int = 24,
              max_backend_errors: int = 2) -> AgentOutcome:
    """Run the tool loop for one round (module docstring); mode None: no schedule guidance."""
    messages = [{"role": "system", "content": system_prompt(workspace, framework=mode is not None)},
                {"role": "user", "content": round_prompt(workspace, mode)}]
    tools = workspace.tool_specs()
    turns = backend_errors = failures_in_row = 0
    stopped = "max_turns"
    while turns < max_turns and not workspace.done:
        turns += 1
        try:
            reply = backend.chat(messages, tools, seed=(seed + turns) % 2**31)
        except BackendError as err:
            backend_errors += 1
            failures_in_row += 1
            stopped = str(err)
            if failures_in_row >= max_backend_errors:
                break
            continue
        failures_in_row = 0
        messages.append(reply.message())
        if not reply.tool_calls:
            messages.append({"role": "user", "content": (
                f"No tool was called. Submitted {len(workspace.submitted)} of {workspace.wanted}; "
                "call submit_candidate (or another tool).")})
            continue
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": workspace.call(call.name, call.arguments)})
    if workspace.done:
        stopped = "submitted"
    return AgentOutcome(tuple(workspace.submitted), workspace.belief, turns, workspace.errors, backend_errors, stopped,
                        tuple(messages), workspace.belief_written)
