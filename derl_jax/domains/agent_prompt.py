"""The agent prompt of a pretrained (chat) policy in the multi-turn domains, and its answers.

A checkpoint policy (`config.policy.checkpoint`, e.g. Qwen2.5-1.5B-Instruct) is prompted as
the field prompts such agents (verl-agent / GiGPO, which RLVMR builds on): inside the
tokenizer's chat template, the task, the last W observations with the actions that led to
them, the current observation, the actions the engine admits now, and the instruction to
reason inside one meta-reasoning tag and to put the action inside `<action>…</action>`.
A turn's prompt, rendered (ALFWorld, W = 2, Qwen2.5's template):

    <|im_start|>system
    You are a helpful assistant.<|im_end|>
    <|im_start|>user
    You are an expert agent playing ALFWorld, a text household. Your task is to: put a clean mug in coffeemachine.
    Your recent steps, oldest first; the last observation is the current one:
    Action: go to countertop 1
    Observation: You arrive at countertop 1. On the countertop 1, you see a mug 1.
    Admissible actions now: [go to sinkbasin 1, take mug 1 from countertop 1, examine countertop 1, look, inventory]

    Now it is your turn. ... <action>…</action> tags.<|im_end|>
    <|im_start|>assistant

and an answer the policy is taught (the cold start) to write:

    <planning>Plan the next step.</planning>
    <action>take mug 1 from countertop 1</action>

The four reasoning tags are RLVMR's; each names the step kind the agent primitives score
(`scienceworld.tags`, the household's tag rules): planning -> plan, explore -> explore,
reflection -> reflect, monitor -> act. With Self-Guide in words the answer starts with a
one-sentence self-assessment `<assess>… Verdict: progress.</assess>` (`derl_jax.domains.selfguide`).

Token level. The task prompt (chat header, task, history header) is a domain split's prompt
row; each observation row the environment returns is i32[O] = the step text "Action: a /
Observation: o" cut to O - M tokens and padded, then the admissible-actions line cut to M
tokens (whole actions) and padded; the fixed instruction and the assistant header (the
template's tail, tokenized once) follow the window. `AgentLayout` tells the rollout
(`derl_jax.domains.env.window_history`) to keep the raw answers out of the window (the
environment's row already names the extracted action), to show the admissible part of the
newest row only, and to append the tail.

Answers: `parse_answer` reads the tag, the action and the assessment. An answer is well-formed
when it holds exactly one reasoning block followed by exactly one non-empty action block; a
malformed answer is sent to the engine as it stands (an invalid action, which the engine
rejects), its step scores 0, and the environment counts it (`AnswerCounts`).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any, Sequence

import numpy as np

from derl_jax.config import ConfigError, choice, config_value

REASONING_TAGS = ("planning", "explore", "reflection", "monitor")
STEP_KIND = {"planning": "plan", "explore": "explore", "reflection": "reflect", "monitor": "act"}
TAG_OF_KIND = {kind: tag for tag, kind in STEP_KIND.items()}
THOUGHTS = {   # the cold start's short reasoning per tag (ours)
    "planning": "Plan the next step.",
    "explore": "Search somewhere new.",
    "reflection": "That failed; try another.",
    "monitor": "Keep going.",
}
ASSESS_TAG = "assess"
VERDICTS = ("progress", "no change", "setback")   # the index order of selfguide.ASSESSMENTS: +, =, -
ASSESS_SENTENCES = (   # the cold start's assessment per verdict (ours)
    "The last step reached a subgoal. Verdict: progress.",
    "Nothing was gained or lost yet. Verdict: no change.",
    "The last action failed. Verdict: setback.",
)
WORLDS = {
    "household": "a text household",
    "alfworld": "ALFWorld, a text household",
    "scienceworld": "ScienceWorld, a text world of science experiments",
}
HISTORY_HEADER = "\nYour recent steps, oldest first; the last observation is the current one:"
INSTRUCTION = (
    "\n\nNow it is your turn. First reason briefly inside exactly one tag: <planning> </planning> at the start "
    "or right after a subgoal was reached, <reflection> </reflection> right after an action that failed, "
    "<explore> </explore> when you go somewhere or open something new, <monitor> </monitor> otherwise. "
    "Then write one admissible action inside <action> </action> tags."
)
ASSESS_INSTRUCTION = (
    "\n\nBefore that, assess your progress in one sentence inside <assess> </assess>, ending with "
    "\"Verdict: progress.\", \"Verdict: no change.\" or \"Verdict: setback.\"."
)
_SENTINEL = "\x00USER\x00"
_REASONING = re.compile(r"<(planning|explore|reflection|monitor)>(.*?)</\1>", re.S)
_ACTION = re.compile(r"<action>(.*?)</action>", re.S)
_ASSESS = re.compile(r"<assess>(.*?)</assess>", re.S)
_VERDICT = re.compile(r"verdict\s*:\s*(progress|no change|setback)\s*[.!]?\s*$", re.I)


@dataclasses.dataclass(frozen=True)
class Answer:
    """A policy's answer read: kind (plan / explore / reflect / act, None when malformed), the
    action to send to the engine (the raw text when malformed), well_formed, and assessment
    (index into VERDICTS, -1 when there is no readable verdict)."""

    kind: str | None
    action: str
    well_formed: bool
    assessment: int = -1


def read_verdict(sentence: str) -> int:
    """Index into VERDICTS of the verdict that ends `sentence` ("... Verdict: setback."), or -1."""
    match = _VERDICT.search(sentence.strip())
    return VERDICTS.index(match.group(1).lower()) if match else -1


def parse_answer(text: str) -> Answer:
    """Read an answer (module docstring): one reasoning block, then one non-empty action block."""
    reasoning, actions = list(_REASONING.finditer(text)), list(_ACTION.finditer(text))
    assess = list(_ASSESS.finditer(text))
    assessment = read_verdict(assess[0].group(1)) if len(assess) == 1 else -1
    if len(reasoning) == 1 and len(actions) == 1 and reasoning[0].end() <= actions[0].start():
        action = " ".join(actions[0].group(1).split())
        if action:
            return Answer(STEP_KIND[reasoning[0].group(1)], action, True, assessment)
    return Answer(None, " ".join(text.split()), False, assessment)


def write_answer(kind: str, action: str, assessment: int | None = None) -> str:
    """The cold start's answer text for a step of `kind` (plan / explore / reflect / act) taking
    `action`, with the assessment sentence of index `assessment` first when given."""
    tag = TAG_OF_KIND[kind]
    head = "" if assessment is None else f"<{ASSESS_TAG}>{ASSESS_SENTENCES[int(assessment)]}</{ASSESS_TAG}>\n"
    return f"{head}<{tag}>{THOUGHTS[tag]}</{tag}>\n<action>{action}</action>"


@dataclasses.dataclass
class AnswerCounts:
    """Answers an environment has read, and how many were well-formed / named an admissible action."""

    answers: int = 0
    well_formed: int = 0
    admissible: int = 0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, answer: Answer, admissible: Sequence[str] | None) -> None:
        with self._lock:   # engine adapters read answers on several threads
            self.answers += 1
            self.well_formed += int(answer.well_formed)
            self.admissible += int(answer.well_formed and admissible is not None and answer.action in admissible)

    def shares(self) -> dict[str, float]:
        """{"well_formed": share, "admissible": share of well-formed answers with an admissible action}."""
        total = max(self.answers, 1)
        return {"well_formed": self.well_formed / total, "admissible": self.admissible / total}


@dataclasses.dataclass(frozen=True)
class AgentLayout:
    """How the rollout builds a window from an agent environment's rows (module docstring):
    current_only: the last M positions of an observation row shown for the newest slot only;
    suffix i32[X]: tokens after the window; actions_in_window: whether raw answers enter it."""

    current_only: int
    suffix: tuple[int, ...]
    actions_in_window: bool = False


class AgentPrompt:
    """The agent prompt of one world for one tokenizer (a `SubwordTable` over an `HFTokenizer`).

    obs_length: tokens of the step text of a row; admissible_length: tokens of its admissible
    line; self_guide: ask for the assessment sentence too; answer_length: the policy's answer
    tokens with their eos (0: unbounded), which the cold-start corpora respect.
    """

    def __init__(self, table, world: str, obs_length: int, admissible_length: int, self_guide: bool = False,
                 answer_length: int = 0):
        if world not in WORLDS:
            raise ValueError(f"AgentPrompt: unknown world {world!r}; known: {sorted(WORLDS)}")
        self.table, self.world, self.self_guide = table, world, bool(self_guide)
        self.step_length, self.admissible_length = int(obs_length), int(admissible_length)
        self.answer_length = int(answer_length)
        chat = table.tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], add_generation_prompt=True)
        if chat.count(_SENTINEL) != 1:
            raise ValueError("AgentPrompt: the tokenizer's chat template does not show the user message once")
        self.head, self.tail = chat.split(_SENTINEL)
        instruction = (ASSESS_INSTRUCTION if self.self_guide else "") + INSTRUCTION
        self.suffix_text = instruction + self.tail
        self.suffix = tuple(int(i) for i in table.tokens(self.suffix_text))
        self.layout = AgentLayout(current_only=self.admissible_length, suffix=self.suffix)

    @property
    def row_length(self) -> int:
        """O: tokens of an observation row."""
        return self.step_length + self.admissible_length

    def task_text(self, task: str) -> str:
        """The text of the task prompt (chat header, task, history header)."""
        task = re.sub(r"^\s*(task description:\s*)?(your task is to:?\s*)?", "", task.strip(), flags=re.I).rstrip(".")
        return f"{self.head}You are an expert agent playing {WORLDS[self.world]}. Your task is to: {task}.{HISTORY_HEADER}"

    def task_ids(self, task: str) -> list[int]:
        return self.table.tokens(self.task_text(task))

    @staticmethod
    def step_text(action: str | None, observation: str) -> str:
        """'\\nAction: a\\nObservation: o' (no action line at reset)."""
        observation = " ".join(str(observation).split())
        return ("" if action is None else f"\nAction: {' '.join(action.split())}") + f"\nObservation: {observation}"

    def admissible_ids(self, actions: Sequence[str]) -> list[int]:
        """The admissible line's tokens: as many whole actions as fit in admissible_length."""
        kept: list[str] = []
        ids = self.table.tokens(f"\nAdmissible actions now: []")
        for action in actions:
            trial = self.table.tokens(f"\nAdmissible actions now: [{', '.join(kept + [action])}]")
            if len(trial) > self.admissible_length:
                break
            kept, ids = kept + [action], trial
        return ids if len(ids) <= self.admissible_length else []

    def row(self, action: str | None, observation: str, admissible: Sequence[str]) -> np.ndarray:
        """i32[O]: an observation row (module docstring), padded with the table's pad id."""
        pad = self.table.pad_id
        step = self.table.tokens(self.step_text(action, observation))[: self.step_length]
        listed = self.admissible_ids(admissible)
        return np.array(step + [pad] * (self.step_length - len(step)) + listed
                        + [pad] * (self.admissible_length - len(listed)), np.int32)

    def window_ids(self, rows: Sequence[np.ndarray]) -> list[int]:
        """The window and tail tokens of a turn whose last W rows are `rows` (oldest first, the
        newest the current observation), as the rollout writes them."""
        pad, ids = self.table.pad_id, []
        for index, row in enumerate(rows):
            shown = row if index == len(rows) - 1 else row[: self.step_length]
            ids += [int(i) for i in shown if i != pad]
        return ids + list(self.suffix)

    def render(self, task: str, steps: Sequence[tuple[str | None, str]], admissible: Sequence[str]) -> str:
        """The whole prompt text of a turn from the task, its last steps (action, observation),
        oldest first, the newest the current observation, and the admissible actions (reference
        rendering; tokens come from `task_ids`, `row` and `window_ids`)."""
        rows = [self.row(a, o, admissible if i == len(steps) - 1 else ()) for i, (a, o) in enumerate(steps)]
        return self.table.tokenizer.decode(self.task_ids(task) + self.window_ids(rows), skip_special_tokens=False)


def window_room(layout: AgentLayout, window: int, obs_length: int, action_length: int) -> int:
    """The most window tokens (tail included) a turn of `window` slots holds under `layout`."""
    room = window * (obs_length - layout.current_only) + layout.current_only + len(layout.suffix)
    return room + (window * action_length if layout.actions_in_window else 0)


# ----------------------------------------------------------------------------- config

PROMPT_STYLES = ("auto", "agent", "compact")


def tokenizer_directory(cfg: Any) -> str:
    """The policy's tokenizer directory: policy.tokenizer, else policy.checkpoint ("" = word vocabulary)."""
    policy = config_value(cfg, "policy")
    return str(policy.get("tokenizer", "") or "").strip() or str(policy.get("checkpoint", "") or "").strip()


def agent_style(cfg: Any) -> bool:
    """Whether a run prompts its policy with the agent prompt: `config.policy.prompt_style`
    "agent", or "auto" (the default) with a checkpoint or tokenizer; "compact" keeps the word layout."""
    style = str(config_value(cfg, "policy").get("prompt_style", "auto"))
    return style == "agent" or (style == "auto" and bool(tokenizer_directory(cfg)))


def validate_prompt_fields(cfg: Any) -> None:
    """ConfigError naming `config.policy.prompt_style` when it is unknown, or "agent" without a
    tokenizer (the agent prompt is written in the policy's own tokens)."""
    if "prompt_style" in config_value(cfg, "policy"):
        choice(cfg, "policy.prompt_style", PROMPT_STYLES)
    if agent_style(cfg) and not tokenizer_directory(cfg):
        raise ConfigError("config.policy.prompt_style='agent' needs config.policy.checkpoint or config.policy.tokenizer "
                          "(the agent prompt is written in the policy's own tokens)")


def load_table(directory: str, task_names: Sequence[str] = ()):
    """The `SubwordTable` of the Hugging Face tokenizer in `directory`."""
    from derl_jax.domains.scienceworld.subword import SubwordTable
    from derl_jax.models.hf_tokenizer import HFTokenizer

    return SubwordTable(HFTokenizer.from_directory(directory), task_names)
