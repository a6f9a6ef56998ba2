"""The one registry mechanism: ``arch=…`` (models.ARCH_REGISTRY), ``encoder=…`` (encoders.ENCODER_REGISTRY) and
evaluators (evaluators.EVALUATOR_REGISTRY) are each a :class:`Registry` of name -> :class:`Entry` (the component
class and, for a component configured by a strict pydantic model, that config class).

A component joins by one line beside its class::

    @ENCODER_REGISTRY.register("lpn", config=LPNEncoderConfig)
    class LPNEncoder(DemoEncoder): ...

``registry.parse(cfg)`` validates a config mapping with the config class its ``name`` picks (the discriminated
union over the registry), and every refusal is one line naming the dotted key and value
(:func:`core.errors.validation_problems`, the one pydantic error formatter).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Callable, NamedTuple, Optional

import pydantic

from core.errors import validation_problems


class Entry(NamedTuple):
    config: Optional[type]  # the strict pydantic config class (None: configured by keyword arguments)
    cls: type


class Registry(MutableMapping):
    """name -> :class:`Entry`. ``aliases`` are other spellings of a registered name (looked up, never listed).
    Unknown names raise ``error`` (a PlatformError subclass) listing the registered ones."""

    def __init__(self, kind: str, error: type[Exception], *, aliases: Optional[Mapping[str, str]] = None):
        self.kind, self.error = kind, error
        self.aliases = dict(aliases or {})
        self._entries: dict[str, Entry] = {}

    # -- registering ----------------------------------------------------------------------------------------
    def register(self, name: str, *, config: Optional[type] = None) -> Callable[[type], type]:
        """Class decorator: register ``cls`` under ``name`` (twice is an error); sets ``cls.registry_name``."""

        def deco(cls: type) -> type:
            if name in self._entries:
                raise KeyError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = Entry(config, cls)
            cls.registry_name = name
            return cls

        return deco

    # -- lookup -----------------------------------------------------------------------------------------------
    def canonical(self, name: Any) -> str:
        """The registered name ``name`` stands for (itself or an alias); unknown raises ``error``."""
        key = self.aliases.get(name, name) if isinstance(name, str) else name
        if key not in self._entries:
            close = difflib.get_close_matches(str(name), list(self._entries), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise self.error(f"unknown {self.kind} {name!r}; registered: {sorted(self._entries)}{hint}")
        return key

    def entry(self, name: Any) -> Entry:
        return self._entries[self.canonical(name)]

    def parse(self, cfg: Mapping[str, Any], prefix: str) -> pydantic.BaseModel:
        """The validated config of the entry ``cfg["name"]`` picks; a refusal names ``<prefix>.<key>`` and value
        (and, for an unknown key, lists the valid ones)."""
        name = cfg.get("name")
        config_cls = self.entry(name).config
        if config_cls is None:
            raise self.error(f"{self.kind} {name!r} takes no config model")
        try:
            return config_cls(**cfg)
        except pydantic.ValidationError as e:
            problems = "; ".join(validation_problems(e, prefix=f"{prefix}."))
            keys = (
                f" (keys of {config_cls.__name__}: {', '.join(config_cls.model_fields)})"
                if any(x["type"] == "extra_forbidden" for x in e.errors())
                else ""
            )
            raise self.error(f"invalid {self.kind} config for {name!r}: {problems}{keys}") from None

    def configs(self) -> list[type]:
        """The registered config classes (each once)."""
        return list(dict.fromkeys(e.config for e in self._entries.values() if e.config is not None))

    # -- Mapping protocol (iteration lists registered names, not aliases) ---------------------------------
    def __getitem__(self, name: str) -> Entry:
        return self._entries[self.aliases.get(name, name)]

    def __setitem__(self, name: str, value: Any) -> None:  # an Entry, or a bare component class
        self._entries[name] = value if isinstance(value, Entry) else Entry(None, value)

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {sorted(self._entries)})"


__all__ = ["Entry", "Registry"]
