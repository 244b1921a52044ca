"""Hostile-input campaign against popplay's run files: bit flips and crafted files.

Trains small, real run files of several domains, damages copies of them and runs
popplay's commands on every damaged copy, each as its own process:

* bit flips: one random bit of a copy (random byte offset, random bit), spread
  round-robin over every domain's file (the deep ones included);
* crafted files: a copy edited with h5py the way a hostile user would (a dataset or
  attribute deleted; a dataset's dtype or shape changed: empty, doubled, 0-d, ...;
  NaN / inf / negative / huge values in counters, datasets and settings; bool where
  an int belongs, text where a number belongs, JSON garbage in JSON attributes,
  terminal escape sequences in strings, links and extra objects, a changed header),
  with the content checksum (``content_sha256``, see
  ``popplay.checkpoints.runfile.content_digest``) recomputed, so that the file
  reaches the checks behind the checksum (about one file in ten is left with its old
  checksum, which must be refused as such).

On each damaged file it runs ``inspect``, ``evaluate`` (few games / episodes),
``export --out x.csv``, ``plot --out x.png`` and ``train DOMAIN --resume F`` with a
budget a little larger than the file's, one process at a time, and classifies every run:

* OK        exit 0
* REFUSED   non-zero exit, no traceback (normally one ``Error: ...`` line, exit 2)
* INTERNAL  stderr or stdout holds "internal error" or "Traceback"
* CRASH     killed by a signal (segfault, abort, ...)
* HANG      still running after --timeout seconds (its whole process group, and any
            process left in its session, is killed)

It also notes side effects: a file left in the run's directory or in TMPDIR (a
``.tmp``, a lock, an output written by a failed command), a changed input (by
anything but a successful ``--resume``), a process left running after the command
exited, and crafted terminal escapes that reached the terminal unescaped.

Run it against a snapshot of the repository (so that concurrent edits do not change
what is measured), with the project's virtual environment, one process at a time::

    rm -rf /tmp/hsnap && mkdir /tmp/hsnap && cd /work/main && git archive HEAD | tar -x -C /tmp/hsnap
    cp /work/main/benchmarks/hostile_files.py /tmp/hsnap/benchmarks/
    mkdir -p /tmp/hostile && cd /tmp/hostile
    PYTHONPATH=/tmp/hsnap /work/main/.venv/bin/python /tmp/hsnap/benchmarks/hostile_files.py \\
        --workdir /tmp/hostile/work --json /tmp/hostile/report.json

The popplay it runs is the one beside this script (``--repo``, default: the parent of
``benchmarks/``), put first on PYTHONPATH of every command. Sizes: ``--flips N``
damaged files by bit flips and ``--crafted N`` crafted files (every file gets every
command of ``--commands``), ``--timeout S`` per command, ``--seed S``; ``--max-minutes``
stops starting new files after that long (what was done is reported, and the report
says the budget cut it short). The same seed and sizes give the same damaged files.
Every INTERNAL, CRASH and HANG case is written to the JSON report (command,
mutation, stderr tail) and its damaged file kept under ``WORKDIR/keep/``; every run is
also logged as one JSON line in ``WORKDIR/runs.jsonl``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CLASSES = ("OK", "REFUSED", "INTERNAL", "CRASH", "HANG")
COMMANDS = ("inspect", "evaluate", "export", "plot", "resume")
DIGEST = "content_sha256"
RUN_NAME = "run.h5"
ESCAPES = ("\x1b]0;HOSTILE\x07", "\x1b[31mHOSTILE\x1b[0m\x1b[2J")
ESCAPE_MARKERS = (b"\x1b]0;HOSTILE", b"\x1b[31mHOSTILE", b"\x1b[2J")

# ---------------------------------------------------------------------------------------
# Domains: how to train a tiny run file, what `evaluate` needs, and a resume budget.

DEEP_EVAL = ["--episodes", "2"]


def _budget_episodes(config: dict, counters: dict, extra: int) -> list[str]:
    done = max(int(config.get("episodes") or 0), int(counters.get("episodes", counters.get("episode", 0)) or 0))
    return ["--episodes", str(done + extra)]


def _budget_env_steps(config: dict, counters: dict, extra: int) -> list[str]:
    done = max(int(config.get("env_steps") or 0), int(counters.get("env_steps", 0) or 0))
    return ["--env-steps", str(done + extra)]


def _budget_agent_steps(config: dict, counters: dict, extra: int) -> list[str]:
    return ["--agent-steps", str(2 * int(config["agents"]) * int(config["steps_per_agent"]))]


DOMAINS: dict[str, dict[str, Any]] = {
    "bandit": dict(command="bandit", evaluate=[],
                   train=["--arms", "5", "--agents", "8", "--trials", "4", "--agent-steps", "64"],
                   budget=lambda c, s: _budget_agent_steps(c, s, 0)),
    "cartpole": dict(command="cartpole", evaluate=[],
                     train=["--agents", "4", "--trials", "2", "--agent-steps", "512", "--share-every", "16",
                            "--test-steps", "64"],
                     budget=lambda c, s: _budget_agent_steps(c, s, 0)),
    "knights": dict(command="knights", evaluate=["--games", "4"],
                    train=["--agents", "4", "--games-per-agent", "2", "--episodes", "4", "--eval-every", "2",
                           "--eval-games", "4", "--rows", "4", "--cols", "4", "--pieces", "2",
                           "--replicate-every", "2", "--snapshot-every", "2"],
                    budget=lambda c, s: ["--episodes", str(max(int(c["episodes"]), int(s.get("episode", 0))) + 2)]),
    "dqn": dict(command="dqn", evaluate=DEEP_EVAL,
                train=["--episodes", "8", "--hidden", "16", "--eval-episodes", "2", "--learning-starts", "32",
                       "--batch-size", "16"],
                budget=lambda c, s: _budget_episodes(c, s, 4)),
    "dqn_pop": dict(command="dqn", evaluate=DEEP_EVAL,
                    train=["--agents", "2", "--phase-steps", "50", "--env-steps", "400", "--hidden", "16",
                           "--eval-episodes", "2", "--learning-starts", "32", "--batch-size", "16",
                           "--replicate-every", "100"],
                    budget=lambda c, s: _budget_env_steps(c, s, 200)),
    "reinforce": dict(command="reinforce", evaluate=DEEP_EVAL,
                      train=["--episodes", "4", "--hidden", "16", "--eval-episodes", "2"],
                      budget=lambda c, s: _budget_episodes(c, s, 4)),
    "a2c": dict(command="a2c", evaluate=DEEP_EVAL,
                train=["--episodes", "4", "--hidden", "16", "--eval-episodes", "2"],
                budget=lambda c, s: _budget_episodes(c, s, 4)),
    "ppo": dict(command="ppo", evaluate=DEEP_EVAL,
                train=["--env-steps", "256", "--hidden", "16", "--eval-episodes", "2", "--batch-size", "64",
                       "--n-epochs", "2"],
                budget=lambda c, s: _budget_env_steps(c, s, 128)),
    "gorila": dict(command="gorila", evaluate=DEEP_EVAL,
                   train=["--actors", "1", "--learners", "1", "--shards", "1", "--env-steps", "300", "--hidden", "16",
                          "--timeout", "15", "--eval-episodes", "2"],
                   budget=lambda c, s: _budget_env_steps(c, s, 100)),
}

# ---------------------------------------------------------------------------------------
# Hostile values, by name (a mutation's description stays plain JSON).

_DEEP_JSON = "[" * 200_000 + "]" * 200_000

VALUES: dict[str, Callable[[], Any]] = {
    # numbers
    "nan": lambda: np.float64("nan"), "inf": lambda: np.float64("inf"), "-inf": lambda: np.float64("-inf"),
    "neg1": lambda: np.int64(-1), "neg_float": lambda: np.float64(-0.5), "zero": lambda: np.int64(0),
    "huge_1e12": lambda: np.float64(1e12), "int_1e12": lambda: np.int64(10**12),
    "int64_max": lambda: np.int64(2**63 - 1), "int64_min": lambda: np.int64(-2**63),
    "uint64_2^63": lambda: np.uint64(2**63), "uint64_max": lambda: np.uint64(2**64 - 1),
    "float_1e308": lambda: np.float64(1e308), "frac_3.5": lambda: np.float64(3.5),
    "int8_-128": lambda: np.int8(-128), "float16_nan": lambda: np.float16("nan"),
    # wrong types
    "bool_true": lambda: np.bool_(True), "bool_false": lambda: np.bool_(False),
    "str_12": lambda: np.bytes_(b"12"), "str_abc": lambda: np.bytes_(b"abc"),
    "array_1_2": lambda: np.array([1, 2], dtype=np.int64), "array_empty": lambda: np.zeros(0, dtype=np.float64),
    "array_2d": lambda: np.ones((2, 2)),
    # strings
    "escape_title": lambda: np.bytes_(ESCAPES[0].encode()), "escape_color": lambda: np.bytes_(ESCAPES[1].encode()),
    "empty_str": lambda: np.bytes_(b"\0"), "non_utf8": lambda: np.bytes_(b"\xff\xfe\x80run"),
    "long_str_60k": lambda: np.bytes_(b"A" * 60_000), "vlen_str": lambda: "variable length \u2603",
    "newlines": lambda: np.bytes_(b"line1\nError: fake\r\nline3"),
    # JSON garbage
    "json_garbage": lambda: np.bytes_(b"{not json"), "json_list": lambda: np.bytes_(b"[]"),
    "json_null": lambda: np.bytes_(b"null"), "json_number": lambda: np.bytes_(b"7"),
    "json_string": lambda: np.bytes_(b'"text"'), "json_nan": lambda: np.bytes_(b"NaN"),
    "json_deep": lambda: np.bytes_(_DEEP_JSON[:30_000].encode() + _DEEP_JSON[-30_000:].encode()),
    "json_obj_of_garbage": lambda: np.bytes_(b'{"a": [1, {"b": NaN}], "c": Infinity, "d": "\x1b[2J"}'),
    "json_list_of_objects": lambda: np.bytes_(b'[{"x": 1}, 2, "three", null, [4]]'),
}

# Values for one key of config_json (plain JSON values; NaN and Infinity as Python writes them).
CONFIG_VALUES: dict[str, Any] = {
    "nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "neg1": -1, "neg_float": -0.5, "zero": 0,
    "huge_1e12": 1e12, "int_1e12": 10**12, "2^63": 2**63, "2^64": 2**64, "10^30": 10**30, "float_1e308": 1e308,
    "frac_3.5": 3.5, "true": True, "false": False, "str_12": "12", "str_abc": "abc", "null": None, "list": [],
    "list_1_2": [1, 2], "object": {}, "escape": ESCAPES[1], "long_str_50k": "B" * 50_000,
    "unknown_env": "NoSuchEnv-v0", "other_domain_env": "Pendulum-v1",
}

CONFIG_RAW: dict[str, bytes] = {
    "not_json": b"{not json", "list": b"[]", "null": b"null", "number": b"7", "string": b'"x"',
    "deep_nesting": ("[" * 30_000 + "]" * 30_000).encode(),
    "deep_object": ('{"a":' * 10_000 + "1" + "}" * 10_000).encode(),
    "truncated": None,  # the real JSON cut in half
    "duplicate_keys": None,  # the real JSON with every key twice, the second value garbage
    "bom": None,  # the real JSON behind a UTF-8 byte order mark
    "non_utf8": b'{"\xff\xfe": 1}', "empty": b"\0", "nan_everywhere": None,
}


def hostile_value(name: str) -> Any:
    return VALUES[name]()


# ---------------------------------------------------------------------------------------
# Mutations: a mutation is a JSON-able dict; apply_mutation performs it on an h5py file.

def _recreate(group: Any, name: str, data: np.ndarray) -> None:
    """A dataset replaced by ``data``, stored the way popplay stores arrays."""
    del group[name]
    kwargs: dict[str, Any] = {}
    if data.ndim and data.size:
        kwargs["fletcher32"] = True
    group.create_dataset(name, data=data, **kwargs)


def _set_attr(obj: Any, key: str, value: Any) -> None:
    if key in obj.attrs:
        del obj.attrs[key]
    if isinstance(value, str):
        import h5py
        obj.attrs.create(key, value, dtype=h5py.string_dtype())
    else:
        obj.attrs[key] = value


def _config_text(f: Any) -> str:
    raw = f["config"].attrs["config_json"]
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _set_config_json(f: Any, text: bytes) -> None:
    _set_attr(f["config"], "config_json", np.bytes_(text))


def _to_attr(value: Any) -> Any:
    """A config value as the writer stores it in /config's attributes."""
    if value is None:
        return np.bytes_(b"none")
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, int):
        return np.int64(value) if -2**63 <= value < 2**63 else np.bytes_(str(value).encode())
    if isinstance(value, float):
        return np.float64(value)
    if isinstance(value, str):
        return np.bytes_(value.encode() or b"\0")
    return np.bytes_(json.dumps(value).encode())


def _values_for_dtype(data: np.ndarray, how: str, rng: random.Random) -> np.ndarray:
    out = np.array(data, copy=True)
    flat = out.reshape(-1)
    if not flat.size:
        return out
    index = slice(None) if how.startswith("all_") else rng.randrange(flat.size)
    what = how.split("_", 1)[1]
    kind = out.dtype.kind
    if kind == "f":
        table = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "neg1": -1.0, "huge": 1e12,
                 "max": np.finfo(out.dtype).max,
                 "zero": 0.0, "random": None}
    elif kind in "iu":
        info = np.iinfo(out.dtype)
        table = {"nan": info.max, "inf": info.max, "-inf": info.min, "neg1": -1 if kind == "i" else info.max,
                 "huge": min(10**12, info.max), "max": info.max, "zero": 0, "random": None}
    else:  # bool
        table = {k: True for k in ("nan", "inf", "-inf", "neg1", "huge", "max")} | {"zero": False, "random": None}
    value = table[what]
    if value is None:
        raw = np.frombuffer(rng.randbytes(flat[index].nbytes if isinstance(index, slice) else out.dtype.itemsize),
                            dtype=out.dtype)
        flat[index] = raw if isinstance(index, slice) else raw[0]
    else:
        flat[index] = value
    return out


def apply_mutation(f: Any, m: dict[str, Any]) -> None:
    """Perform mutation ``m`` on the open (r+) h5py file ``f``."""
    import h5py

    op = m["op"]
    rng = random.Random(m.get("rng", 0))
    if op == "attr_delete":
        del f[m["group"]].attrs[m["key"]]
    elif op == "attr_set":
        _set_attr(f[m["group"]], m["key"], hostile_value(m["value"]))
    elif op == "config_set":
        config = json.loads(_config_text(f))
        value = CONFIG_VALUES[m["value"]]
        config[m["key"]] = value
        _set_config_json(f, json.dumps(config, sort_keys=True).encode())
        if m["key"] in f["config"].attrs:
            _set_attr(f["config"], m["key"], _to_attr(value))
    elif op == "config_delete":
        config = json.loads(_config_text(f))
        config.pop(m["key"], None)
        _set_config_json(f, json.dumps(config, sort_keys=True).encode())
        if m["key"] in f["config"].attrs:
            del f["config"].attrs[m["key"]]
    elif op == "config_add":
        config = json.loads(_config_text(f))
        config[m["key"]] = CONFIG_VALUES[m["value"]]
        _set_config_json(f, json.dumps(config, sort_keys=True).encode())
    elif op == "config_raw":
        text = _config_text(f)
        raw = CONFIG_RAW[m["value"]]
        if m["value"] == "truncated":
            raw = text[: len(text) // 2].encode()
        elif m["value"] == "duplicate_keys":
            config = json.loads(text)
            raw = ("{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}, {json.dumps(k)}: [\"dup\"]"
                                   for k, v in config.items()) + "}").encode()
        elif m["value"] == "bom":
            raw = b"\xef\xbb\xbf" + text.encode()
        elif m["value"] == "nan_everywhere":
            config = json.loads(text)
            raw = json.dumps({k: (float("nan") if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                              for k, v in config.items()}).encode()
        _set_config_json(f, raw)
    elif op == "ds_delete":
        del f[m["path"]]
    elif op == "ds_dtype":
        data = f[m["path"]][()]
        parent, name = m["path"].rsplit("/", 1)
        with np.errstate(all="ignore"):
            _recreate(f[parent], name, np.asarray(data).astype(m["dtype"]))
    elif op == "ds_shape":
        data = np.asarray(f[m["path"]][()])
        parent, name = m["path"].rsplit("/", 1)
        how = m["how"]
        if how == "empty":
            new = data[:0] if data.ndim else np.zeros(0, data.dtype)
        elif how == "empty_flat":
            new = np.zeros(0, data.dtype)
        elif how == "double":
            new = np.concatenate([data, data]) if data.ndim else np.array([data, data])
        elif how == "scalar":
            new = np.asarray(data.reshape(-1)[0] if data.size else np.zeros((), data.dtype))
        elif how == "flat":
            new = data.reshape(-1)
        elif how == "extra_dim":
            new = data[np.newaxis]
        elif how == "drop_last":
            new = data[:-1] if data.ndim else data
        elif how == "transpose":
            new = np.ascontiguousarray(data.T)
        elif how == "grow_100":
            new = np.repeat(data, 100, axis=0) if data.ndim else np.repeat(data, 100)
        else:
            raise ValueError(how)
        _recreate(f[parent], name, np.ascontiguousarray(new))
    elif op == "ds_values":
        data = np.asarray(f[m["path"]][()])
        parent, name = m["path"].rsplit("/", 1)
        _recreate(f[parent], name, _values_for_dtype(data, m["how"], rng))
    elif op == "group_to_dataset":
        del f[m["path"]]
        f.create_dataset(m["path"], data=np.arange(4, dtype=np.int64))
    elif op == "dataset_to_group":
        del f[m["path"]]
        f.create_group(m["path"])
    elif op == "soft_link":
        f[m["path"] + "_link"] = h5py.SoftLink(m["path"])
        if m.get("replace"):
            del f[m["path"]]
            f[m["path"]] = h5py.SoftLink(m["path"] + "_link")  # a cycle
    elif op == "external_link":
        f[m["path"]] = h5py.ExternalLink("/etc/passwd", "/x")
    elif op == "add_dataset":
        f.create_dataset(m["path"], data=np.arange(m.get("n", 8), dtype=m.get("dtype", "int64")))
    elif op == "string_dataset":
        f.create_dataset(m["path"], data=np.array([b"abc", ESCAPES[1].encode()]))
    elif op == "compound_dataset":
        f.create_dataset(m["path"], data=np.zeros(3, dtype=[("a", "i8"), ("b", "f8")]))
    elif op == "huge_declared":
        f.create_dataset(m["path"], shape=(m.get("n", 10**9),), dtype="f8", chunks=(m.get("chunk", 4096),))
    elif op == "replace_huge_declared":
        dtype = f[m["path"]].dtype
        del f[m["path"]]
        f.create_dataset(m["path"], shape=(m.get("n", 10**8),), dtype=dtype, chunks=(m.get("chunk", 1 << 16),))
    else:
        raise ValueError(f"unknown op {op}")


def structure(path: Path) -> dict[str, Any]:
    """Datasets, attributes (by group) and config keys of a clean run file."""
    import h5py

    datasets, attrs = [], []
    with h5py.File(path, "r") as f:
        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                datasets.append({"path": name, "dtype": obj.dtype.str, "shape": list(obj.shape)})
            for key in obj.attrs:
                attrs.append({"group": name, "key": key, "value": type(obj.attrs[key]).__name__})
        for key in f.attrs:
            if key != DIGEST:
                attrs.append({"group": "/", "key": key, "value": type(f.attrs[key]).__name__})
        f.visititems(visit)
        config = json.loads(_config_text(f))
        counters = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in f["state"].attrs.items()}
        groups = [k for k in f if isinstance(f[k], h5py.Group)]
    return {"datasets": datasets, "attrs": attrs, "config": config, "counters": counters, "groups": groups}


NUMERIC_ATTR_VALUES = ["nan", "inf", "-inf", "neg1", "neg_float", "zero", "huge_1e12", "int_1e12", "int64_max",
                       "int64_min", "uint64_2^63", "uint64_max", "float_1e308", "frac_3.5", "int8_-128",
                       "float16_nan", "bool_true", "bool_false", "str_12", "str_abc", "array_1_2", "array_empty",
                       "array_2d", "escape_color"]
STRING_ATTR_VALUES = ["escape_title", "escape_color", "empty_str", "non_utf8", "long_str_60k", "vlen_str", "newlines",
                      "int_1e12", "nan", "bool_true", "array_1_2"]
JSON_ATTR_VALUES = ["json_garbage", "json_list", "json_null", "json_number", "json_string", "json_nan", "json_deep",
                    "json_obj_of_garbage", "json_list_of_objects", "escape_color", "non_utf8", "vlen_str"]
HEADER_VALUES = {
    "domain": ["escape_title", "empty_str", "str_abc", "non_utf8", "bool_true", "int_1e12", "vlen_str",
               "other_domain"],
    "format": ["str_abc", "empty_str", "bool_true", "vlen_str"],
    "schema_version": ["zero", "neg1", "nan", "str_12", "bool_true", "int64_max", "frac_3.5", "uint64_max"],
    "complete": ["bool_false", "str_12", "int_1e12", "nan", "array_1_2"],
    "config_complete": ["bool_false", "str_abc", "int_1e12", "nan"],
}
DTYPES = ["float64", "float32", "float16", "int64", "int32", "int8", "uint8", "uint64", "bool"]
SHAPES = ["empty", "empty_flat", "double", "scalar", "flat", "extra_dim", "drop_last", "transpose", "grow_100"]
DS_VALUES = ["one_nan", "all_nan", "one_inf", "one_-inf", "one_neg1", "all_neg1", "one_huge", "all_huge", "one_max",
             "all_zero", "all_random", "one_random"]


def candidates(domain: str, info: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every crafted mutation of one domain's file, by category."""
    cats: dict[str, list[dict[str, Any]]] = defaultdict(list)
    others = [d for d in DOMAINS if DOMAINS[d]["command"] != DOMAINS[domain]["command"]]
    for a in info["attrs"]:
        group, key = a["group"], a["key"]
        if group == "config" and key == "config_json":
            continue
        where = ("header" if group == "/" and key in HEADER_VALUES else
                 "counter" if group == "state" else
                 "json_attr" if key.endswith("_json") or key in ("lost", "config_settings") else
                 "root_attr" if group == "/" else
                 "config_attr" if group == "config" else "other_attr")
        cats["attr_delete"].append({"op": "attr_delete", "group": group, "key": key})
        if where == "header":
            for v in HEADER_VALUES[key]:
                if v == "other_domain":
                    for other in others:
                        cats["header"].append({"op": "attr_set", "group": group, "key": key, "value": "other_domain",
                                               "other_domain": other})
                    continue
                cats["header"].append({"op": "attr_set", "group": group, "key": key, "value": v})
        elif where == "json_attr":
            for v in JSON_ATTR_VALUES:
                cats["json_attr"].append({"op": "attr_set", "group": group, "key": key, "value": v})
        else:
            values = STRING_ATTR_VALUES if a["value"] == "bytes_" else NUMERIC_ATTR_VALUES
            for v in values:
                cats[where].append({"op": "attr_set", "group": group, "key": key, "value": v})
    cats["header"].append({"op": "attr_delete", "group": "/", "key": DIGEST, "keep_digest": True})
    cats["header"].append({"op": "attr_set", "group": "/", "key": DIGEST, "value": "escape_color", "keep_digest": True})
    for key in info["config"]:
        for v in CONFIG_VALUES:
            cats["config_set"].append({"op": "config_set", "key": key, "value": v})
        cats["config_delete"].append({"op": "config_delete", "key": key})
    for v in ("str_abc", "nan", "huge_1e12"):
        cats["config_delete"].append({"op": "config_add", "key": "no_such_setting", "value": v})
    for v in CONFIG_RAW:
        cats["config_raw"].append({"op": "config_raw", "value": v})
    for d in info["datasets"]:
        p = d["path"]
        cats["ds_delete"].append({"op": "ds_delete", "path": p})
        for t in DTYPES:
            if np.dtype(t).str != d["dtype"]:
                cats["ds_dtype"].append({"op": "ds_dtype", "path": p, "dtype": t})
        for s in SHAPES:
            if s == "transpose" and len(d["shape"]) < 2:
                continue
            cats["ds_shape"].append({"op": "ds_shape", "path": p, "how": s})
        for v in DS_VALUES:
            cats["ds_values"].append({"op": "ds_values", "path": p, "how": v})
        cats["structure"].append({"op": "dataset_to_group", "path": p})
        cats["structure"].append({"op": "soft_link", "path": p})
        cats["structure"].append({"op": "replace_huge_declared", "path": p})
    for g in info["groups"]:
        cats["structure"].append({"op": "group_to_dataset", "path": g})
        cats["structure"].append({"op": "soft_link", "path": g, "replace": True})
    for where in ("state", "curves", "results", "extra_group"):
        cats["structure"].append({"op": "add_dataset", "path": f"{where}/hostile"})
        cats["structure"].append({"op": "add_dataset", "path": f"{where}/hostile_u64", "dtype": "uint64", "n": 3})
        cats["structure"].append({"op": "string_dataset", "path": f"{where}/hostile_text"})
        cats["structure"].append({"op": "compound_dataset", "path": f"{where}/hostile_compound"})
        cats["structure"].append({"op": "external_link", "path": f"{where}/hostile_external"})
        cats["structure"].append({"op": "huge_declared", "path": f"{where}/hostile_huge"})
        cats["structure"].append({"op": "huge_declared", "path": f"{where}/hostile_tiny_chunks", "n": 10**7,
                                  "chunk": 1})
    return cats


# Categories in the order they are drawn (a category listed twice is drawn twice as often).
CATEGORY_CYCLE = ["config_set", "counter", "ds_values", "ds_shape", "config_set", "ds_dtype", "json_attr", "header",
                  "ds_delete", "attr_delete", "config_raw", "config_delete", "counter", "structure", "config_set",
                  "root_attr", "other_attr", "ds_values", "config_attr", "ds_shape"]


def plan_crafted(domains: list[str], infos: dict[str, dict], total: int, rng: random.Random) -> list[tuple[str, dict]]:
    """``total`` crafted mutations spread round-robin over ``domains``, each domain's
    drawn by category from CATEGORY_CYCLE (randomly within a category, no repeats)."""
    pools = {d: candidates(d, infos[d]) for d in domains}
    for d in domains:
        for cat in pools[d].values():
            rng.shuffle(cat)
    position = {d: rng.randrange(len(CATEGORY_CYCLE)) for d in domains}
    plan = []
    for i in range(total):
        d = domains[i % len(domains)]
        for _ in range(len(CATEGORY_CYCLE)):
            cat = CATEGORY_CYCLE[position[d] % len(CATEGORY_CYCLE)]
            position[d] += 1
            if pools[d].get(cat):
                m = dict(pools[d][cat].pop())
                m["category"] = cat
                m["rng"] = rng.randrange(2**31)
                # about one crafted file in ten keeps its old checksum: it must be refused as damage
                if not m.get("keep_digest") and rng.random() < 0.1:
                    m["keep_digest"] = True
                plan.append((d, m))
                break
    return plan


def describe(m: dict[str, Any]) -> str:
    keys = [k for k in ("op", "group", "key", "path", "value", "dtype", "how", "other_domain", "n", "chunk", "replace")
            if k in m]
    text = " ".join(f"{k}={m[k]}" for k in keys)
    if m.get("keep_digest"):
        text += " (old checksum kept)"
    elif m.get("digest_not_recomputed"):
        text += " (checksum could not be recomputed)"
    return text


def make_crafted(clean: Path, out: Path, m: dict[str, Any]) -> bool:
    """Write ``clean`` with mutation ``m`` to ``out``; False if its checksum could not
    be recomputed (the old one stays)."""
    import h5py

    from popplay.checkpoints.runfile import content_digest

    shutil.copyfile(clean, out)
    with h5py.File(out, "r+") as f:
        if m.get("other_domain"):
            _set_attr(f, "domain", np.bytes_(DOMAINS[m["other_domain"]]["command"].encode()))
        else:
            apply_mutation(f, m)
        if not m.get("keep_digest"):
            try:
                digest = content_digest(f)
            except Exception:  # e.g. a dangling link: the old checksum stays
                return False
            _set_attr(f, DIGEST, np.bytes_(digest.encode()))
    return True


def make_flip(clean: Path, out: Path, offset: int, bit: int) -> None:
    data = bytearray(clean.read_bytes())
    data[offset] ^= 1 << bit
    out.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------
# Running one command.

def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def session_processes(sid: int) -> list[int]:
    """Processes (other than zombies) whose session id is ``sid``: what a command left behind."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields and fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry))
    return found


def kill_session(sid: int) -> list[int]:
    """SIGKILL the process group ``sid`` and any process still in session ``sid`` (all of
    them started by this campaign's command); returns what was left before killing."""
    left = session_processes(sid)
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in session_processes(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def argv_for(domain: str, command: str, resume_budget: list[str]) -> list[str]:
    spec = DOMAINS[domain]
    if command == "inspect":
        return ["inspect", RUN_NAME]
    if command == "evaluate":
        return ["evaluate", RUN_NAME, *spec["evaluate"]]
    if command == "export":
        return ["export", RUN_NAME, "--out", "x.csv"]
    if command == "plot":
        return ["plot", RUN_NAME, "--out", "x.png"]
    if command == "resume":
        return ["train", spec["command"], "--resume", RUN_NAME, *resume_budget, "--quiet"]
    raise ValueError(command)


def classify(rc: int | None, timed_out: bool, out: bytes, err: bytes) -> str:
    if timed_out:
        return "HANG"
    text = (err + out).decode("utf-8", "replace")
    if "internal error" in text.lower() or "Traceback" in text:
        return "INTERNAL"
    if rc is not None and rc < 0:
        return "CRASH"
    if rc == 0:
        return "OK"
    return "REFUSED"


def first_error(err: bytes, out: bytes) -> str:
    """The line that says what went wrong: popplay's 'internal error' or 'Error:' line,
    a traceback's last line, or else the last line of stderr."""
    lines = [line.strip() for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
    for line in lines:
        if "internal error" in line.lower():
            return line[:400]
    if any(line.startswith("Traceback") for line in lines):
        return lines[-1][:400]
    for line in lines:
        if line.startswith("Error"):
            return line[:400]
    if not lines:
        lines = [line.strip() for line in out.decode("utf-8", "replace").splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:400]


class Campaign:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.workdir).resolve()
        self.python = args.python
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join([str(Path(args.repo).resolve())] +
                                                 [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.env.pop("POPPLAY_DEBUG", None)
        self.env["TMPDIR"] = str(self.work / "tmp")
        self.env["MPLCONFIGDIR"] = str(self.work / "mpl")
        self.env["COLUMNS"] = "120"
        self.rundir = self.work / "run"
        self.results: list[dict[str, Any]] = []
        self.log = None

    def popplay(self, argv: list[str], cwd: Path, timeout: float) -> dict[str, Any]:
        out_path, err_path = self.work / "stdout.txt", self.work / "stderr.txt"
        started = time.perf_counter()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([self.python, "-m", "popplay", *argv], cwd=cwd, env=self.env, stdout=out,
                                    stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
            timed_out = False
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                kill_session(proc.pid)
                rc = proc.wait()
        # a command that exited but left processes of its session running
        left = [] if timed_out else kill_session(proc.pid)
        return {"rc": rc, "timed_out": timed_out, "seconds": round(time.perf_counter() - started, 2),
                "stdout": out_path.read_bytes(), "stderr": err_path.read_bytes(), "left_processes": len(left)}

    # -- setup --------------------------------------------------------------------------
    def train_base(self, domains: list[str]) -> dict[str, dict[str, Any]]:
        base = self.work / "base"
        base.mkdir(parents=True, exist_ok=True)
        infos = {}
        for d in domains:
            path = base / f"{d}.h5"
            if not path.exists():
                spec = DOMAINS[d]
                r = self.popplay(["train", spec["command"], *spec["train"], "--out", str(path), "--quiet"], base,
                                 timeout=600)
                if r["rc"] != 0 or not path.exists():
                    raise SystemExit(f"could not train the {d} run file: rc {r['rc']}: "
                                     f"{r['stderr'].decode(errors='replace')[-2000:]}")
            info = structure(path)
            info["resume_budget"] = DOMAINS[d]["budget"](info["config"], info["counters"])
            info["size"] = path.stat().st_size
            info["path"] = str(path)
            infos[d] = info
            print(f"  {d:10s} {info['size']:7d} bytes, {len(info['datasets'])} datasets, resume budget "
                  f"{' '.join(info['resume_budget'])}", flush=True)
        return infos

    # -- one damaged file, every command --------------------------------------------------
    def run_file(self, phase: str, domain: str, damaged: Path, mutation: dict[str, Any], info: dict[str, Any],
                 commands: list[str]) -> None:
        before = sha256(damaged)
        for command in commands:
            if self.rundir.exists():
                shutil.rmtree(self.rundir)
            self.rundir.mkdir(parents=True)
            tmp = self.work / "tmp"
            tmp.mkdir(exist_ok=True)
            tmp_before = {p.name for p in tmp.iterdir()}
            target = self.rundir / RUN_NAME
            shutil.copyfile(damaged, target)
            argv = argv_for(domain, command, info["resume_budget"])
            r = self.popplay(argv, self.rundir, self.args.timeout)
            cls = classify(r["rc"], r["timed_out"], r["stdout"], r["stderr"])
            record: dict[str, Any] = {
                "phase": phase, "domain": domain, "command": command, "argv": ["popplay", *argv],
                "mutation": mutation, "describe": mutation.get("describe", ""), "class": cls, "rc": r["rc"],
                "seconds": r["seconds"], "first_error": first_error(r["stderr"], r["stdout"]) if cls != "OK" else "",
            }
            # side effects
            effects = []
            expected = {RUN_NAME}
            if r["rc"] == 0 and command == "export":
                expected.add("x.csv")
            if r["rc"] == 0 and command == "plot":
                expected.add("x.png")
            extra = sorted(p.name for p in self.rundir.iterdir() if p.name not in expected)
            if extra:
                effects.append(f"left in the run's directory: {', '.join(extra)}")
            # torch's own compiler cache (torchinductor_USER) is a cache, not a leftover
            left_tmp = sorted(p.name for p in tmp.iterdir()
                              if p.name not in tmp_before and not p.name.startswith("torchinductor_"))
            for name in left_tmp:
                shutil.rmtree(tmp / name, ignore_errors=True) if (tmp / name).is_dir() else (tmp / name).unlink()
            if left_tmp:
                effects.append(f"left in TMPDIR: {', '.join(left_tmp[:5])}")
            after = sha256(target)
            if after != before and not (command == "resume" and r["rc"] == 0):
                effects.append("input file changed" if after else "input file gone")
            if r["left_processes"]:
                effects.append(f"{r['left_processes']} process(es) still running after exit (killed)")
            both = r["stdout"] + r["stderr"]
            if any(marker in both for marker in ESCAPE_MARKERS):
                effects.append("a crafted terminal escape reached the output unescaped")
            if cls == "REFUSED":
                lines = [l for l in r["stderr"].decode("utf-8", "replace").splitlines() if l.strip()]
                errors = [l for l in lines if l.startswith("Error")]
                if not errors:
                    effects.append("refused without an 'Error:' line")
                elif len(errors) > 1:
                    effects.append(f"{len(errors)} 'Error' lines")
            record["side_effects"] = effects
            if cls in ("INTERNAL", "CRASH", "HANG"):
                record["stderr_tail"] = r["stderr"].decode("utf-8", "replace")[-3000:]
                record["stdout_tail"] = r["stdout"].decode("utf-8", "replace")[-1000:]
            if cls in ("INTERNAL", "CRASH", "HANG") or effects:
                keep = self.work / "keep"
                keep.mkdir(exist_ok=True)
                kept = keep / f"{len(self.results):05d}-{phase}-{domain}-{command}.h5"
                shutil.copyfile(damaged, kept)
                record["kept_file"] = str(kept)
            self.results.append(record)
            self.log.write(json.dumps(record, default=str) + "\n")
            self.log.flush()
            mark = "" if cls in ("OK", "REFUSED") else f"  <-- {cls}: {record['first_error'][:150]}"
            if effects:
                mark += f"  [{'; '.join(effects)}]"
            if self.args.verbose or mark:
                print(f"    {phase:7s} {domain:9s} {command:8s} {cls:8s} rc={r['rc']} {r['seconds']:5.1f}s "
                      f"{mutation.get('describe', '')[:90]}{mark}", flush=True)

    # -- the campaign -------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        args = self.args
        started = time.time()
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "mpl").mkdir(exist_ok=True)
        (self.work / "tmp").mkdir(exist_ok=True)
        cases = self.work / "cases"
        if cases.exists():
            shutil.rmtree(cases)
        cases.mkdir()
        self.log = open(self.work / "runs.jsonl", "w")
        domains = args.domains.split(",")
        commands = args.commands.split(",")
        print(f"training the clean run files in {self.work / 'base'} ...", flush=True)
        infos = self.train_base(domains)
        setup_seconds = time.time() - started

        # Controls: every command on every clean file (not counted as hostile runs).
        print("controls: every command on the clean files ...", flush=True)
        for d in domains:
            self.run_file("control", d, Path(infos[d]["path"]), {"describe": "clean copy"}, infos[d], commands)

        rng = random.Random(args.seed)
        flips = []
        for i in range(args.flips):
            d = domains[i % len(domains)]
            flips.append((d, {"op": "bit_flip", "offset": rng.randrange(infos[d]["size"]), "bit": rng.randrange(8)}))
        crafted = plan_crafted(domains, infos, args.crafted, rng)
        # Interleaved, so that a --max-minutes cut leaves both kinds measured.
        order: list[tuple[str, str, dict]] = []
        for i in range(max(len(flips), len(crafted))):
            if i < len(flips):
                order.append(("flip", *flips[i]))
            if i < len(crafted):
                order.append(("crafted", *crafted[i]))
        print(f"{len(flips)} bit-flipped and {len(crafted)} crafted files, {len(commands)} commands each, "
              f"timeout {args.timeout:g} s", flush=True)
        deadline = started + args.max_minutes * 60
        done_files = Counter()
        craft_failures = []
        cut_short = False
        for n, (phase, d, m) in enumerate(order):
            if time.time() > deadline:
                cut_short = True
                print(f"--max-minutes {args.max_minutes:g} reached: {len(order) - n} files not run", flush=True)
                break
            damaged = cases / f"{n:05d}-{phase}-{d}.h5"
            clean = Path(infos[d]["path"])
            try:
                if phase == "flip":
                    make_flip(clean, damaged, m["offset"], m["bit"])
                elif not make_crafted(clean, damaged, m):
                    m = dict(m, digest_not_recomputed=True)
            except Exception as error:  # a mutation h5py cannot store: noted, not run
                craft_failures.append({"domain": d, "mutation": describe(m),
                                       "error": f"{type(error).__name__}: {error}"})
                continue
            m = dict(m, describe=(f"bit_flip offset={m['offset']} bit={m['bit']}" if phase == "flip" else describe(m)))
            self.run_file(phase, d, damaged, m, infos[d], commands)
            damaged.unlink()
            done_files[phase] += 1
            if (n + 1) % 10 == 0:
                counts = Counter(r["class"] for r in self.results if r["phase"] != "control")
                print(f"  [{time.time() - started:6.0f}s] {n + 1}/{len(order)} files; "
                      + ", ".join(f"{c} {counts[c]}" for c in CLASSES), flush=True)
        self.log.close()
        wall = time.time() - started
        return self.report(domains, commands, wall, setup_seconds, done_files, craft_failures, cut_short, infos)

    def report(self, domains, commands, wall, setup_seconds, done_files, craft_failures, cut_short, infos):
        args = self.args
        hostile = [r for r in self.results if r["phase"] != "control"]
        controls = [r for r in self.results if r["phase"] == "control"]
        table: dict[str, dict[str, dict[str, Counter]]] = {}
        for phase in ("flip", "crafted"):
            table[phase] = {d: {c: Counter() for c in commands} for d in domains}
        for r in hostile:
            table[r["phase"]][r["domain"]][r["command"]][r["class"]] += 1

        def print_table(title: str, rows: list[dict]) -> None:
            print(f"\n{title}")
            header = f"{'domain':10s} {'command':9s}" + "".join(f"{c:>9s}" for c in CLASSES) + f"{'runs':>7s}"
            print(header)
            print("-" * len(header))
            for d in domains:
                for c in commands:
                    n = Counter(r["class"] for r in rows if r["domain"] == d and r["command"] == c)
                    if sum(n.values()):
                        print(f"{d:10s} {c:9s}" + "".join(f"{n[k]:9d}" for k in CLASSES) + f"{sum(n.values()):7d}")
            n = Counter(r["class"] for r in rows)
            print("-" * len(header))
            print(f"{'total':20s}" + "".join(f"{n[k]:9d}" for k in CLASSES) + f"{sum(n.values()):7d}")

        print_table("controls (clean files):", controls)
        print_table("bit flips:", [r for r in hostile if r["phase"] == "flip"])
        print_table("crafted files:", [r for r in hostile if r["phase"] == "crafted"])
        print_table("all hostile runs:", hostile)

        totals = Counter(r["class"] for r in hostile)
        findings = [r for r in hostile if r["class"] in ("INTERNAL", "CRASH", "HANG")]
        effects = [r for r in self.results if r["side_effects"]]
        escapes = [r for r in effects if any("escape" in e for e in r["side_effects"])]
        rc_counts = Counter(str(r["rc"]) for r in hostile)
        print(f"\nhostile runs: {len(hostile)} on {done_files['flip']} bit-flipped and {done_files['crafted']} crafted "
              f"files; " + ", ".join(f"{c} {totals[c]}" for c in CLASSES))
        print(f"exit codes: {dict(sorted(rc_counts.items()))}")
        print(f"runs with side effects: {len(effects)}; crafted files that could not be made: {len(craft_failures)}")
        cut = " -- cut short by --max-minutes" if cut_short else ""
        print(f"wall time: {wall:.0f} s (setup {setup_seconds:.0f} s){cut}")
        for r in findings:
            print(f"  {r['class']}: {r['domain']} {' '.join(r['argv'])} | {r['describe']} | {r['first_error'][:200]}")
        for r in effects:
            effects = "; ".join(r["side_effects"])
            print(f"  side effect: {r['domain']} {r['command']} {r['class']} | {r['describe']} | {effects}")

        by_domain = {cls: dict(Counter(r["domain"] for r in hostile if r["class"] == cls)) for cls in CLASSES}
        report = {
            "command": " ".join([sys.executable, *sys.argv]),
            "repo": str(Path(args.repo).resolve()),
            "seed": args.seed, "flips_requested": args.flips, "crafted_requested": args.crafted,
            "timeout_s": args.timeout, "domains": domains, "commands": commands,
            "files_run": dict(done_files), "cut_short": cut_short,
            "wall_seconds": round(wall, 1), "setup_seconds": round(setup_seconds, 1),
            "runs": len(hostile), "totals": {c: totals[c] for c in CLASSES},
            "by_domain": by_domain,
            "exit_codes": dict(rc_counts),
            "table": {p: {d: {c: dict(v) for c, v in cs.items()} for d, cs in ds.items()} for p, ds in table.items()},
            "controls": [{k: r[k] for k in ("domain", "command", "class", "rc", "first_error", "side_effects")}
                         for r in controls],
            "resume_budgets": {d: infos[d]["resume_budget"] for d in domains},
            "findings": findings,
            "side_effects": [{k: r.get(k) for k in ("phase", "domain", "command", "argv", "class", "rc", "describe",
                                                     "side_effects", "first_error", "kept_file")} for r in effects],
            "escape_leaks": len(escapes),
            "craft_failures": craft_failures,
            "runs_log": str(self.work / "runs.jsonl"),
        }
        return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flips", type=int, default=99, help="bit-flipped files (default 99)")
    parser.add_argument("--crafted", type=int, default=99, help="crafted files (default 99)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a command may run (default 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="hostile-work", help="scratch directory (default ./hostile-work)")
    parser.add_argument("--json", dest="json_out", default=None, help="write the report here")
    parser.add_argument("--domains", default=",".join(DOMAINS), help=f"comma-separated, of {', '.join(DOMAINS)}")
    parser.add_argument("--commands", default=",".join(COMMANDS), help=f"comma-separated, of {', '.join(COMMANDS)}")
    parser.add_argument("--max-minutes", type=float, default=34.0,
                        help="start no new damaged file after this many minutes (default 34)")
    parser.add_argument("--repo", default=str(REPO), help="the popplay checkout to run (default: this script's)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run popplay with")
    parser.add_argument("--verbose", action="store_true", help="print every run, not only findings")
    args = parser.parse_args(argv)
    for d in args.domains.split(","):
        if d not in DOMAINS:
            parser.error(f"unknown domain {d}")
    for c in args.commands.split(","):
        if c not in COMMANDS:
            parser.error(f"unknown command {c}")
    sys.path.insert(0, str(Path(args.repo).resolve()))
    report = Campaign(args).run()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1, default=str))
        print(f"report: {args.json_out}")
    bad = report["totals"]["INTERNAL"] + report["totals"]["CRASH"] + report["totals"]["HANG"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
