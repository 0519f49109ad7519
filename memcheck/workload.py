"""Workload files: parse, validate, resolve a profile. Every user mistake is a one-line UsageError.

A file holds one workload (a mapping with `name`) or several (`workloads:` list, with optional
`defaults:` merged into each). `profiles:` (e.g. ci) override parts of a workload; the selected
profile is merged over the base before validation. `full` is the base itself unless defined.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field

from . import rules, yamlfile
from .presets import PRESETS, Preset, from_config

TOP_KEYS = {"name", "description", "model", "requests", "stacks", "thresholds", "rounds", "engine", "profiles",
            "tensor_parallel"}
REQUEST_KEYS = {"count", "prompt_tokens", "max_new_tokens", "images", "arrival_step", "tokens"}
# How prompt token ids are drawn: random, or one id repeated (every token routes to the same
# experts in an MoE model: the skewed-routing case).
TOKEN_PATTERNS = ("random", "repeated")
ENGINE_KEYS = {"block_size", "max_num_seqs", "max_model_len", "max_num_batched_tokens",
               "gpu_memory_utilization", "enforce_eager", "chunked_prefill", "num_blocks", "attention_backend",
               "cuda_graphs"}
# vLLM names its attention backends in capitals (FLASH_ATTN, FLASHINFER, FLASHMLA, TRITON_ATTN, CPU_ATTN, ...).
ATTENTION_BACKEND = re.compile(r"^[A-Z][A-Z0-9_]*$")
MODEL_META = {"preset", "config", "dtype", "seed"}
FULL = "full"  # the profile name of the workload as written (the published architecture)
DTYPES = ("auto", "float32", "bfloat16", "float16")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Above these a value is a typo, not a workload (128K context, 100K requests, 1K layers).
LIMITS = {"count": 100_000, "prompt_tokens": 1 << 20, "max_new_tokens": 1 << 20, "images": 64,
          "arrival_step": 1 << 20, "rounds": 100, "tensor_parallel": 64}
MODEL_INT_LIMIT = 1 << 24
SCHEMA_FILE = "workload.schema.json"  # for editors (yaml-language-server) and check-jsonschema: `memcheck schema`


def schema_text() -> str:
    """The JSON Schema of workload files, shipped beside this module (tests keep it in step with the loader)."""
    from importlib.resources import files

    return files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


@dataclass
class RequestGroup:
    count: int
    prompt_tokens: int
    max_new_tokens: int
    images: int = 0
    arrival_step: int = 0
    tokens: str = "random"


@dataclass
class Workload:
    name: str
    path: str
    line: int
    preset: Preset
    overrides: dict  # architecture fields overridden by the workload (aliases as written)
    dtype: str
    seed: int
    requests: list[RequestGroup]
    stacks: list[str]
    thresholds: dict[str, rules.Rule]
    rounds: int = 1
    engine: dict = field(default_factory=dict)
    profile: str | None = None
    description: str = ""
    tensor_parallel: int = 1

    @property
    def scaled(self) -> bool:
        return bool(self.overrides)

    @property
    def time_gated(self) -> bool:
        """Whether this profile judges time metrics: noisy ones are compared only through repeated rounds, so a
        profile gates time by its `rounds`."""
        return self.rounds >= rules.MIN_ROUNDS_FOR_BAND

    @property
    def image_tokens(self) -> int:
        """Tokens each image takes in the sequence (0 for text-only presets)."""
        return self.preset.tokens_per_image(self.model_config())

    def model_config(self) -> dict:
        """The transformers config dict of this workload's model (preset + overrides)."""
        return self.preset.resolve(self.overrides)

    def request_list(self) -> list[RequestGroup]:
        """One entry per request (groups expanded), in arrival order."""
        out = [RequestGroup(1, g.prompt_tokens, g.max_new_tokens, g.images, g.arrival_step, g.tokens)
               for g in self.requests for _ in range(g.count)]
        return sorted(out, key=lambda r: r.arrival_step)

    def digest(self, attention: str | None = None) -> str:
        """Identity of what the workload runs: a baseline recorded under another digest is incomparable.
        `attention`: the item's attention variant (`hf:eager`), so no other implementation's baseline matches."""
        what = {"preset": self.preset.name, "overrides": self.overrides, "dtype": self.dtype, "seed": self.seed,
                "requests": [asdict(r) for r in self.requests], "rounds": self.rounds, "engine": self.engine,
                "tensor_parallel": self.tensor_parallel}
        if self.preset.config_digest:  # a user's config.json: what it says, not where it lies
            what["preset"] = {"model_type": self.preset.model_type, "config": self.preset.config_digest}
        if attention:  # absent for a plain stack entry: the digests of existing baselines stay as they were
            what["attention"] = attention
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def load_file(path: str, profile: str | None, known_stacks, default_rules: dict[str, rules.Rule]) -> list[Workload]:
    """All workloads of one YAML file, under the selected profile."""
    doc = yamlfile.load(path)
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error("", "a workload file is a mapping (name:, model:, requests:, ...)")
    if "workloads" in data:
        extra = set(data) - {"workloads", "defaults"}
        if extra:
            raise doc.error(sorted(extra)[0], "a file with `workloads:` may only also have `defaults:`")
        items = data["workloads"]
        if not isinstance(items, list) or not items:
            raise doc.error("workloads", "must be a non-empty list of workloads")
        defaults = data.get("defaults") or {}
        if not isinstance(defaults, dict):
            raise doc.error("defaults", "must be a mapping")
        entries = [(f"workloads[{i}]", _merge(defaults, item) if isinstance(item, dict) else item)
                   for i, item in enumerate(items)]
    else:
        entries = [("", data)]
    workloads = [_parse(doc, at, raw, profile, known_stacks, default_rules) for at, raw in entries]
    names = [w.name for w in workloads]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise doc.error(_at(entries[i][0], "name"), f"duplicate workload name {name!r}")
    return workloads


def _at(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _merge(base: dict, over: dict) -> dict:
    """Deep merge of mappings; lists and scalars in `over` replace those in `base`."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _parse(doc, at: str, raw, profile, known_stacks, default_rules) -> Workload:
    def err(field_path: str, message: str):
        return doc.error(_at(at, field_path), message)

    if not isinstance(raw, dict):
        raise err("", "a workload is a mapping (name:, model:, requests:, ...)")
    _unknown(raw, TOP_KEYS, "", err)
    profiles = raw.get("profiles") or {}
    if not isinstance(profiles, dict):
        raise err("profiles", "must be a mapping of profile name to overrides")
    for pname, pbody in profiles.items():
        if not isinstance(pbody, dict):
            raise err(f"profiles.{pname}", "a profile is a mapping of the fields it overrides")
        _unknown(pbody, TOP_KEYS - {"name", "profiles"}, f"profiles.{pname}", err)
    chosen = None
    if profiles and profile == FULL and FULL not in profiles:
        chosen = FULL  # the base workload is the full profile unless the file says otherwise
    elif profiles and profile is not None:
        if profile not in profiles:
            raise err("profiles", f"profile {profile!r} is not defined here (defined: {', '.join(profiles)})")
        raw = _merge(raw, profiles[profile])
        chosen = profile

    name = _require(raw, "name", str, err)
    if not NAME.match(name):
        raise err("name", f"{name!r}: use letters, digits, '.', '_' and '-' (it names baseline files)")
    preset, overrides, dtype, seed = _parse_model(raw, err, os.path.dirname(doc.path))
    requests = _parse_requests(raw, preset, overrides, err)
    stacks = raw.get("stacks", ["hf"])
    if not isinstance(stacks, list) or not stacks or not all(isinstance(s, str) for s in stacks):
        raise err("stacks", "must be a non-empty list of stack names, e.g. [hf, paged]")
    for i, stack in enumerate(stacks):
        _check_stack(stack, known_stacks, lambda m, i=i: err(f"stacks[{i}]", m))
        if stack in stacks[:i]:
            raise err(f"stacks[{i}]", f"{stack!r} is listed twice")
    thresholds = rules.merge(default_rules, raw.get("thresholds") or {},
                             lambda f, m: err(f"thresholds.{f}".rstrip("."), m))
    engine = raw.get("engine") or {}
    if not isinstance(engine, dict):
        raise err("engine", "must be a mapping of engine settings")
    _unknown(engine, ENGINE_KEYS, "engine", err)
    _check_engine(engine, err)
    return Workload(
        name=name, path=doc.path, line=doc.line(_at(at, "name")) or 1, preset=preset, overrides=overrides,
        dtype=dtype, seed=seed, requests=requests, stacks=stacks, thresholds=thresholds,
        rounds=_int(raw, "rounds", err, default=1, minimum=1), engine=engine, profile=chosen,
        description=str(raw.get("description", "")),
        tensor_parallel=_int(raw, "tensor_parallel", err, default=1, minimum=1),
    )


def _model_config(model: dict, doc_dir: str, err) -> Preset:
    """`model: {config: path/to/config.json}`: a Hugging Face config.json, relative to the workload file."""
    if "preset" in model:
        raise err("model.config", "give a preset or a config, not both")
    rel = model["config"]
    if not isinstance(rel, str) or not rel:
        raise err("model.config", f"must be the path of a config.json, got {rel!r}")
    path = os.path.join(doc_dir, rel)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise err("model.config", f"cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise err("model.config", f"{path} is not JSON: {e}") from None
    try:
        return from_config(data, rel)
    except ValueError as e:
        raise err("model.config", f"{path}: {e}") from None


def _parse_model(raw, err, doc_dir: str = "."):
    model = _require(raw, "model", dict, err)
    if "config" in model:
        preset = _model_config(model, doc_dir, err)
    else:
        preset_name = _require(model, "preset", str, lambda f, m: err(f"model.{f}", m))
        if preset_name not in PRESETS:
            raise err("model.preset", f"unknown preset {preset_name!r}; known: {', '.join(sorted(PRESETS))}; "
                                      "or name any model by its config.json (model.config)")
        preset = PRESETS[preset_name]
    preset_name = preset.name
    dtype = model.get("dtype", "auto")
    if dtype not in DTYPES:
        raise err("model.dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    seed = _int(model, "seed", lambda f, m: err(f"model.{f}", m), default=0, minimum=0)
    overrides = {k: v for k, v in model.items() if k not in MODEL_META}
    fields = preset.fields()
    base = preset.text_config(preset.config)
    for key, value in overrides.items():
        if key not in fields:
            raise err(f"model.{key}", f"not an architecture field of {'config' if preset.config_digest else 'preset'} "
                                      f"{preset_name!r}")
        if key in ("vision", "high_res_vision"):
            if not isinstance(value, dict):
                raise err(f"model.{key}", "must be a mapping of the tower's config fields")
            continue
        current = base.get(preset.field_name(key))
        if isinstance(current, int) and not isinstance(current, bool):
            if isinstance(value, bool) or not isinstance(value, int):
                raise err(f"model.{key}", f"must be an integer, got {value!r}")
            if value < 1 or value > MODEL_INT_LIMIT:
                raise err(f"model.{key}", f"{value} is out of range (1..{MODEL_INT_LIMIT})")
    config = preset.text_config(preset.resolve(overrides))
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise err("model", f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})")
    if preset.family == "dense" and heads and "head_dim" not in config and config.get("hidden_size", 0) % heads:
        raise err("model", f"hidden_size ({config['hidden_size']}) must be a multiple of num_attention_heads ({heads})")
    experts_field = preset.field_name("experts")
    experts, per_token = config.get(experts_field), config.get("num_experts_per_tok")
    if experts and per_token and per_token > experts:
        raise err("model", f"num_experts_per_tok ({per_token}) exceeds {experts_field} ({experts})")
    return preset, overrides, dtype, seed


def _parse_requests(raw, preset, overrides, err) -> list[RequestGroup]:
    items = _require(raw, "requests", list, err)
    if not items:
        raise err("requests", "must list at least one request group")
    resolved = preset.resolve(overrides)
    max_len = preset.text_config(resolved).get("max_position_embeddings")
    per_image = preset.tokens_per_image(resolved)
    groups = []
    for i, item in enumerate(items):
        where = f"requests[{i}]"
        if not isinstance(item, dict):
            raise err(where, "a request group is a mapping (count, prompt_tokens, max_new_tokens)")
        _unknown(item, REQUEST_KEYS, where, err)
        sub = lambda f, m, w=where: err(f"{w}.{f}", m)  # noqa: E731
        group = RequestGroup(
            count=_int(item, "count", sub, default=1, minimum=1),
            prompt_tokens=_int(item, "prompt_tokens", sub, minimum=1),
            max_new_tokens=_int(item, "max_new_tokens", sub, minimum=1),
            images=_int(item, "images", sub, default=0, minimum=0),
            arrival_step=_int(item, "arrival_step", sub, default=0, minimum=0),
            tokens=item.get("tokens", "random"),
        )
        if group.tokens not in TOKEN_PATTERNS:
            raise err(f"{where}.tokens", f"must be one of {', '.join(TOKEN_PATTERNS)}, got {group.tokens!r}")
        if group.images and not per_image:
            raise err(f"{where}.images", f"preset {preset.name!r} takes no images")
        total = group.prompt_tokens + group.images * per_image + group.max_new_tokens
        if max_len and total > max_len:
            raise err(where, f"prompt + image + new tokens = {total} exceeds the model's "
                             f"max_position_embeddings ({max_len})")
        groups.append(group)
    return groups


def _check_stack(entry: str, known_stacks, err) -> None:
    """A `stacks:` entry: a known stack name, or NAME:ATTENTION with an attention implementation that stack runs."""
    from . import stacks as registry

    name, attention = registry.split(entry)
    if name not in known_stacks:
        raise err(f"unknown stack {name!r}; known: {', '.join(sorted(known_stacks))}")
    if registry.SEPARATOR not in entry:
        return
    choices = registry.load(name).attentions
    if not choices:
        raise err(f"the {name} stack has no attention variants (write {name!r})")
    if attention not in choices:
        raise err(f"unknown attention implementation {attention!r} for the {name} stack; known: {', '.join(choices)}")


def _check_engine(engine: dict, err) -> None:
    """Engine settings a stack would otherwise reject mid-run: their types and ranges."""
    sub = lambda f, m: err(f"engine.{f}", m)  # noqa: E731
    for key in ("block_size", "max_num_seqs", "max_model_len", "max_num_batched_tokens", "num_blocks"):
        if key in engine:
            _int(engine, key, sub, minimum=1)
    for key in ("enforce_eager", "chunked_prefill", "cuda_graphs"):
        if key in engine and not isinstance(engine[key], bool):
            raise sub(key, f"must be true or false, got {engine[key]!r}")
    backend = engine.get("attention_backend")
    if backend is not None and not (isinstance(backend, str) and ATTENTION_BACKEND.match(backend)):
        raise sub("attention_backend", f"must be a vLLM attention backend name such as FLASH_ATTN, got {backend!r}")
    value = engine.get("gpu_memory_utilization")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1):
        raise sub("gpu_memory_utilization", f"must be a fraction in (0, 1], got {value!r}")


def _require(raw: dict, key: str, kind: type, err):
    if key not in raw:
        raise err(key, "is required")
    value = raw[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise err(key, f"must be a {kind.__name__ if kind is not dict else 'mapping'}, got {type(value).__name__}")
    return value


def _int(raw: dict, key: str, err, default=None, minimum=0) -> int:
    if key not in raw:
        if default is None:
            raise err(key, "is required")
        return default
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise err(key, f"must be an integer, got {value!r}")
    if value < minimum:
        raise err(key, f"must be at least {minimum}, got {value}")
    limit = LIMITS.get(key)
    if limit and value > limit:
        raise err(key, f"{value} is absurdly large (limit {limit})")
    return value


def _unknown(raw: dict, known: set, at: str, err) -> None:
    extra = sorted(set(raw) - known)
    if extra:
        raise err(f"{at}.{extra[0]}" if at else extra[0], f"unknown key; known: {', '.join(sorted(known))}")
