"""Tab completion of the magics' options and choices: ``%train xent --rep<Tab>`` offers ``--replicas``.

IPython completes a magic's line as Python, so ``%cluster u<Tab>`` offered
``%unalias`` and ``%unload_ext``, and ``%train xent --rep<Tab>`` offered
``repr``. Each magic's own parser (``magic_arguments``) is the source of truth:
a word starting with ``-`` completes to its options, the word after an option
with choices (``--mode``) to those choices, and a positional word to the
choices of the magic's first positional argument (``%cluster``'s actions).
After ``--optimizer KIND``, only the settings KIND takes are offered
(``--nesterov`` after ``momentum``, not ``--amsgrad``). A word of an argument
that takes names (``LOSS``, ``--data``, ``--inputs``, ``--from``) completes to
the notebook's names, and ``--optimizer``'s to each kind with its default rate
(``nadam:0.002``); anything else (paths) is left to IPython.

Examples
--------
>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> _ = parser.add_argument("--mode", choices=["sync", "async"])
>>> _ = parser.add_argument("--max-staleness")
>>> candidates(parser, "%train loss --m", "--m")
['--max-staleness', '--mode']
>>> candidates(parser, "%train loss --mode ", "")
['async', 'sync']
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from IPython.core.completer import SimpleCompletion, context_matcher

from .arguments import OPTIMIZER_SETTINGS, OPTIMIZERS, setting_flag


def _optimizer_specs(typed: str, word: str) -> list[str]:
    """``--optimizer``'s values: each kind with its default rate (``nadam:0.002``); after ``nadam:``, that rate."""
    name, colon, _ = typed.partition(":")
    if colon:
        entry = OPTIMIZERS.get(name.lower())
        rate = f"{entry[1]:g}" if entry is not None else ""
        return [rate] if rate and rate.startswith(word) else []
    return [f"{kind}:{rate:g}" for kind, (_, rate) in sorted(OPTIMIZERS.items()) if kind.startswith(typed.lower())]


# Values an option's metavar stands for, given the whole word typed so far and IPython's token (the part after a
# ':' or ','), which is what a completion replaces.
VALUES: dict[str, Callable[[str, str], list[str]]] = {"NAME:RATE": _optimizer_specs}


def _split(line: str) -> tuple[list[str], str]:
    """The words before the one being typed, and that word as typed (``nadam:1e``: IPython's token is ``1e``)."""
    words = line.split()
    typed = words[-1] if words and not line[-1:].isspace() else ""
    return (words[:-1] if typed else words), typed


def filling(parser: argparse.ArgumentParser, line: str) -> argparse.Action | None:
    """The option whose value is being typed at the end of ``line`` (``--mode`` in ``%train loss --mode s``)."""
    before, _ = _split(line)
    if len(before) > 1 and before[-1].startswith("-"):
        action = next((a for a in parser._actions if before[-1] in a.option_strings), None)
        if action is not None and action.nargs != 0:
            return action
    return None


def candidates(parser: argparse.ArgumentParser, line: str, word: str) -> list[str]:
    """What ``word``, the last word of a magic's ``line`` up to the cursor, may complete to (sorted)."""
    before, typed = _split(line)  # the words before the one being typed
    if word.startswith("-"):
        options = (o for a in parser._actions for o in a.option_strings if o.startswith("--") or len(word) < 2)
        other = _other_kinds_settings(before)
        return sorted(o for o in options if o.startswith(word) and o not in other)
    action = filling(parser, line)
    if action is not None:
        values = VALUES.get(str(action.metavar))
        if values is not None:
            return values(typed, word)
        return sorted(str(c) for c in action.choices or () if str(c).startswith(word))
    positional = [a for a in parser._actions if not a.option_strings]
    if positional and positional[0].choices and not _given(before[1:], parser):
        return sorted(str(c) for c in positional[0].choices if str(c).startswith(word))
    return []


def _other_kinds_settings(words: list[str]) -> set[str]:
    """After ``--optimizer momentum``: the settings' flags that kind does not take (``--amsgrad``), not offered."""
    if "--optimizer" not in words[:-1]:
        return set()
    kind = words[words.index("--optimizer") + 1].partition(":")[0].lower()
    if kind not in OPTIMIZERS:
        return set()
    return {setting_flag(name) for name, kinds in OPTIMIZER_SETTINGS.items() if kind not in kinds}


def _given(words: list[str], parser: argparse.ArgumentParser) -> bool:
    """Whether ``words`` (the line after the magic's name) hold a positional word already."""
    takes_value = {o for a in parser._actions if a.nargs != 0 for o in a.option_strings}
    skip = False
    for w in words:
        if skip:
            skip = False
        elif w.startswith("-"):
            skip = w in takes_value
        else:
            return True
    return False


# The arguments that take names in the notebook (a loss, arrays, tensors, a Session or Job): their words
# complete to those names, where IPython completes nothing after a magic.
NAME_METAVARS = {"LOSS", "X,y", "X[,X2]", "OUTPUTS", "NAME"}


def _takes_names(parser: argparse.ArgumentParser, line: str, word: str) -> bool:
    action = filling(parser, line)
    if action is not None:
        return action.metavar in NAME_METAVARS
    positional = [a for a in parser._actions if not a.option_strings]
    return bool(positional) and positional[0].metavar in NAME_METAVARS


class MagicMatcher:
    """IPython's completion matcher (API v2) for the extension's magics, each known by its parser."""

    def __init__(self, shell: Any, parsers: dict[str, argparse.ArgumentParser]) -> None:
        self.shell = shell
        self.parsers = parsers
        # IPython asks a matcher function for its API version, name and priority (context_matcher sets them).
        # Priority before Jedi's: what it finds replaces Jedi's guesses from Python's names.
        self.match = context_matcher(identifier="cellgraph_magics", priority=1)(lambda context: self(context))

    def __call__(self, context: Any) -> dict[str, Any]:
        line, word = context.text_until_cursor, context.token
        name = line.split(None, 1)[0] if line.strip() else ""
        parser = self.parsers.get(name)
        if parser is None or line.strip() == name and not line.endswith(" "):
            return {"completions": []}  # not one of ours, or the magic's name itself
        found = candidates(parser, line, word)
        if not found and not word.startswith("-") and _takes_names(parser, line, word):
            part = word.rsplit(",", 1)[-1]
            found = sorted(n for n in self.shell.user_ns if n.startswith(part) and not n.startswith("_"))
        completions = [SimpleCompletion(text=f, type="magic argument") for f in found]
        return {"completions": completions, "suppress": bool(found)}


def register(shell: Any, magics: Iterable[Any]) -> MagicMatcher:
    """Install one matcher for every magic of ``magics`` that has a parser; return it (for ``unregister``)."""
    parsers = {}
    for m in magics:
        for kind, prefix in (("line", "%"), ("cell", "%%")):
            for name, method in m.magics[kind].items():
                parser = getattr(getattr(method, "__func__", method), "parser", None)
                if isinstance(parser, argparse.ArgumentParser):
                    parsers[prefix + name] = parser
    matcher = MagicMatcher(shell, parsers)
    shell.Completer.custom_matchers.append(matcher.match)
    return matcher


def unregister(shell: Any, matcher: MagicMatcher | None) -> None:
    """Take the matcher ``register`` installed away."""
    if matcher is not None and matcher.match in shell.Completer.custom_matchers:
        shell.Completer.custom_matchers.remove(matcher.match)


__all__ = ["MagicMatcher", "candidates", "register", "unregister"]
