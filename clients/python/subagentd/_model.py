"""The base of the API's types: made from the JSON the API sends, keeping what this version does
not know in `extra`, and back to JSON."""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, ClassVar, Dict, List, Tuple, Type, TypeVar

T = TypeVar("T", bound="Model")

_KEYWORDS = {"try", "from", "global", "class", "def", "return", "import", "pass", "in", "is", "not", "and", "or"}


class Model:
    """An object of the API: its fields as attributes (`try` as `try_`), the rest in `extra`."""

    _fields: ClassVar[List[str]] = []
    #: Fields that hold another model (by its name), or a list of them.
    _nested: ClassVar[Dict[str, Tuple[str, bool]]] = {}
    _required: ClassVar[List[str]] = []
    extra: Dict[str, Any]

    @classmethod
    def from_dict(cls: Type[T], data: Dict[str, Any]) -> T:
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        known: Dict[str, Any] = {}
        for name in cls._fields:
            if name not in data:
                continue
            value = data[name]
            if name in cls._nested and value is not None:
                model_name, many = cls._nested[name]
                model = getattr(sys.modules[cls.__module__], model_name)
                value = [model.from_dict(v) for v in value] if many else model.from_dict(value)
            known[name + "_" if name in _KEYWORDS else name] = value
        extra = {k: v for k, v in data.items() if k not in cls._fields}
        return cls(**known, extra=extra)  # type: ignore[call-arg]

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for name in self._fields:
            value = getattr(self, name + "_" if name in _KEYWORDS else name)
            if value is None:
                continue
            if isinstance(value, Model):
                value = value.to_dict()
            elif isinstance(value, list):
                value = [v.to_dict() if isinstance(v, Model) else v for v in value]
            out[name] = value
        out.update(self.extra)
        return out

    def __getitem__(self, key: str) -> Any:
        """`task["status"]`, as for the JSON."""
        if key in self._fields:
            return getattr(self, key + "_" if key in _KEYWORDS else key)
        return self.extra[key]

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if f.name != "extra" and getattr(self, f.name) is not None
        )
        return f"{type(self).__name__}({shown})"
