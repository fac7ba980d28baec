"""JSON values for job fields: validate on the way in (a clear error naming
the first bad value, before any SQL runs), encode once, and decode what the
database holds for a JobRecord. Standard library only: children import it.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, Mapping, Tuple


def _bad_text(text: str, path: str) -> None:
    raise ValueError(f"{path} contains a NUL character, which Postgres cannot store")


def _check_json_value(value: Any, path: str) -> None:
    """Raise TypeError/ValueError naming the first non-JSON value under path.

    Written for speed on the common shapes (flat dicts of str/int/bool):
    exact type checks first, paths formatted only when descending.
    """
    kind = type(value)
    if kind is str:
        if "\x00" in value:
            _bad_text(value, path)
        return
    if kind is int or kind is bool or value is None:
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                if not isinstance(key, str):
                    raise TypeError(f"{path} has a non-string key {key!r}: JSON object keys are strings")
            if "\x00" in key:
                _bad_text(key, f"{path} key")
            item_kind = type(item)
            if item_kind is str:
                if "\x00" in item:
                    _bad_text(item, f"{path}[{key!r}]")
            elif not (item_kind is int or item_kind is bool or item is None):
                _check_json_value(item, f"{path}[{key!r}]")
        return
    if kind is list or kind is tuple:
        for index, item in enumerate(value):
            _check_json_value(item, f"{path}[{index}]")
        return
    if kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{path} is {value!r}: NaN and infinity are not JSON")
        return
    # subclasses of the JSON types (IntEnum, OrderedDict...) take the slow road
    if isinstance(value, bool) or isinstance(value, int):
        return
    if isinstance(value, float):
        _check_json_value(float(value), path)
        return
    if isinstance(value, str):
        _check_json_value(str(value), path)
        return
    if isinstance(value, Mapping):
        _check_json_value(dict(value), path)
        return
    if isinstance(value, (list, tuple)):
        _check_json_value(list(value), path)
        return
    raise TypeError(f"{path} is a {type(value).__name__}, which is not JSON-serializable")


def _find_surrogate(value: Any, path: str) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{path} contains a lone surrogate, which is not valid UTF-8") from None
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _find_surrogate(key, f"{path} key")
            _find_surrogate(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _find_surrogate(item, f"{path}[{index}]")


def _make_encode() -> Callable[[Any], str]:
    """Compact JSON text of an already-checked value. The C encoder is built
    once: JSONEncoder.encode builds a new one on every call, a third of the
    cost of a small job's args. It keeps no cycle markers: the check before
    it walks the value first, and a cycle ends there in RecursionError."""
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:  # a Python without the C accelerator
        return json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    iterencode = c_make_encoder(None, None, json.encoder.encode_basestring, None, ":", ",",
                                False, False, False)
    return lambda value: "".join(iterencode(value, 0))


_encode = _make_encode()
_quote = json.encoder.encode_basestring  # a JSON string literal (C)


def check_json(value: Any, what: str) -> str:
    """Validate any JSON value; return its compact JSON text."""
    try:
        _check_json_value(value, what)
        text = _encode(value)
    except RecursionError:
        raise ValueError(f"{what} nests too deeply to be encoded as JSON") from None
    if text.isascii():
        return text  # no lone surrogate hides in ASCII
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _find_surrogate(value, what)
        raise ValueError(f"{what} is not valid UTF-8") from None
    return text


UNDECODABLE = "$undecodable"  # the key of the stand-in for JSON Python cannot decode


def decode_json_for_record(text: str) -> Any:
    """Decode a stored JSON value for a JobRecord. JSON nested deeper than
    Python's recursion limit (only raw SQL can store it) becomes a one-key
    stand-in instead of an exception, so one such job cannot break listing
    or showing the others."""
    try:
        return json.loads(text)
    except RecursionError:
        return {UNDECODABLE: f"JSON nested too deeply for Python to decode ({len(text)} characters)"}


def json_object(value: Any, what: str) -> Tuple[Dict[str, Any], str]:
    """Validate a JSON object (dict) and return it with its JSON text."""
    if value is None:
        return {}, "{}"
    if type(value) is not dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"{what} must be a dict (a JSON object), not {type(value).__name__}")
        value = dict(value)
    return value, check_json(value, what)
