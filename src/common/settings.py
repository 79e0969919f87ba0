"""quantspec's one command-line convention for the commands beside `python -m src.run` (report, regress, sync
and the benchmark scripts): settings as `key=value`, the shape of Hydra's overrides that src.run takes, and
`--help` listing every setting with its default and meaning.

A value is read by its setting's kind: `true`/`false`, a number (finite), a text, or a list written as Hydra
writes a sweep (`precisions=w8a8,w4a16`); `null` unsets one that may be unset. A setting may hold named parts
(`baseline.precision=bf16`). What a command takes besides its settings (src.run's overrides for a benchmark
script, journal paths for sync) is passed through as given. A key that is no setting, or a value of the wrong
kind, is one line naming what to write instead.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field

# Spellings a command once took, each to the shared name it takes now (one name per option across the commands:
# src.run's, which Hydra's config fixes): the old one is refused with the new in its line, not taken silently.
RENAMED = {"tracking_uri": ("tracking.uri", "as python -m src.run spells it")}


class SettingError(ValueError):
    """A command line that is not one; the message is the one line the user sees."""


@dataclass(frozen=True)
class Setting:
    name: str
    default: object  # None, a bool, int, float, str, tuple (a list) or dict (named parts)
    meaning: str
    kind: type | None = None  # where the default is None: the kind a value is read as (str unless said);
    # list: the setting may be given again, each value kept (its default: a tuple)
    choices: tuple = ()  # the values it takes (of each item, for a list); empty: any
    parts: tuple = ()  # a dict's part names it takes; empty: those of the default
    purpose: str = ""  # what the setting is for, grouping the command reference's tables ("" : "settings")


@dataclass
class Command:
    """A command's settings, and what else it takes (`takes`): "overrides" (src.run's, passed through),
    "paths", or nothing."""

    name: str  # as the user runs it: `python -m src.report`
    doc: str
    settings: list[Setting]
    takes: str = ""
    # this command's own old spellings, as RENAMED's (a name that another command still takes in another
    # meaning: regress's old sweep was `baseline=`, which is the report's job each speedup is over)
    renamed: dict = field(default_factory=dict)
    _by_name: dict = field(init=False, repr=False)

    def __post_init__(self):
        self._by_name = {s.name: s for s in self.settings}

    def parse(self, argv: list[str]) -> tuple[dict, list[str]]:
        """(each setting's value, the other arguments in order). SettingError for a bad one."""
        values = {s.name: dict(s.default) if isinstance(s.default, dict) else s.default for s in self.settings}
        rest, given = [], {}
        renamed = {**RENAMED, **self.renamed}
        for arg in argv:
            key, eq, text = arg.partition("=")
            name, _, part = key.partition(".")
            setting = (self._by_name.get(key) or self._by_name.get(name)) if eq else None
            if setting is None and eq and key in renamed:
                now, why = renamed[key]
                raise SettingError(f"{key}= is now {now}= ({why}); {self._known()}")
            if setting is None:
                if not arg.startswith("-") and (self.takes == "overrides" or (self.takes == "paths" and not eq)):
                    rest.append(arg)
                    continue
                raise SettingError(f"{arg!r} is not a setting of {self.name}; {self._known()}")
            if key in given and setting.kind is not list:  # silently the last had been kept
                raise SettingError(f"{key} is given twice ({given[key]} and {arg}); give it once")
            given[key] = arg
            if isinstance(setting.default, dict):
                allowed = setting.parts or tuple(setting.default)
                if part not in allowed:
                    raise SettingError(f"{key} is not a setting; {name}.<{'|'.join(allowed)}> is ({self.name} --help)")
                values[name][part] = None if text in ("", "null") else text
            elif part and setting.name != key:
                raise SettingError(f"{key} is not a setting of {self.name}; {self._known()}")
            elif setting.kind is list:  # a setting given as often as needed
                values[setting.name] = (*values[setting.name], text)
            else:
                values[setting.name] = read(setting, text)
        return values, rest

    def _known(self) -> str:
        return f"its settings: {', '.join(f'{s.name}=' for s in self.settings)} ({self.name} --help)"

    def usage(self) -> str:
        """The command's docstring, then each setting with its default and meaning (a setting of named parts:
        each part it has by default, then what other parts it takes)."""
        shown = []
        for s in self.settings:
            if isinstance(s.default, dict):
                shown += [(f"{s.name}.{k}={show(v)}", "") for k, v in s.default.items()]
                shown.append((f"{s.name}.<{'|'.join(s.parts or tuple(s.default))}>=...", s.meaning))
            else:
                shown.append((f"{s.name}={show(s.default)}", s.meaning))
        width = min(max((len(a) for a, _ in shown), default=0), 40) + 2
        lines = []
        for arg, meaning in shown:
            lead = f"    {arg.ljust(width)}"
            if len(arg) + 2 > width:  # a long one (no two spaces left before its meaning): the meaning on the next line
                lines.append(lead.rstrip())
                lead = " " * (4 + width)
            wrapped = textwrap.wrap(meaning, 110 - len(lead)) or [""]
            lines += [(lead if i == 0 else " " * len(lead)) + w for i, w in enumerate(wrapped)]
        return f"{self.doc.strip()}\n\nSettings (key=value), with their defaults:\n\n" + "\n".join(
            line.rstrip() for line in lines
        )


def show(value) -> str:
    """A default as the user would write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return ",".join(f"{k}:{show(v)}" for k, v in value.items()) or "{}"
    return str(value)


def read(setting: Setting, text: str):
    """`text` as the setting's kind."""
    kind = setting.kind or type(setting.default)
    if text in ("null", "none", "") and setting.default is None:
        return None
    if kind is tuple:
        items = tuple(t.strip() for t in text.split(",") if t.strip())
        bad = [i for i in items if setting.choices and i not in setting.choices]
        if not items or bad:
            raise SettingError(f"{setting.name}={text}: a comma-separated list, each {_of(setting)}")
        return items
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise SettingError(f"{setting.name}={text} must be true or false")
        return text.lower() == "true"
    if kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            raise SettingError(f"{setting.name}={text} must be {'a whole' if kind is int else 'a'} number") from None
        if not math.isfinite(value):  # nan fails every comparison: it would switch a check off
            raise SettingError(f"{setting.name}={text} must be a finite number")
        return value
    if setting.choices and text not in setting.choices:
        raise SettingError(f"{setting.name}={text} must be {_of(setting)}")
    return text


def _of(setting: Setting) -> str:
    """Its choices, as said: `a or b`, `one of: a, b, c`."""
    if len(setting.choices) == 2:
        return " or ".join(setting.choices)
    return f"one of: {', '.join(setting.choices)}" if setting.choices else "values"
