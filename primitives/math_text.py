"""Text helpers of math answers, shared by the math primitives and the math data loader.

    last_boxed_content(r"so \\boxed{\\frac{1}{2}}.")   -> "\\frac{1}{2}"
    strip_thousands_separators("1,250")                  -> "1250"
"""

from __future__ import annotations

import re
from typing import Sequence

BOX_COMMANDS = ("\\boxed", "\\fbox")

_PLAIN_NUMBER_WITH_SEPARATORS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def strip_thousands_separators(text: str) -> str:
    """`1,234,567` -> `1234567` when the whole (stripped) text is one such number."""
    stripped = text.strip()
    if _PLAIN_NUMBER_WITH_SEPARATORS.fullmatch(stripped):
        return stripped.replace(",", "")
    return stripped


def balanced_group_end(text: str, open_index: int) -> int | None:
    """Index just past the `}` matching the `{` at `open_index`, or None if it never closes.

    A backslash escapes the next character, so `\\{` and `\\}` are not counted.
    """
    if text[open_index] != "{":
        raise ValueError(f"balanced_group_end: position {open_index} holds {text[open_index]!r}, not '{{'")
    depth = 0
    index = open_index
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return None


def _last_command_start(text: str, commands: Sequence[str]) -> tuple[int, str] | None:
    """Position and name of the last occurrence of any of `commands` as a whole TeX word."""
    best: tuple[int, str] | None = None
    for command in commands:
        for match in re.finditer(re.escape(command) + r"(?![A-Za-z])", text):
            if best is None or match.start() > best[0]:
                best = (match.start(), command)
    return best


def last_boxed_content(text: str, commands: Sequence[str] = BOX_COMMANDS, allow_bare: bool = False) -> str | None:
    """Argument of the last `\\boxed{...}` / `\\fbox{...}` in `text`, stripped.

    None when there is no such command or its braces never close. With `allow_bare`, the
    brace-less TeX form `\\boxed 5` yields the single token after it (up to `$` or space).
    """
    found = _last_command_start(text, commands)
    if found is None:
        return None
    start, command = found
    after = start + len(command)
    rest = text[after:]
    skipped = len(rest) - len(rest.lstrip())
    open_index = after + skipped
    if open_index < len(text) and text[open_index] == "{":
        end = balanced_group_end(text, open_index)
        return None if end is None else text[open_index + 1 : end - 1].strip()
    if allow_bare and skipped > 0:
        token = re.match(r"[^\s$]+", text[open_index:])
        return token.group(0) if token else None
    return None
